"""Gold-policy self-test: every task answered with its own gold, through the normal answer
path (<answer> block -> protocol.final_answer -> score), must score 1.0.  Below 100% means a
loader, the answer extraction or a scorer is broken.  Also: `coa-lab data inspect`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coa_lab.paths import DATASETS_DIR
from coa_lab.tasks import Task
from coa_lab.tasks.file_checks import data_inspect_main, gold_main, gold_selftest, gold_text, task_files

AFM = Path("/work/shared/datasets/afm_benchmarks")
SHIPPED_TEXT = sorted(str(p.relative_to(DATASETS_DIR)) for p in task_files(DATASETS_DIR)
                      if p.parts[-3] in ("math", "mhqa", "web"))


@pytest.mark.parametrize("rel", SHIPPED_TEXT)
def test_gold_selftest_shipped_math_mhqa_web(rel):
    report = gold_selftest(DATASETS_DIR / rel)
    assert report["scored"] > 0 and report["skipped"] == 0
    assert report["accuracy"] == 1.0, report["failures"][:5]


@pytest.mark.skipif(not AFM.exists(), reason="source checkout /work/shared not available")
def test_gold_selftest_afm_release_files():
    report = gold_selftest(AFM)
    for file, stats in report["files"].items():
        if file.endswith("livecodebench_v4.parquet"):
            assert stats["skipped"] == stats["tasks"] == 100  # no canonical solutions shipped
        else:
            assert stats["accuracy"] == 1.0, (file, [f for f in report["failures"] if f["file"] == file][:5])
    assert report["scored"] == 30 + 40 + 103 + 500 + 3610 + 680


def test_gold_selftest_code_sample_runs_in_sandbox(tmp_path):
    from coa_lab.tools.sandbox import sandbox_available

    if not sandbox_available():
        pytest.skip("bubblewrap sandbox not usable here")
    report = gold_selftest(DATASETS_DIR / "code" / "humaneval" / "eval.jsonl", limit=8)
    assert (report["scored"], report["accuracy"]) == (8, 1.0)


def test_gold_text_per_profile():
    assert gold_text(Task("m", "q", ["\\frac{1}{2}"], "s", "math")) == "<answer>\\boxed{\\frac{1}{2}}</answer>"
    assert gold_text(Task("h", "q", ["Paris", "City of Paris"], "s", "mhqa")) == "<answer>Paris</answer>"
    code = Task("c", "q", [], "s", "code", {"tests": {"style": "assert", "cases": ["assert f() == 1"]},
                                             "canonical_solution": "def f():\n    return 1"})
    assert gold_text(code) == "<answer>\n```python\ndef f():\n    return 1\n```\n</answer>"
    assert gold_text(Task("c2", "q", [], "s", "code", {"tests": {}})) is None


def test_gold_main_exit_codes_and_output(tmp_path, capsys):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(Task("g-1", "2+2?", ["4"], "s", "math").to_dict()) + "\n", encoding="utf-8")
    assert gold_main(["--policy", "gold", "--suite", str(good), "--json", str(tmp_path / "r.json")]) == 0
    assert "100.00%" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["accuracy"] == 1.0
    # A gold that the scorer cannot match (an empty-looking answer) must fail the self-test.
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(Task("b-1", "q?", ["</answer>"], "s", "mhqa").to_dict()) + "\n", encoding="utf-8")
    assert gold_main(["--suite", str(bad)]) == 1
    assert gold_main(["--suite", str(tmp_path / "missing.jsonl")]) == 2


def test_data_inspect(capsys, tmp_path):
    assert data_inspect_main([str(DATASETS_DIR / "code" / "livecodebench" / "livecodebench_v4.parquet")]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["layout"], info["rows"], info["profiles"]) == ("afm", 100, ["code"])
    assert info["first_task"]["metadata"]["tests"]["style"] in ("stdio", "assert")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "q", "answer": "#### 1"}\n{"question": \n', encoding="utf-8")
    assert data_inspect_main([str(broken)]) == 2
    assert "broken.jsonl: row 2" in capsys.readouterr().err
