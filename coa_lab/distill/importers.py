"""Import real, public teacher trajectories and rewrite them in the CoA format.

The paper distills from its own multi-agent system; the lab can also learn from runs that
other projects published.  Three single-agent formats map cleanly onto CoA blocks:

- FireAct (GPT-4 ReAct on HotpotQA), OpenAI ``messages``:
  ``Thought: ..`` -> ``<think>``, ``Action: search[q]`` -> ``<wiki_search>q</wiki_search>``,
  ``Observation: ..`` -> ``<observation>``, ``Action: finish[a]`` -> ``<answer>a</answer>``.
  ``lookup[k]`` (find k in the last page) has no CoA tool, so it becomes a wiki search for
  "<last search> <k>": the closest question our retriever can answer.
- ToRA (tool-integrated math): prose, then ```python``` code, then ```output``` ->
  ``<think>`` / ``<code>`` / ``<observation>``, and the final ``\\boxed{x}`` -> ``<answer>``.
- R1-Searcher (RL-trained search agent on HotpotQA/2Wiki/Bamboogle), ``gen_text_store``:
  reasoning (its opening ``<think>`` was in the prompt, so only ``</think>`` appears) ->
  ``<think>``, ``<|begin_of_query|>q<|end_of_query|>`` -> ``<wiki_search>q</wiki_search>``,
  ``<|begin_of_documents|>..<|end_of_documents|>`` -> ``<observation>``, final
  ``<answer>a</answer>`` kept.  Gold = the row's ``answer``; the LLM judge's verdict
  (``gpt4o_output``) goes to ``metadata["judge_correct"]``, wrong runs are kept for the
  outcome filter to remove.

Blocks are joined by a single newline and built with :mod:`coa_lab.protocol` helpers so the
text is byte-compatible with what the RL environment produces (observation =
``<observation>\\n..\\n</observation>``).  Nothing is invented: a row we cannot convert
faithfully, or whose gold answer we cannot know, is skipped and counted, never "fixed".
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coa_lab.protocol import DEFAULT_TOOLS, OBSERVATION, ROLE_TAGS, block, wrap_observation
from coa_lab.tasks.scorers import last_boxed, normalize_answer
from coa_lab.trajectories import TrajectoryRecord

log = logging.getLogger(__name__)


@dataclass
class ImportedTrajectory:
    task_id: str
    question: str
    text: str  # the CoA assistant turn
    source: str  # "fireact" | "tora" | "r1searcher"
    profile: str  # "mhqa" | "math"
    gold: list[str]
    metadata: dict = field(default_factory=dict)  # what the origin knew beyond the text

    def to_record(self):
        """As a :class:`coa_lab.trajectories.TrajectoryRecord` for the distill filters."""
        return TrajectoryRecord(id=f"{self.source}:{self.task_id}", task_id=self.task_id, source=self.source,
                                profile=self.profile, question=self.question, answers=list(self.gold),
                                text=self.text, n_tool_calls=self.text.count("<observation>"),
                                metadata=dict(self.metadata))


@dataclass
class ImportReport:
    trajectories: list[ImportedTrajectory] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)  # reason -> rows


class SkipRow(ValueError):
    """Internal: this row cannot be converted faithfully (the message is the reason)."""


_COA_TAG = re.compile(r"</?\s*(%s)\s*>" % "|".join((*ROLE_TAGS, *DEFAULT_TOOLS, OBSERVATION)), re.I)


def _guard(text: str) -> str:
    # A teacher string that already contains a CoA tag would corrupt block boundaries;
    # we skip such rows instead of escaping, so the lab never trains on altered text.
    if _COA_TAG.search(text):
        raise SkipRow("content contains a CoA tag")
    return text.strip()


def _observation(text: str) -> str:
    return wrap_observation(_guard(text)).strip("\n")


# --------------------------------------------------------------------------- FireAct
_REACT_STEP = re.compile(r"^\s*Thought(?:\s*\d+)?:\s*(?P<thought>.*?)\s*\n+\s*Action(?:\s*\d+)?:\s*"
                         r"(?P<act>\w+)\[(?P<arg>.*)\]\s*$", re.S)
_REWARD = re.compile(r"reward\s*=\s*(\w+)", re.I)


def _convert_fireact(row: dict[str, Any]) -> ImportedTrajectory:
    messages = row.get("messages")
    if not isinstance(messages, list) or len(messages) < 2:
        raise SkipRow("no messages")
    if messages[0].get("role") == "system":
        messages = messages[1:]
    question = str(messages[0].get("content") or "").strip()
    if messages[0].get("role") != "user" or not question:
        raise SkipRow("first message is not the user question")
    blocks: list[str] = []
    last_query, answer, reward = "", None, None
    for k in range(1, len(messages), 2):
        step = messages[k]
        if step.get("role") != "assistant":
            raise SkipRow("messages do not alternate assistant/user")
        m = _REACT_STEP.match(str(step.get("content") or ""))
        if not m:
            raise SkipRow("assistant turn is not 'Thought: ..\\nAction: act[..]'")
        act, arg = m["act"].lower(), _guard(m["arg"])
        blocks.append(block("think", _guard(m["thought"])))
        obs_msg = messages[k + 1] if k + 1 < len(messages) else None
        obs = str(obs_msg.get("content") or "") if obs_msg else ""
        obs = re.sub(r"^\s*Observation(?:\s*\d+)?:\s*", "", obs)
        if act == "finish":
            answer = arg
            found = _REWARD.search(obs)
            reward = found.group(1).lower() if found else None
            break
        if act not in ("search", "lookup"):
            raise SkipRow(f"unknown ReAct action {act!r}")
        if obs_msg is None:
            raise SkipRow("tool call without observation")
        query = arg if act == "search" else f"{last_query} {arg}".strip()
        last_query = arg if act == "search" else last_query
        blocks.append(block("wiki_search", query))
        blocks.append(_observation(obs))
    if answer is None:
        raise SkipRow("no finish[] action")
    # FireAct rows carry no gold label; the finish answer is gold only when the episode's
    # reward says it matched HotpotQA's label.
    if reward not in ("true", "1"):
        raise SkipRow("finish answer not confirmed correct (reward missing or false)")
    blocks.append(block("answer", answer))
    task_id = "fireact-" + hashlib.sha1(normalize_answer(question).encode()).hexdigest()[:10]
    return ImportedTrajectory(task_id, question, "\n".join(blocks), "fireact", "mhqa", [answer])


# --------------------------------------------------------------------------- ToRA
_FENCE = re.compile(r"```(python|output)[^\n]*\n(.*?)(?:```|$)", re.S)


def _tora_text(row: dict[str, Any]) -> tuple[str, str]:
    if isinstance(row.get("code"), list) and row["code"]:
        return str(row.get("question") or ""), str(row["code"][0])
    messages = row.get("messages")
    if isinstance(messages, list) and messages:
        question = next((str(m.get("content") or "") for m in messages if m.get("role") == "user"), "")
        answer = "".join(str(m.get("content") or "") for m in messages if m.get("role") == "assistant")
        return question, answer
    raise SkipRow("no 'code' list or 'messages'")


def _final_think(text: str, boxed: str) -> str:
    # Keep the teacher's closing sentence, minus the box (the box lives in <answer>).
    plain = re.sub(r"\$?\\boxed\{" + re.escape(boxed) + r"\}\$?", lambda _: boxed, text)
    return " ".join(plain.split())


def _convert_tora(row: dict[str, Any], dataset: str = "gsm8k-test") -> ImportedTrajectory:
    question, text = _tora_text(row)
    question = question.strip()
    if not question or not text.strip():
        raise SkipRow("empty question or trajectory")
    if row.get("gt") in (None, ""):
        raise SkipRow("no gold answer ('gt')")
    blocks: list[str] = []
    pos, expect_output = 0, False
    for m in _FENCE.finditer(text):
        prose = text[pos:m.start()].strip()
        if prose:
            if expect_output:
                raise SkipRow("code block without an output block")
            blocks.append(block("think", _guard(prose)))
        kind, body = m.group(1), m.group(2).rstrip()
        if kind == "python":
            if expect_output:
                raise SkipRow("two code blocks without output between them")
            blocks.append(block("code", f"\n```python\n{_guard(body)}\n```\n"))
            expect_output = True
        else:
            if not expect_output:
                raise SkipRow("output block without a code block")
            blocks.append(_observation(body))
            expect_output = False
        pos = m.end()
    if expect_output:
        raise SkipRow("run ends with code that was never executed")
    tail = text[pos:].strip()
    boxed = last_boxed(tail) if tail else None
    if not boxed:
        raise SkipRow("no final \\boxed{} answer (run did not finish)")
    think = _final_think(tail, boxed)
    if think:
        blocks.append(block("think", _guard(think)))
    blocks.append(block("answer", f"\\boxed{{{_guard(boxed)}}}"))
    task_id = f"{dataset}-{row['idx']}" if "idx" in row else str(row.get("id") or "tora-" + hashlib.sha1(question.encode()).hexdigest()[:10])
    return ImportedTrajectory(task_id, question, "\n".join(blocks), "tora", "math", [str(row["gt"])])


# --------------------------------------------------------------------------- R1-Searcher
# One search round: the query, optional whitespace, then the documents it returned.
_R1_ROUND = re.compile(r"<\|begin_of_query\|>(?P<query>.*?)<\|end_of_query\|>\s*"
                       r"<\|begin_of_documents\|>(?P<docs>.*?)<\|end_of_documents\|>", re.S)
# The run's end: reasoning closed by </think> (opened in the prompt), then the answer.
_R1_END = re.compile(r"</think>\s*<answer>(?P<answer>.*?)</answer>\s*$", re.S)
_R1_MARKER = re.compile(r"<\|(?:begin|end)_of_(?:query|documents)\|>")


def _r1_think(prose: str) -> list[str]:
    # Two searches in a row leave no reasoning between them: nothing is invented, so the
    # think block is simply absent there (the grammar check will say so).
    if _R1_MARKER.search(prose):
        raise SkipRow("query or documents marker without its partner")
    prose = _guard(prose)
    return [block("think", prose)] if prose else []


def _r1_verdict(value: Any) -> bool | None:
    verdict = str(value).strip().lower()
    return {"true": True, "false": False}.get(verdict)


def _convert_r1searcher(row: dict[str, Any]) -> ImportedTrajectory:
    text, question, gold = row.get("gen_text_store"), row.get("question"), row.get("answer")
    if not isinstance(text, str) or not text.strip():
        raise SkipRow("no gen_text_store text")
    if not isinstance(question, str) or not question.strip():
        raise SkipRow("no question")
    if not isinstance(gold, (str, int, float)) or not str(gold).strip():
        raise SkipRow("no gold answer")
    end = _R1_END.search(text)
    if end is None:
        raise SkipRow("does not end with '</think> <answer>..</answer>'")
    body = text[:end.start()]
    blocks: list[str] = []
    pos = 0
    for m in _R1_ROUND.finditer(body):
        blocks += _r1_think(body[pos:m.start()])
        query = _guard(m["query"])
        if not query:
            raise SkipRow("empty search query")
        blocks.append(block("wiki_search", query))
        blocks.append(_observation(m["docs"]))
        pos = m.end()
    blocks += _r1_think(body[pos:])
    answer = _guard(end["answer"])
    if not answer:
        raise SkipRow("empty answer")
    blocks.append(block("answer", answer))
    question = question.strip()
    task_id = "r1searcher-" + hashlib.sha1(normalize_answer(question).encode()).hexdigest()[:10]
    meta = {"judge_correct": _r1_verdict(row.get("gpt4o_output")), "origin_pred": row.get("pred_ans")}
    return ImportedTrajectory(task_id, question, "\n".join(blocks), "r1searcher", "mhqa", [str(gold).strip()], meta)


# --------------------------------------------------------------------------- public API
def import_fireact(row: dict[str, Any]) -> ImportedTrajectory | None:
    """One FireAct ReAct row -> CoA trajectory, or None if it cannot be converted."""
    try:
        return _convert_fireact(row)
    except Exception as exc:  # noqa: BLE001 -- contract: None, never an exception
        log.debug("fireact row skipped: %s", exc)
        return None


def import_tora(row: dict[str, Any], dataset: str = "gsm8k-test") -> ImportedTrajectory | None:
    """One ToRA row -> CoA trajectory, or None.  ``dataset`` prefixes ToRA's ``idx`` so ids
    match the lab's GSM8K task ids (``gsm8k-test-<idx>``)."""
    try:
        return _convert_tora(row, dataset)
    except Exception as exc:  # noqa: BLE001 -- contract: None, never an exception
        log.debug("tora row skipped: %s", exc)
        return None


