"""An LLM judge for open-ended answers (the ``web`` profile), through any chat backend.

Exact match cannot grade "The SUPPLY project is funded by EU4Health, started 1 Sep 2022
and lasts 18 months" against a differently worded gold sentence; the paper grades web
agents with an LLM judge for that reason.  :func:`llm_judge` asks a model for a one-word
verdict and parses it strictly: anything that is not clearly "yes"/"no" scores 0.0 and is
counted in :data:`JUDGE_STATS`, so a judge that stops following the format shows up as a
rising ``unparsed`` count instead of silently changing the metric.

The backend is anything with ``.chat(conversations, max_new_tokens, temperature)``
returning objects with ``.text`` (``coa_lab.generation.hf_generator.HFGenerator``, ``OpenAIChatBackend``).
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from typing import Any, Protocol, Sequence

# Our own wording.  The judge sees the question, every gold answer and the prediction, and
# must say whether they mean the same thing; we ask for one word so parsing stays trivial.
JUDGE_SYSTEM = (
    "You grade answers to questions. You are given a question, one or more reference answers, "
    "and a candidate answer. Decide whether the candidate answer says the same thing as a reference "
    "answer: wording, formatting and extra harmless detail do not matter, but a different, incomplete "
    "or hedged answer (several options offered) is wrong. Reply with exactly one word: yes or no."
)
JUDGE_USER = "Question:\n{question}\n\nReference answer(s):\n{gold}\n\nCandidate answer:\n{predicted}\n\nIs the candidate answer correct? One word, yes or no:"

_YES = {"yes", "correct", "true", "right"}
_NO = {"no", "incorrect", "false", "wrong", "not"}
_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_WORD = re.compile(r"[a-z]+")

JUDGE_STATS: Counter = Counter()  # "yes" / "no" / "unparsed"; reset with JUDGE_STATS.clear()
_stats_lock = threading.Lock()


class ChatBackend(Protocol):
    def chat(self, conversations: list[list[dict]], max_new_tokens: int, temperature: float = 0.0) -> Sequence[Any]: ...


def parse_verdict(text: str) -> bool | None:
    """True for yes/correct, False for no/incorrect, None when the reply is not a verdict.

    Reads the first word after dropping a ``<think>`` block and markdown, then falls back
    to a ``verdict: X`` / ``answer: X`` line; "not correct" counts as no.
    """
    text = _THINK.sub(" ", str(text or "")).lower()
    words = _WORD.findall(text)
    if words:
        if words[0] in _YES:
            return True
        if words[0] in _NO:
            return False
    match = re.search(r"(?:verdict|answer|judgement|judgment)\s*[:=]\s*\**\s*([a-z]+)", text)
    if match:
        word = match.group(1)
        if word in _YES:
            return True
        if word in _NO:
            return False
    return None


def judge_messages(question: str, gold: str | Sequence[str], predicted: str) -> list[dict]:
    golds = [gold] if isinstance(gold, str) else list(gold)
    user = JUDGE_USER.format(question=question.strip(), gold="\n".join(f"- {g}" for g in golds),
                             predicted=str(predicted).strip())
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


def llm_judge(question: str, gold: str | Sequence[str], predicted: str | None, backend: ChatBackend,
              max_new_tokens: int = 8) -> float:
    """1.0 if ``backend`` judges ``predicted`` equivalent to ``gold`` (one answer or a list of
    acceptable ones), else 0.0.  Greedy (temperature 0) so re-grading is reproducible.
    An empty prediction is 0.0 without asking; a reply that is not a verdict is 0.0 and
    counted as ``JUDGE_STATS["unparsed"]``.  Backend errors propagate: a broken judge must
    stop an evaluation, not turn it into zeros."""
    if predicted is None or not str(predicted).strip():
        return 0.0
    reply = backend.chat([judge_messages(question, gold, predicted)], max_new_tokens=max_new_tokens, temperature=0.0)
    verdict = parse_verdict(getattr(reply[0], "text", reply[0]) if reply else "")
    with _stats_lock:
        JUDGE_STATS["unparsed" if verdict is None else ("yes" if verdict else "no")] += 1
    return 1.0 if verdict else 0.0
