"""coa_lab/lessons/inputs.py: a notebook opened alone finds the previous one's output, or a fallback."""

import shutil

import pytest

from coa_lab.config import get_preset
from coa_lab.lessons.inputs import (SHIPPED_TEACHER_RUNS, kept_trajectories, lesson_dir, rl_adapter, sft_adapter,
                                   teacher_runs_path)


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("COA_LAB_RUNS", str(tmp_path))
    return tmp_path


def test_shipped_capture_is_the_fallback_until_notebook_01_writes_one(runs):
    assert teacher_runs_path() == SHIPPED_TEACHER_RUNS and SHIPPED_TEACHER_RUNS.exists()
    own = lesson_dir(1) / "capture" / "traces.jsonl"
    own.parent.mkdir(parents=True)
    own.write_text("")
    assert teacher_runs_path() == SHIPPED_TEACHER_RUNS  # an empty capture (killed at once) is not a capture
    shutil.copyfile(SHIPPED_TEACHER_RUNS, own)
    assert teacher_runs_path() == own


@pytest.mark.model
def test_kept_trajectories_distils_the_shipped_capture_when_02_has_not_run(runs):
    kept = kept_trajectories(get_preset("cpu-tiny"))
    assert (lesson_dir(2) / "distill" / "kept.jsonl").exists()
    # the shipped capture (datasets/teacher_runs/SOURCE.json): 72 one-hop runs, 51 of them right and
    # kept; its 12 two-hop runs, none kept (the reflection filter); and cpu-tiny's 8 imported
    # search runs per file, 6 of them kept (FireAct; R1-Searcher's are over the token budget)
    assert all(r.reward == 1.0 for r in kept)
    by_source = {s: sum(1 for r in kept if r.source == s) for s in {r.source for r in kept}}
    assert by_source == {"teacher": 51, "fireact": 6}
    assert rl_adapter() is None


@pytest.mark.model
def test_sft_adapter_trains_when_03_has_not_run_and_is_reused_after(runs, monkeypatch):
    preset = get_preset("cpu-smoke")
    kept = lesson_dir(2) / "distill" / "kept.jsonl"
    kept.parent.mkdir(parents=True)
    from coa_lab.trajectories import load_records, save_records

    # notebook 02's output, small: two of the shipped trajectories
    from coa_lab.lessons.inputs import distill_teacher_runs
    distill_teacher_runs(preset, SHIPPED_TEACHER_RUNS, runs / "full")
    save_records(load_records(runs / "full" / "distill" / "kept.jsonl")[:2], kept)
    adapter = sft_adapter(preset)
    assert (adapter / "adapter_config.json").exists()
    import coa_lab.training.sft

    monkeypatch.setattr(coa_lab.training.sft, "train_sft", lambda *a, **k: pytest.fail("trained again"))
    assert sft_adapter(preset) == adapter


def test_a_lesson_saves_its_figures_under_its_run_and_says_when_the_reference_differs(tmp_path, monkeypatch, capsys):
    import json

    from coa_lab.lessons import inputs as lesson_inputs

    monkeypatch.setenv("COA_LAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("COA_LAB_REFERENCE_FIGURES", raising=False)
    assert lesson_inputs.lesson_figures(3) == tmp_path / "runs" / "nb03" / "figures"
    monkeypatch.setenv("COA_LAB_REFERENCE_FIGURES", "1")
    assert lesson_inputs.lesson_figures(3) == lesson_inputs.REFERENCE_FIGURES  # a maintainer's refresh
    reference = tmp_path / "reference"
    reference.mkdir()
    monkeypatch.setattr(lesson_inputs, "REFERENCE_FIGURES", reference)
    doc = {"date": "2026-11-27", "commit": "abc1234", "data": {"examples": 51, "losses": [1.0] * 130}}
    (reference / "03_sft_loss.json").write_text(json.dumps(doc))
    mine = tmp_path / "mine"
    mine.mkdir()
    inputs = {"trajectories": "data.examples", "optimizer steps": "len(data.losses)"}
    (mine / "03_sft_loss.json").write_text(json.dumps({"data": {"examples": 57, "losses": [1.0] * 146}}))
    assert lesson_inputs.compare_with_reference(mine / "03_sft_loss.png", inputs) == ["trajectories", "optimizer steps"]
    out = capsys.readouterr().out
    assert "differs from the reference" in out and "trajectories 57 (reference 51)" in out and "abc1234" in out
    (mine / "03_sft_loss.json").write_text(json.dumps(doc))
    assert lesson_inputs.compare_with_reference(mine / "03_sft_loss.png", inputs) == []
    assert "describe a run like yours" in capsys.readouterr().out
    assert lesson_inputs.compare_with_reference(mine / "no_such_figure.png", inputs) == []  # no reference: silent