def import_r1searcher(row: dict[str, Any]) -> ImportedTrajectory | None:
    """One R1-Searcher eval-run row -> CoA trajectory, or None if it cannot be converted."""
    try:
        return _convert_r1searcher(row)
    except Exception as exc:  # noqa: BLE001 -- contract: None, never an exception
        log.debug("r1searcher row skipped: %s", exc)
        return None


def detect_trajectory_format(row: Any) -> str | None:
    """"fireact", "tora", "r1searcher" or None."""
    if not isinstance(row, dict):
        return None
    if "gen_text_store" in row and "question" in row:
        return "r1searcher"
    if isinstance(row.get("code"), list) and "gt" in row:
        return "tora"
    messages = row.get("messages")
    if isinstance(messages, list):
        said = " ".join(str(m.get("content") or "") for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        if re.search(r"Action(?:\s*\d+)?:\s*\w+\[", said):
            return "fireact"
        # ToRA corpus rows carry "gt"; some solve in prose only (think + answer, no code).
        if "```python" in said or "```output" in said or "gt" in row:
            return "tora"
    return None


def import_file(path: str | Path) -> ImportReport:
    """Convert every row of a JSON-lines file (``.gz`` ok); bad rows are counted by reason."""
    path = Path(path)
    report = ImportReport()
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                report.skipped["invalid JSON"] += 1
                continue
            fmt = detect_trajectory_format(row)
            try:
                if fmt == "fireact":
                    report.trajectories.append(_convert_fireact(row))
                elif fmt == "tora":
                    report.trajectories.append(_convert_tora(row))
                elif fmt == "r1searcher":
                    report.trajectories.append(_convert_r1searcher(row))
                else:
                    report.skipped["unknown trajectory format"] += 1
            except SkipRow as exc:
                report.skipped[f"{fmt}: {exc}"] += 1
            except Exception as exc:  # noqa: BLE001 -- one odd row must not stop an import
                report.skipped[f"{fmt}: malformed row ({type(exc).__name__})"] += 1
    if report.skipped:
        log.warning("%s: imported %d, skipped %d rows: %s", path, len(report.trajectories),
                    sum(report.skipped.values()), dict(report.skipped))
    return report


def load_imported(path: str | Path) -> list[ImportedTrajectory]:
    """Convert a FireAct, ToRA or R1-Searcher file; skipped rows are logged (use import_file for counts)."""
    return import_file(path).trajectories
