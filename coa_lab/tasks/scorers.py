"""Scorers: one per task profile, shared by evaluation AND the RL reward.

Why one function for both: the paper's RL reward is the binary outcome of the same check
the benchmark uses (normalized exact match for MHQA, math-verify for math, all tests pass
for code).  If training optimised a slightly different metric than evaluation reports, RL
would happily exploit the gap; so :func:`reward` is literally :func:`score`. The RL stage adds
one condition on top (coa_lab/rl/rollouts.rollout_reward, rl.format_reward): a trajectory that
breaks the CoA grammar earns 0, as a format error aborts an AFM run; evaluation reports that
grammar check beside accuracy as format validity.

Profiles
- ``mhqa``: SQuAD-style normalized exact match.
- ``web``: the LLM judge (:func:`coa_lab.tasks.judge.llm_judge`) when ``score`` is given a
  ``judge`` backend -- as the paper grades web agents -- else exact match, so web tasks
  still grade offline and deterministically (strict: WebWalker's sentence-long golds are
  rarely matched exactly; pass a judge for meaningful web numbers).
- ``math``: :func:`math_equal` -- a fast exact path for plain numbers, then math-verify.
- ``code``: :func:`score_code` -- run the answer's program against the task's tests in the
  bubblewrap sandbox; 1.0 only if every case passes.

Multi-answer predictions ``a|b`` (the CoA convention for questions with several answers):
every gold is read as a *set* of parts (most golds have one part).  Exact match requires the
set of predicted parts to equal the set of gold parts after normalization (order and duplicates do not matter).  So for an
ordinary single-answer question "Paris|paris" still scores 1, but hedging ("Paris|London")
scores 0, and so does listing two aliases ("NYC|New York City"): a prediction of several
answers claims the question has several answers.  This closes the obvious reward hack of
listing many guesses.  F1 uses the part-level
precision/recall of the best token F1 (see :func:`f1`).
"""

from __future__ import annotations

import re
import string
import threading
import unicodedata
from collections import Counter
from decimal import Decimal, InvalidOperation
from typing import Iterable

from coa_lab.protocol import last_boxed  # noqa: F401 - one \boxed{} reader for the whole lab
from coa_lab.tasks.judge import llm_judge
from coa_lab.tasks.records import Task

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCT = frozenset(string.punctuation)


# --------------------------------------------------------------------------- text answers
def _strip_marks(text: str) -> str:
    # NFKD splits "é" into "e" + combining accent; dropping the accent makes "Röntgen" match
    # "Rontgen", which is what graders of Wikipedia-derived answers want.
    text = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in text if unicodedata.category(ch) != "Mn")


def _is_punct(ch: str) -> bool:
    # string.punctuation covers ASCII symbols like $ and |; unicode category P* covers the
    # rest (curly quotes, en dashes, CJK punctuation).
    return ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


def normalize_answer(text: str) -> str:
    """SQuAD/HotpotQA normalization: NFKD + drop accents, lowercase, drop punctuation,
    drop the articles a/an/the, collapse whitespace.  Idempotent."""
    text = _strip_marks(str(text)).lower()
    # lower() can re-introduce decomposable characters (e.g. "İ" -> "i" + dot), so strip again.
    text = _strip_marks(text)
    text = "".join(ch for ch in text if not _is_punct(ch))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _split_parts(text: str) -> list[str]:
    parts = [p.strip() for p in str(text).split("|")]
    return [p for p in parts if p] or [""]


def _norm_part(part: str) -> str:
    norm = normalize_answer(part)
    # An answer made only of articles/punctuation ("The The", "?") normalizes to "";
    # fall back to a light normalization so it can still be matched exactly.
    return norm if norm else " ".join(part.lower().split())


