"""`coa-lab arms` end to end with the model stood in (conftest.Fakes): which (arm, seed) is
trained, resumed or skipped, what each adapter is read with, and that the printed and written
table is comparison.py applied to the per-task outcomes on disk."""

from __future__ import annotations

import json

import pytest

from arms_fakes import fakes, run  # noqa: F401 - fixtures

from coa_lab.cli import main
from coa_lab.comparison import bootstrap_seeds_tasks, paired
from coa_lab.evaluate import pass_at_k
from coa_lab.paths import from_portable, portable_path

ARGS = ["--arm", "control", "rl+ptx", "--seeds", "0", "1", "--samples", "3", "--resamples", "500"]


def _arms(run, *extra):
    return main(["arms", "--run", str(run), *ARGS, *extra])


def test_two_arms_two_seeds_from_one_adapter_and_one_pool(run, fakes, capsys):
    assert _arms(run) == 0
    # 4 runs, each from the start adapter; the first screens the pool, every later one reuses it
    assert [(r.split("/runs/")[1], resume, reuse) for r, resume, reuse in fakes.trained] == [
        ("control/seed0", False, False), ("rl+ptx/seed0", False, True),
        ("control/seed1", False, True), ("rl+ptx/seed1", False, True)]
    out = run / "arms"
    for arm in ("control", "rl+ptx"):
        for seed in (0, 1):
            adapter = out / "runs" / arm / f"seed{seed}" / "sft" / "adapter"
            assert adapter.resolve() == (run / "sft" / "adapter").resolve()
    result = json.loads((out / "arms.json").read_text())
    assert result["split"] == "val" and result["tasks"] == 9 and result["seeds"] == [0, 1]
    assert result["start"]["adapter"] == portable_path((run / "sft" / "adapter").resolve())  # never absolute
    assert from_portable(result["start"]["adapter"]) == (run / "sft" / "adapter").resolve()
    assert result["start"]["made_by"]["preset"] == "cpu-smoke"
    assert set(result["arms"]) == {"control", "rl+ptx"} and "rl_ptx_minus_control" in result
    for block in (result["arms"]["control"], result["rl_ptx_minus_control"]):
        for m in ("greedy", "avg_at_3", "pass_at_3"):
            assert {"gains", "paired_se", "mean", "ci95", "won", "lost"} <= set(block[m])
    printed = capsys.readouterr().out
    assert "rl+ptx - control" in printed and "avg_at_3" in printed and "by family" in printed


def test_sampled_readout_is_k_answers_at_rl_temperature(run, fakes):
    assert _arms(run, "--seeds", "0") == 0
    # every adapter read twice: greedy at eval.temperature, then 3 samples at rl.temperature (0.7)
    assert {(k, t) for _, k, t in fakes.evaluated} == {(1, 0.0), (3, 0.7)}
    assert len(fakes.evaluated) == 2 * 3  # sft, control@0, rl+ptx@0
    stored = json.loads((run / "arms" / "scores" / "control_seed0.json").read_text())
    assert stored["temperature"] == 0.7 and stored["samples"] == 3
    assert all(len(v) == 3 for v in stored["sampled"].values()) and len(stored["greedy"]) == 9
    fams = json.loads((run / "arms" / "arms.json").read_text())["arms"]["control"]["by_family"]
    assert set(fams) == {"math/arith", "mhqa/lookup"} and set(fams["math/arith"]) == {"greedy", "avg_at_3", "pass_at_3"}


def test_table_is_comparison_of_the_stored_outcomes(run, fakes):
    assert _arms(run) == 0
    out = run / "arms"
    result = json.loads((out / "arms.json").read_text())
    load = lambda name: json.loads((out / "scores" / f"{name}.json").read_text())  # noqa: E731
    sft = load("sft")
    avg = lambda e: {t: sum(v) / len(v) for t, v in e["sampled"].items()}  # noqa: E731
    pas = lambda e: {t: pass_at_k(3, sum(x == 1.0 for x in v), 3) for t, v in e["sampled"].items()}  # noqa: E731
    for metric, f in (("greedy", lambda e: e["greedy"]), ("avg_at_3", avg), ("pass_at_3", pas)):
        for arm in ("control", "rl+ptx"):
            pairs = [(f(sft), f(load(f"{arm}_seed{s}"))) for s in (0, 1)]
            block = result["arms"][arm][metric]
            assert block["gains"] == [paired(*p)["gain"] for p in pairs]
            assert block["paired_se"] == [paired(*p)["se"] for p in pairs]
            assert block["won"] == [paired(*p)["won"] for p in pairs]
            boot = bootstrap_seeds_tasks(pairs, 500)
            assert (block["mean"], block["ci95"]) == (boot["mean"], boot["ci95"])
        pairs = [(f(load(f"control_seed{s}")), f(load(f"rl+ptx_seed{s}"))) for s in (0, 1)]
        diff = result["rl_ptx_minus_control"][metric]
        assert diff["gains"] == [paired(*p)["gain"] for p in pairs]
        assert diff["ci95"] == bootstrap_seeds_tasks(pairs, 500)["ci95"]
    # recomputed from the files alone: the same table, no model
    (out / "arms.json").unlink()
    fakes.evaluated.clear()
    assert main(["arms", "--out", str(out), "--table-only", "--resamples", "500", "--arm", "control", "rl+ptx"]) == 0
    again = json.loads((out / "arms.json").read_text())
    assert again["arms"] == result["arms"] and not fakes.evaluated


