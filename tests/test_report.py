"""coa_lab/report.py: the paired RL figure (same questions, first step vs last step)."""

from __future__ import annotations

import json

from coa_lab.report import revisited_questions


def _rollout(task: str, step: int, reward: float) -> dict:
    return {"task_id": task, "reward": reward, "metadata": {"step": step}}


def test_revisited_questions_pairs_first_and_last_step_of_each_question(tmp_path):
    rows = [_rollout("a", 0, 0.0), _rollout("a", 0, 1.0), _rollout("a", 3, 1.0), _rollout("a", 5, 1.0),
            _rollout("b", 1, 0.0), _rollout("b", 4, 0.0), _rollout("b", 4, 1.0),
            _rollout("c", 2, 1.0)]  # c was sampled at one step only: no pair
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    got = revisited_questions(path)
    assert got == {"questions": 2, "first": (0.5 + 0.0) / 2, "last": (1.0 + 0.5) / 2}
    # anchors (questions sampled beside the pool) are left out of the pool's figure
    assert revisited_questions(path, exclude={"b"}) == {"questions": 1, "first": 0.5, "last": 1.0}


def test_revisited_questions_without_pairs_or_file(tmp_path):
    assert revisited_questions(tmp_path / "missing.jsonl") is None
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps(_rollout("a", 0, 1.0)) + "\n")
    assert revisited_questions(path) is None


def test_report_shows_how_the_machine_drifted_during_the_run(tmp_path):
    """Stage seconds mean little without the machine's speed; on a shared machine it moves."""
    from coa_lab.report import write_report

    machine = {"cores": 2, "fp32_gflops": 84.5, "bf16_gflops": 1.2, "bf16_autocast": False}
    (tmp_path / "timing.json").write_text(json.dumps(
        {"sft": 446.2, "total_seconds": 2336.9, "machine": machine, "machine_start": {**machine, "fp32_gflops": 179.2}}))
    text = write_report(tmp_path).read_text()
    assert "fp32 179 (start) → 84 (end) GFLOP/s" in text


def test_publish_run_writes_the_run_files_figures_with_provenance(tmp_path):
    """`COA_LAB_PUBLISH=1 coa-lab demo`: the README's demo table reads docs/results/demo.json,
    which must hold what the run's own files say (and refuse a run that has not finished)."""
    import pytest

    from coa_lab.published import check_figures
    from coa_lab.report import publish_run, write_summary

    run = tmp_path / "run"
    (run / "distill").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="coa-lab demo"):
        publish_run(run, "demo", "test", directory=tmp_path / "docs" / "results")
    machine = {"cores": 2, "fp32_gflops": 150.0, "bf16_gflops": 1.2, "bf16_autocast": False}
    (run / "timing.json").write_text(json.dumps({"rl": 600.0, "total_seconds": 1500.0, "machine": machine,
                                                 "machine_start": machine}))
    funnel = {"input": 72, "kept": 51, "by_source": {"teacher": {"input": 72, "correctness": 51}},
              "kept_by_source": {"teacher": 51}}
    (run / "distill" / "summary.json").write_text(json.dumps(funnel))
    write_summary(run)
    path = publish_run(run, "demo", "COA_LAB_PUBLISH=1 coa-lab demo", directory=tmp_path / "docs" / "results")
    doc = json.loads(path.read_text())
    assert doc["source"] == "COA_LAB_PUBLISH=1 coa-lab demo" and doc["provenance"]["machine"] == machine
    assert doc["funnel"] == funnel and doc["summary"]["stage_seconds"] == {"rl": 600.0}
    assert doc["summary"]["rl_time_share"] == 0.4  # issue 26's bound: RL within 40% of the demo
    link = '[600](docs/results/demo.json "summary.stage_seconds.rl")'
    assert check_figures(f"RL took {link} s", tmp_path) == (1, [])  # a link into it checks out...
    n, problems = check_figures(f"RL took {link.replace('[600]', '[500]')} s", tmp_path)
    assert n == 1 and problems  # ...and a wrong figure does not
