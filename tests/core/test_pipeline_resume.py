"""`coa-lab demo --resume`: an interrupted demo keeps the stages that finished and continues the first
other one from its partial work (coa_lab/demo.py: run_all, finished_stages). Stand-in stages record how they
were called and write their summary files as the real ones do (last); the real stages' resume paths
are tested with them (capture, SFT, RL, evaluation) and end to end in tests/e2e/test_pipeline_smoke.py."""

import json
import os

import pytest

from coa_lab import demo, pipeline
from coa_lab.config import get_preset

SECONDS = {"capture": 10.0, "distill": 1.0, "sft": 20.0, "rl": 30.0, "control": 5.0, "eval": 7.0}


@pytest.fixture
def stages(monkeypatch):
    """Stand-ins for the six stages and the machine probe; returns the list of (stage, resume) calls."""
    calls = []

    def stand_in(name):
        def run_stage(preset, run, resume=None):
            calls.append((name, resume))
            path = run / demo.SUMMARIES[name]
            summary = {"seconds": SECONDS[name], **({"kept": 0} if name == "distill" else {})}
            pipeline.write_json(path, summary)
            return summary
        return run_stage

    for name, attr in [("capture", "capture"), ("distill", "distill"), ("sft", "sft"), ("rl", "rl"),
                       ("control", "control"), ("eval", "evaluate_stage")]:
        monkeypatch.setattr(pipeline, attr, stand_in(name))
    probes = iter(range(100))
    monkeypatch.setattr(demo, "machine_peak", lambda preset: {"fp32_gflops": float(next(probes))})
    monkeypatch.setattr(demo, "write_report", lambda run: run / "report.md")
    return calls


def _age(run, names, seconds_ago):
    """Set the summaries of `names` to be `seconds_ago` old, in order (the first oldest)."""
    now = os.path.getmtime(run / "preset.json")
    for i, name in enumerate(names):
        t = now - seconds_ago + i
        os.utime(run / demo.SUMMARIES[name], (t, t))


def test_a_fresh_demo_runs_every_stage_and_starts_the_capture_afresh(stages, tmp_path):
    preset = get_preset("cpu-smoke")
    demo.run_all(preset, tmp_path, log=lambda *_: None)
    assert stages == [("capture", False), ("distill", None), ("sft", False), ("rl", False), ("control", None),
                      ("eval", False)]
    timing = json.loads((tmp_path / "timing.json").read_text())
    assert timing["resumed"] is None and timing["machine_start"] == {"fp32_gflops": 0.0}
    assert json.loads((tmp_path / "machine_start.json").read_text()) == {"fp32_gflops": 0.0}


def test_resumed_in_rl_keeps_the_finished_stages_and_continues_rl(stages, tmp_path):
    preset = get_preset("cpu-smoke")
    demo.run_all(preset, tmp_path, log=lambda *_: None)  # first start: probe 0 at its start
    (tmp_path / demo.SUMMARIES["rl"]).unlink()  # killed in RL: no summary, later outputs stale
    _age(tmp_path, ["capture", "distill", "sft", "control", "eval"], 100)
    stages.clear()
    demo.run_all(preset, tmp_path, log=lambda *_: None, resume=True)
    assert stages == [("rl", True), ("control", None), ("eval", False)]  # the control and eval afresh
    timing = json.loads((tmp_path / "timing.json").read_text())
    assert timing["resumed"] == {"kept": ["capture", "distill", "sft"], "continued": "rl"}
    assert timing["total_seconds"] == sum(SECONDS.values())  # the stages' own, not the wall time
    assert timing["machine_start"] == {"fp32_gflops": 0.0}  # the first start's probe
    assert json.loads((tmp_path / "summary.json").read_text())["resumed"] == timing["resumed"]


def test_a_stage_older_than_an_earlier_one_is_stale(stages, tmp_path):
    """SFT run again by hand after RL finished: RL and everything after it run again, RL afresh (its
    checkpoints were made from the old SFT adapter)."""
    preset = get_preset("cpu-smoke")
    demo.run_all(preset, tmp_path, log=lambda *_: None)
    _age(tmp_path, ["capture", "distill", "rl", "control", "eval", "sft"], 100)
    stages.clear()
    demo.run_all(preset, tmp_path, log=lambda *_: None, resume=True)
    assert stages == [("rl", False), ("control", None), ("eval", False)]
    assert json.loads((tmp_path / "timing.json").read_text())["resumed"]["continued"] is None