def test_a_pair_keeps_its_name_when_later_calls_name_the_arms_in_another_order(run, fakes):
    common = ["--samples", "3", "--resamples", "500"]
    assert main(["arms", "--run", str(run), "--arm", "rl", "rft", "control", "--seeds", "0", *common]) == 0
    # resumed one arm at a time, a later call naming rft alone: rl − rft keeps its name (against control: X − control)
    assert main(["arms", "--run", str(run), "--arm", "rft", "--seeds", "1", *common]) == 0
    assert main(["arms", "--run", str(run), "--arm", "rl", "--seeds", "1", *common]) == 0
    result = json.loads((run / "arms" / "arms.json").read_text())
    assert list(result["arms"]) == ["rl", "rft", "control"]
    pairs = sorted(k for k in result if "_minus_" in k)
    assert pairs == ["rft_minus_control", "rl_minus_control", "rl_minus_rft"]
    assert result["rl_minus_rft"]["seeds"] == [0, 1] and result["rl_minus_control"]["seeds"] == [0]


def test_a_killed_command_resumes_without_redoing_finished_work(run, fakes):
    fakes.fail_training_at = 3  # dies training control@1, after two (arm, seed) were read
    with pytest.raises(KeyboardInterrupt):
        _arms(run)
    scores = run / "arms" / "scores"
    done = {f.name: f.stat().st_mtime_ns for f in scores.glob("*.json")}
    assert set(done) == {"sft.json", "control_seed0.json", "rl+ptx_seed0.json"}
    fakes.trained.clear(), fakes.evaluated.clear()
    fakes.fail_training_at = None
    assert _arms(run) == 0
    # only the two missing runs trained; the half-made one (no checkpoint) restarted from the start
    assert [(r.split("/runs/")[1], resume) for r, resume, _ in fakes.trained] == [("control/seed1", False),
                                                                                 ("rl+ptx/seed1", False)]
    assert {f.name: f.stat().st_mtime_ns for f in scores.glob("*.json") if f.name in done} == done
    assert len(fakes.evaluated) == 2 * 2  # sft and seed 0 were not read again


def test_a_run_killed_after_a_checkpoint_resumes_it(run, fakes):
    fakes.fail_training_at, fakes.checkpoint_before_failing = 2, True
    with pytest.raises(KeyboardInterrupt):
        _arms(run, "--seeds", "0")
    fakes.fail_training_at = None
    fakes.trained.clear()
    assert _arms(run, "--seeds", "0") == 0
    assert [(r.split("/runs/")[1], resume) for r, resume, _ in fakes.trained] == [("rl+ptx/seed0", True)]
    stored = json.loads((run / "arms" / "scores" / "rl+ptx_seed0.json").read_text())
    assert stored["how"] == "resumed"


