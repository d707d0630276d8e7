"""R1-Searcher runs -> CoA: exact conversion, skips instead of crashes, grammar, viewer.

R1-Searcher writes ``reasoning .. </think> <answer>a</answer>`` with
``<|begin_of_query|>q<|end_of_query|>`` searches and ``<|begin_of_documents|>..`` results.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coa_lab import protocol
from coa_lab.distill.importers import ImportedTrajectory, detect_trajectory_format, import_file, import_r1searcher
from coa_lab.paths import DATASETS_DIR
from coa_lab.viz.trajectory import trajectory_html

SHIPPED = DATASETS_DIR / "trajectories" / "r1searcher_hotpotqa_qwen.jsonl"
ORIGINALS = Path("/work/shared/datasets/trajectories/r1searcher_trajectories")
ORIGINAL_FILES = ("hotpotqa_qwen.jsonl", "hotpotqa_llama.jsonl", "2wiki_qwen.jsonl",
                  "bamboogle_qwen.jsonl", "bamboogle_llama.jsonl")

ROW = {
    "question": "Which city is the capital of the country where the Eiffel Tower stands?",
    "answer": "Paris",
    "pred_ans": " Paris ",
    "stop_reason_final": "finished",
    "gen_text_store": (" I need the country first.\n\n<|begin_of_query|> Eiffel Tower country<|end_of_query|>\n\n"
                       "<|begin_of_documents|>\n(1)Title: Eiffel Tower Text: a tower in France.\n"
                       "<|end_of_documents|>\n\nIt is France; its capital is Paris.</think>\n\n <answer> Paris </answer>"),
    "gpt4o_output": "True",
}
EXPECTED = ("<think>I need the country first.</think>\n"
            "<wiki_search>Eiffel Tower country</wiki_search>\n"
            "<observation>\n(1)Title: Eiffel Tower Text: a tower in France.\n</observation>\n"
            "<think>It is France; its capital is Paris.</think>\n"
            "<answer>Paris</answer>")
# The one grammar violation real runs show: the model searched again, or answered,
# straight after the documents without writing any reasoning (no think is invented).
NO_THINK_AFTER_DOCS = re.compile(r"^block \d+: <(wiki_search|answer)> may not follow <observation>$")


def _with(**changes) -> dict:
    return {**ROW, **changes}


def test_conversion_is_exact():
    traj = import_r1searcher(ROW)
    assert traj is not None
    assert traj.text == EXPECTED
    assert (traj.source, traj.profile, traj.gold, traj.question) == ("r1searcher", "mhqa", ["Paris"], ROW["question"])
    assert traj.metadata == {"judge_correct": True, "origin_pred": " Paris "}
    assert protocol.validate(traj.text, "mhqa") == []
    record = traj.to_record()
    assert record.n_tool_calls == 1 and record.metadata["judge_correct"] is True


def test_detected_among_the_other_formats():
    assert detect_trajectory_format(ROW) == "r1searcher"
    assert detect_trajectory_format({"question": "q", "answer": "a"}) is None


@pytest.mark.parametrize("row, reason", [
    (_with(gen_text_store="x <|begin_of_documents|>d<|end_of_documents|></think><answer>a</answer>"), "marker"),
    (_with(gen_text_store="<|begin_of_query|>q<|end_of_query|> no documents </think><answer>a</answer>"), "marker"),
    (_with(gen_text_store="thinking that never ends"), "does not end"),
    (_with(gen_text_store=ROW["gen_text_store"].replace("a tower in France", "a <answer>tower</answer>")), "CoA tag"),
    (_with(gen_text_store=ROW["gen_text_store"].replace("Eiffel Tower country", "  ")), "empty search query"),
    (_with(gen_text_store=ROW["gen_text_store"].replace("<answer> Paris </answer>", "<answer> </answer>")), "empty answer"),
    (_with(answer=""), "no gold"),
    (_with(answer=["Paris"]), "no gold"),
    (_with(question=None), "no question"),
    (_with(gen_text_store=7), "no gen_text_store"),
])
def test_unconvertible_rows_are_skipped_with_a_reason(tmp_path, row, reason):
    assert import_r1searcher(row) is None
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    report = import_file(path)
    assert report.trajectories == []
    (skip,) = report.skipped
    assert skip.startswith("r1searcher: ") and reason in skip


def _check(report, rows: int, name: str) -> tuple[int, int]:
    """Every row converted or skipped; converted ones parse cleanly and render. Returns
    (grammar-valid, grammar-invalid) counts under the mhqa profile."""
    assert len(report.trajectories) + sum(report.skipped.values()) == rows, name
    valid = invalid = 0
    for traj in report.trajectories:
        parsed = protocol.parse(traj.text)
        assert parsed.problems == [], (name, traj.task_id, parsed.problems)
        assert parsed.blocks[-1].tag == "answer"
        violations = protocol.validate(traj.text, "mhqa")
        assert all(NO_THINK_AFTER_DOCS.match(v) for v in violations), (name, traj.task_id, violations)
        valid, invalid = valid + (not violations), invalid + bool(violations)
        html = trajectory_html(traj.text, profile="mhqa")
        n_obs = sum(1 for b in parsed.blocks if b.kind == "observation")
        assert html.count('class="coa-step coa-observation') == n_obs, (name, traj.task_id)
        assert "&lt;|begin_of" not in html and "<|begin_of" not in html  # every marker was converted
    return valid, invalid


def test_shipped_subset_converts_parses_validates_and_renders():
    rows = [json.loads(line) for line in SHIPPED.open(encoding="utf-8") if line.strip()]
    report = import_file(SHIPPED)
    assert not report.skipped and len(report.trajectories) == len(rows) == 40
    valid, invalid = _check(report, len(rows), SHIPPED.name)
    assert valid >= 38, (valid, invalid)
    # Observation blocks = the documents blocks of the original rows, one for one.
    for row, traj in zip(rows, report.trajectories):
        assert traj.text.count("<observation>") == row["gen_text_store"].count("<|begin_of_documents|>")
        assert traj.gold == [row["answer"]]


@pytest.mark.parametrize("name", ORIGINAL_FILES)
def test_every_original_row_converts_or_is_skipped(name):
    path = ORIGINALS / name
    if not path.exists():
        pytest.skip(f"{path} not available")
    rows = sum(1 for line in path.open(encoding="utf-8") if line.strip())
    report = import_file(path)
    valid, invalid = _check(report, rows, name)
    # Measured: 1,737 of 1,750 rows valid, 13 invalid (no reasoning after the documents);
    # none skipped.  The bound leaves room without hiding a broken importer.
    assert valid >= 0.95 * rows, (name, valid, invalid, dict(report.skipped))


# Pieces real runs are made of, plus CoA tags in foreign places, plus free text.
_PIECES = st.sampled_from([
    "<|begin_of_query|>", "<|end_of_query|>", "<|begin_of_documents|>", "<|end_of_documents|>",
    "</think>", "<think>", "<answer>", "</answer>", "<observation>", "</observation>", "<wiki_search>",
    "<|", "|>", "\n", " ", "q", "Title: x", "<", ">", "</", "<br>",
])


_RANDOM = st.lists(st.one_of(_PIECES, st.text(max_size=12)), max_size=30).map("".join)
# Half the cases get a well-formed ending, so conversions (not only skips) are exercised.
_ENDING = st.one_of(st.just(""), _RANDOM.map(lambda a: f"</think>\n<answer>{a}</answer>"))


@settings(max_examples=300, deadline=None)
@given(_RANDOM, _ENDING)
def test_never_raises_on_random_text(body, ending):
    traj = import_r1searcher(_with(gen_text_store=body + ending))
    assert traj is None or isinstance(traj, ImportedTrajectory)
    if traj is not None:  # whatever got through is well formed and viewable
        assert protocol.parse(traj.text).problems == []
        assert protocol.parse(traj.text).blocks[-1].tag == "answer"
        trajectory_html(traj.text, profile="mhqa")