def test_a_missing_summary_ends_the_finished_prefix(stages, tmp_path):
    preset = get_preset("cpu-smoke")
    demo.run_all(preset, tmp_path, log=lambda *_: None)
    (tmp_path / demo.SUMMARIES["sft"]).unlink()
    assert demo.finished_stages(preset, tmp_path) == ["capture", "distill"]
    stages.clear()
    demo.run_all(preset, tmp_path, log=lambda *_: None, resume=True)
    assert stages[0] == ("sft", True) and [name for name, _ in stages] == ["sft", "rl", "control", "eval"]


def test_nothing_done_continues_the_capture(stages, tmp_path):
    demo.run_all(get_preset("cpu-smoke"), tmp_path, log=lambda *_: None, resume=True)
    assert stages[0] == ("capture", True)
    assert json.loads((tmp_path / "timing.json").read_text())["resumed"] == {"kept": [], "continued": "capture"}


def test_a_finished_demo_resumed_runs_nothing(stages, tmp_path):
    preset = get_preset("cpu-smoke")
    demo.run_all(preset, tmp_path, log=lambda *_: None)
    stages.clear()
    demo.run_all(preset, tmp_path, log=lambda *_: None, resume=True)
    assert stages == []
    assert json.loads((tmp_path / "timing.json").read_text())["resumed"]["kept"] == list(pipeline.STAGES)


def test_with_the_control_off_it_counts_as_finished(stages, tmp_path):
    preset = get_preset("cpu-smoke", eval={"control": False})
    demo.run_all(preset, tmp_path, log=lambda *_: None)
    (tmp_path / demo.SUMMARIES["control"]).unlink()  # the real stage writes none when off
    assert demo.finished_stages(preset, tmp_path) == list(pipeline.STAGES)


def test_the_report_says_a_demo_was_resumed():
    from coa_lab.report import _resumed_line

    assert _resumed_line(None) == ""
    line = _resumed_line({"kept": ["capture", "distill", "sft"], "continued": "rl"})
    assert "capture, distill, sft" in line and "rl continued" in line and "only the part after" in line
    assert "only the part after" not in _resumed_line({"kept": ["capture"], "continued": "eval"})


@pytest.fixture
def systems(monkeypatch, tmp_path):
    """A run folder with the three adapters, and stand-ins for reading one system and the teacher;
    returns the list of systems read."""
    for adapter in pipeline.ADAPTERS.values():
        (tmp_path / adapter).mkdir(parents=True)
    read = []

    def one_system(preset, label, adapter, task_groups, tools, k, run):
        read.append(label)
        return {"test": {"label": label}, "seconds": 2.0, **({"sampled": {"k": k}} if k else {})}

    def teacher(teacher_preset, preset, run, groups, tools):
        read.append("teacher")
        return {"teacher": {"all": {}}, "seconds": 3.0}

    monkeypatch.setattr(pipeline, "_evaluate_system", one_system)
    monkeypatch.setattr(pipeline, "_evaluate_teacher", teacher)
    monkeypatch.setattr(pipeline, "make_tools", lambda preset: {})
    return read


def test_a_resumed_evaluation_reads_only_the_systems_not_yet_read(systems, tmp_path):
    preset = get_preset("cpu-smoke")
    first = pipeline.evaluate_stage(preset, tmp_path)
    assert systems == ["base", "sft", "rl", "control", "teacher"]
    assert sorted(p.stem for p in (tmp_path / "eval" / "done").iterdir()) == sorted(systems)
    systems.clear()
    (tmp_path / "eval" / "done" / "rl.json").unlink()  # killed while reading RL
    (tmp_path / "eval" / "done" / "teacher.json").write_text('{"teacher": {')  # torn by the kill
    again = pipeline.evaluate_stage(preset, tmp_path, resume=True)
    assert systems == ["rl", "teacher"]
    assert {k: v for k, v in again.items() if k != "seconds"} == {k: v for k, v in first.items() if k != "seconds"}
    # the systems kept from before (base, sft, control) count in the stage's time; rl and the teacher took ~0 s now
    assert 3 * 2.0 <= again["seconds"] < 3 * 2.0 + 2
    assert again["sampled"]["samples"] == preset.eval.control_samples and "base" not in again["sampled"]


def test_a_fresh_evaluation_reads_every_system_again(systems, tmp_path):
    preset = get_preset("cpu-smoke")
    pipeline.evaluate_stage(preset, tmp_path)
    systems.clear()
    pipeline.evaluate_stage(preset, tmp_path)  # an adapter trained since would not be this readout's
    assert systems == ["base", "sft", "rl", "control", "teacher"]