def test_readout_only_trains_nothing(run, fakes, tmp_path):
    adapters = []
    for name in ("c0", "c1", "kl"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text("{}")
    adapters = [f"control@0={tmp_path / 'c0'}", f"control@1={tmp_path / 'c1'}", f"kl={tmp_path / 'kl'}"]
    assert main(["arms", "--run", str(run), "--readout-only", "--adapters", *adapters, "--samples", "4",
                 "--resamples", "200"]) == 0
    assert fakes.trained == []
    assert len(fakes.evaluated) == 2 * 4 and {k for _, k, _ in fakes.evaluated} == {1, 4}
    result = json.loads((run / "arms" / "arms.json").read_text())
    assert result["arms"]["control"]["seeds"] == [0, 1] and result["arms"]["kl"]["seeds"] == [0]
    assert "avg_at_4" in result["arms"]["kl"] and "kl_minus_control" in result


def test_confirmation_split_only_with_final_and_recorded(run, fakes, capsys):
    from coa_lab.rl_arms import runner

    assert main(["arms", "--run", str(run), "--split", "confirm", "--arm", "control"]) == 2
    assert "--final" in capsys.readouterr().err and not fakes.evaluated
    assert not runner.READINGS.exists()
    assert main(["arms", "--run", str(run), "--split", "confirm", "--final", "--arm", "control", "--seeds", "0",
                 "--samples", "0", "--resamples", "100"]) == 0
    row = json.loads(runner.READINGS.read_text().splitlines()[-1])
    assert row["benchmark"] == "coa-lab arms" and row["arms"] == ["control"]


def test_another_reading_of_the_same_out_must_pair(run, fakes, capsys):
    assert _arms(run, "--seeds", "0") == 0
    assert _arms(run, "--seeds", "0", "--samples", "2") == 2
    assert "other settings" in capsys.readouterr().err


def test_readings_in_another_numeric_mode_do_not_pair(run, fakes, capsys, monkeypatch):
    """A later session on another draw (no bf16 units) would read in fp32 what was read under bf16
    autocast: answers flip in the last bits, so it stops and says how to pin the mode."""
    from coa_lab.generation import models

    monkeypatch.setenv("COA_LAB_CPU_BF16", "1")
    models.cpu_bf16_is_fast.cache_clear()  # the answer is cached per process
    assert _arms(run, "--seeds", "0") == 0
    out = run / "arms"
    settings = json.loads((out / "settings.json").read_text())
    assert settings["numerics"] == models.numeric_mode(models.ModelConfig()) == "cpu-float32+bf16-autocast"
    monkeypatch.setenv("COA_LAB_CPU_BF16", "0")
    models.cpu_bf16_is_fast.cache_clear()
    try:
        assert _arms(run, "--seeds", "0", "1") == 2
        assert "numerics" in capsys.readouterr().err
        # a settings file written before the field existed cannot say: it is read on, and the field recorded
        del settings["numerics"]
        (out / "settings.json").write_text(json.dumps(settings))
        assert _arms(run, "--seeds", "0") == 0
        assert json.loads((out / "settings.json").read_text())["numerics"] == "cpu-float32"
    finally:
        models.cpu_bf16_is_fast.cache_clear()


def test_arms_from_an_arms_adapter_screen_their_own_pool(run, fakes):
    """An arm's adapter as the start (a converged start: SFT extended by the control's steps)
    holds its own start's screening, another policy's: the first arm from it screens anew."""
    assert main(["arms", "--run", str(run), "--arm", "control", "--seeds", "0", "--samples", "0"]) == 0
    extended = run / "arms" / "runs" / "control" / "seed0" / "rl" / "adapter"
    assert (extended.parent / "pool.json").exists()  # the copy of the SFT start's screening
    fakes.trained.clear()
    out = run / "from_extended"
    assert main(["arms", "--out", str(out), "--start", str(extended), "--preset", "cpu-smoke", "--arm", "rl",
                 "--seeds", "0", "1", "--samples", "0", "--set", "rl.steps=2",
                 "--set", 'eval.val_tasks={"math/arith": 6, "mhqa/lookup": 3}']) == 0
    assert [reuse for _, _, reuse in fakes.trained] == [False, True]  # screened by the first, shared after


def test_a_start_runs_screening_of_other_candidates_is_not_reused(run, fakes):
    """RUN/rl/pool.json screened another rl.pool mix: the arms draw other questions, so they screen anew."""
    (run / "rl").mkdir(exist_ok=True)
    (run / "rl" / "pool.json").write_text(json.dumps({"pass_rates": {"not-a-candidate": 0.5}, "pool": []}))
    assert _arms(run) == 0
    assert fakes.trained[0][2] is False  # the first arm screened


def test_a_new_rl_run_folder_links_its_start_and_copies_its_pool(tmp_path):
    """pipeline.new_rl_run, what every arm's run and RL's control train from: the start adapter and the SFT rows
    linked (not copied: one adapter, many runs), the pool copied (a run may rewrite its own), and nothing stale."""
    from coa_lab.pipeline import new_rl_run
    adapter, distill, pool = tmp_path / "start" / "adapter", tmp_path / "start" / "distill", tmp_path / "pool.json"
    adapter.mkdir(parents=True)
    distill.mkdir()
    pool.write_text('{"pass_rates": {}}')
    folder = tmp_path / "runs" / "rl" / "seed0"
    (folder / "rl").mkdir(parents=True)
    (folder / "rl" / "stale.json").write_text("{}")
    new_rl_run(folder, adapter, distill, pool)
    assert (folder / "sft" / "adapter").resolve() == adapter.resolve()
    assert (folder / "distill").resolve() == distill.resolve()
    assert not (folder / "rl" / "pool.json").is_symlink() and (folder / "rl" / "pool.json").read_text() == pool.read_text()
    assert not (folder / "rl" / "stale.json").exists()
    new_rl_run(folder, adapter, tmp_path / "none", tmp_path / "none.json")  # no SFT rows, no screening yet
    assert not (folder / "distill").exists() and not (folder / "rl").exists()