def _as_list(golds: str | Iterable[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else [str(g) for g in golds]


def exact_match(pred: str | None, golds: str | Iterable[str]) -> float:
    """1.0 if the (multi-)answer ``pred`` equals any gold after normalization, else 0.0."""
    if pred is None or not str(pred).strip():
        return 0.0
    pred_parts = {_norm_part(p) for p in _split_parts(pred)}
    for gold in _as_list(golds):
        if pred_parts == {_norm_part(g) for g in _split_parts(gold)}:
            return 1.0
    return 0.0


def _token_f1(pred: str, gold: str) -> float:
    p, g = _norm_part(pred), _norm_part(gold)
    # HotpotQA's official rule: yes/no answers are all-or-nothing, no partial token credit.
    if (p in ("yes", "no", "noanswer") or g in ("yes", "no", "noanswer")) and p != g:
        return 0.0
    p_tok, g_tok = p.split(), g.split()
    common = sum((Counter(p_tok) & Counter(g_tok)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p_tok), common / len(g_tok)
    return 2 * precision * recall / (precision + recall)


def f1(pred: str | None, golds: str | Iterable[str]) -> float:
    """Best token F1 over golds.  For multi-part answers: precision = mean over predicted
    parts of their best F1 against gold parts, recall = mean over gold parts of their best
    F1 against predicted parts, combined harmonically (reduces to plain token F1 for one
    part each)."""
    if pred is None or not str(pred).strip():
        return 0.0
    pred_parts = _split_parts(pred)
    best = 0.0
    for gold in _as_list(golds):
        gold_parts = _split_parts(gold)
        precision = sum(max(_token_f1(p, g) for g in gold_parts) for p in pred_parts) / len(pred_parts)
        recall = sum(max(_token_f1(p, g) for p in pred_parts) for g in gold_parts) / len(gold_parts)
        if precision + recall > 0:
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


# --------------------------------------------------------------------------- math answers
# A plain number, optionally with a currency sign before and a unit/percent word after:
# "$1,000", "18 dollars", "18.0", "\$5", "50\%", "7 \text{ cm}".  Anything richer goes to
# math-verify, which is slow (sympy) but understands LaTeX.
_UNIT_WRAPPERS = re.compile(r"\\(?:text|mbox|mathrm)\{([^{}]*)\}")
_PLAIN_NUMBER = re.compile(r"^(-?)(\d+(?:,\d{3})*(?:\.\d*)?|\.\d+)\s*(?:[a-zA-Z%][a-zA-Z%\s.]*)?$")


def _plain_number(text: str) -> Decimal | None:
    s = _UNIT_WRAPPERS.sub(r"\1", text).replace("\\%", "%").replace("\\$", "$").replace("\\!", "")
    s = s.strip().strip("$").strip()
    if s.startswith("-$"):
        s = "-" + s[2:]
    s = s.lstrip("$").rstrip(".").strip()
    m = _PLAIN_NUMBER.match(s)
    if not m:
        return None
    try:
        return Decimal(m.group(1) + m.group(2).replace(",", ""))
    except InvalidOperation:
        return None


def _latex_key(text: str) -> str:
    # Cheap textual identity: "\left( 3, \frac{\pi}{2} \right)" == "(3,\frac{\pi}{2})".
    s = text.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("$", "")
    return "".join(s.split())


def _math_verify(pred: str, gold: str) -> bool:
    from math_verify import parse, verify  # imported lazily: sympy import costs ~1 s

    # math-verify's timeouts use SIGALRM, which only works in the main thread; RL workers
    # often score from threads, where we run without a timeout instead of crashing.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None

    def _parse(s: str):
        # Without $...$ the LaTeX extractor may grab only a prefix ("\left(3, ...)" -> 3).
        wrapped = s if ("$" in s or "\\boxed" in s) else f"${s}$"
        return parse(wrapped, parsing_timeout=timeout)

    try:
        gold_parsed, pred_parsed = _parse(gold), _parse(pred)
        if not gold_parsed or not pred_parsed:
            return False
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout))
    except Exception:  # noqa: BLE001 -- a grader must never crash a run; unparsable = wrong
        return False


def math_equal(pred: str | None, gold: str) -> bool:
    """True if ``pred`` and ``gold`` denote the same mathematical answer.

    Both sides may be wrapped in ``\\boxed{}`` (the last box counts).  Plain numbers are
    compared exactly after dropping thousands commas, ``$`` signs, trailing unit words and
    a trailing ``.0``; everything else is checked with math-verify.
    """
    if pred is None:
        return False
    pred_s = last_boxed(pred) if "\\boxed" in pred or "\\fbox" in pred else pred
    gold_s = last_boxed(gold) if "\\boxed" in gold or "\\fbox" in gold else gold
    if pred_s is None or gold_s is None or not pred_s.strip():
        return False
    pred_num, gold_num = _plain_number(pred_s), _plain_number(gold_s)
    if pred_num is not None and gold_num is not None:
        return pred_num == gold_num
    if _latex_key(pred_s) == _latex_key(gold_s):
        return True
    return _math_verify(pred_s, gold_s)


# --------------------------------------------------------------------------- dispatch
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S)


def _unwrap_answer(text: str) -> str:
    # Callers should pass the answer text, but a whole "<answer>...</answer>" block (or a
    # full trajectory) is common enough that we grade its last answer block instead of 0.
    blocks = _ANSWER_BLOCK.findall(text)
    return blocks[-1].strip() if blocks else text.strip()


def score_code(task: Task, answer: str | None) -> float:
    """1.0 if the program in ``answer`` (fenced ```python block, or bare code) passes every
    test case of ``task`` in the sandbox; 0.0 for wrong output, a crash, a timeout or no
    code.  Never raises for anything the answer does; it does raise ``ValueError`` for a
    task without valid ``metadata["tests"]`` (a data bug) and ``SandboxUnavailableError``
    when bubblewrap cannot run here (scoring every answer 0 would hide a broken setup)."""
    # late: code_tests brings the tools package (sandbox, bm25s, numpy: ~0.25 s); text scoring stays without it
    from coa_lab.tasks.code_tests import run_tests

    if answer is None or not str(answer).strip():
        return 0.0
    return 1.0 if run_tests(task, str(answer)).all_passed else 0.0


def score(task: Task, predicted_answer: str | None, judge=None) -> float:
    """Grade one prediction for ``task``: 1.0 correct, 0.0 wrong (None = no answer = 0.0).

    ``judge``: an optional chat backend (``.chat(conversations, max_new_tokens,
    temperature)``); only ``web`` tasks use it (see module doc)."""
    if predicted_answer is None:
        return 0.0
    pred = _unwrap_answer(str(predicted_answer))
    if task.profile == "math":
        return 1.0 if any(math_equal(pred, gold) for gold in task.answers) else 0.0
    if task.profile == "mhqa":
        return exact_match(pred, task.answers)
    if task.profile == "web":
        if judge is None:
            return exact_match(pred, task.answers)
        # Exact match first: a verbatim gold needs no model call (and cannot be misjudged).
        return 1.0 if exact_match(pred, task.answers) else llm_judge(task.question, task.answers, pred, judge)
    if task.profile == "code":
        return score_code(task, pred)
    raise ValueError(f"task {task.id!r}: no scorer for profile {task.profile!r}")


def reward(task: Task, answer: str | None, judge=None) -> float:
    """The RL outcome reward.  Deliberately identical to :func:`score` (see module doc):
    binary, no format bonus, so RL optimises the metric evaluation reports (RL zeroes it for a
    grammar violation: rl/rollouts.rollout_reward)."""
    return score(task, answer, judge=judge)
