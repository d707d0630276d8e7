"""benchmarks/bench_rl_effect.py's bookkeeping, with `coa-lab arms` stood in: the converged start
is the first adapter one more control run no longer improves, and saved outcomes come back only
for the same start adapter (its weights' sha256)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import import_benchmark

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench(tmp_path, monkeypatch):
    b = import_benchmark("bench_rl_effect")
    monkeypatch.setattr(b, "STATE", tmp_path / "state")
    return b


def _adapter(path: Path, weights: bytes) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_model.safetensors").write_bytes(weights)
    return path


def _fake_arms(gains: list[float], calls: list):
    """`arms` as the converge step calls it: link k's control gains gains[k] over its start."""
    def arms(out, start, specs, seeds, sets, samples, **_):
        k = len(calls)
        calls.append((Path(start), specs, samples))
        _adapter(out / "runs" / "control" / "seed0" / "rl" / "adapter", f"link{k}".encode())
        block = {"mean": gains[k], "ci95": [gains[k] - 0.03, gains[k] + 0.03], "won": [3], "lost": [1]}
        return {"sft": {"greedy": 0.7 + sum(gains[:k])}, "arms": {"control": {"greedy": block}}}
    return arms


def test_converge_stops_at_the_first_start_more_control_does_not_improve(bench, tmp_path, monkeypatch):
    run = tmp_path / "run"
    _adapter(run / "sft" / "adapter", b"sft")
    calls = []
    monkeypatch.setattr(bench, "arms", _fake_arms([0.04, 0.02, 0.004, 0.0], calls))
    state = bench.converge(run, min_gain=0.01, max_links=5)
    assert len(calls) == 3 and all(specs == ["control"] and samples == 0 for _, specs, samples in calls)
    assert calls[0][0] == run / "sft" / "adapter"
    assert calls[2][0] == run / "effect" / "start" / "link1" / "runs" / "control" / "seed0" / "rl" / "adapter"
    assert bench._start(run) == calls[2][0] and state["converged"]  # link 2's start: link 1's result
    assert not any(Path(x["start"]).is_absolute() for x in [state, *state["links"]])  # the record is committed
    assert [round(x["gain"], 3) for x in state["links"]] == [0.04, 0.02, 0.004]
    assert json.loads((run / "effect" / "start" / "start.json").read_text()) == state


def test_converge_says_when_it_ran_out_of_links(bench, tmp_path, monkeypatch):
    run = tmp_path / "run"
    _adapter(run / "sft" / "adapter", b"sft")
    monkeypatch.setattr(bench, "arms", _fake_arms([0.05, 0.05, 0.05], []))
    assert bench.converge(run, min_gain=0.01, max_links=2)["converged"] is False


def _with_start(run: Path, weights: bytes) -> None:
    start = _adapter(run / "effect" / "start" / "link0" / "runs" / "control" / "seed0" / "rl" / "adapter", weights)
    (run / "effect" / "start" / "start.json").write_text(json.dumps({"start": str(start)}))


def test_saved_outcomes_return_only_for_the_same_start(bench, tmp_path):
    first = tmp_path / "first"
    _with_start(first, b"start")
    sweep = first / "effect" / "sweep"
    (sweep / "scores").mkdir(parents=True)
    (sweep / "scores" / "sft.json").write_text('{"greedy": {}}')
    (sweep / "settings.json").write_text(json.dumps({"start": "/elsewhere", "samples": 4}))
    (sweep / "runs" / "rl" / "seed0").mkdir(parents=True)
    (sweep / "runs" / "rl" / "seed0" / "big.json").write_text("{}")  # a run folder's file: not an outcome
    bench.save_state(first)
    assert (bench.STATE / "sweep" / "scores" / "sft.json").exists() and not (bench.STATE / "sweep" / "runs").exists()

    same = tmp_path / "same"
    _with_start(same, b"start")
    bench.restore(same, "sweep")
    assert (same / "effect" / "sweep" / "scores" / "sft.json").exists()
    settings = json.loads((same / "effect" / "sweep" / "settings.json").read_text())
    assert settings == {"start": str(bench._start(same).resolve()), "samples": 4}  # pairs with this machine's path

    other = tmp_path / "other"
    _with_start(other, b"another machine's weights")
    bench.restore(other, "sweep")
    assert not (other / "effect" / "sweep").exists()  # its outcomes would not pair: start over


def test_each_arm_runs_step_log_outlives_its_run_folder(bench, tmp_path):
    """save-state keeps every arm run's per-step log (‖∇PG‖, ‖Δθ‖, its own reward), cut to STEP_FIELDS,
    outside runs/ (weights, not kept); a restored step still has it."""
    run = tmp_path / "run"
    _with_start(run, b"start")
    metrics = run / "effect" / "sweep" / "runs" / "rl_lr2e-05" / "seed0" / "rl" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    rows = [{"step": k, "accuracy": 0.5 + k / 10, "grad_norm_pg": 0.1, "delta_norm": 0.02 * k, "seconds": 99.0}
            for k in range(3)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    unfinished = run / "effect" / "sweep" / "runs" / "rl_lr5e-05" / "seed0" / "rl" / "metrics.jsonl"
    unfinished.parent.mkdir(parents=True)
    unfinished.write_text(json.dumps(rows[0]) + "\n")  # no score yet: still running, not an outcome
    (run / "effect" / "sweep" / "scores").mkdir()
    (run / "effect" / "sweep" / "scores" / "rl_lr2e-05_seed0.json").write_text("{}")
    bench.save_state(run)
    assert not (bench.STATE / "sweep" / "steps" / "rl_lr5e-05_seed0.jsonl").exists()
    saved = bench.STATE / "sweep" / "steps" / "rl_lr2e-05_seed0.jsonl"
    kept = [json.loads(x) for x in saved.read_text().splitlines()]
    assert kept == [{k: v for k, v in r.items() if k != "seconds"} for r in rows]
    again = tmp_path / "again"
    _with_start(again, b"start")
    bench.restore(again, "sweep")
    assert (again / "effect" / "sweep" / "steps" / "rl_lr2e-05_seed0.jsonl").read_text() == saved.read_text()
    assert bench._arm_block({"seeds": [0, 1]}, again / "effect" / "sweep", "rl_lr2e-05")["steps"] == {"seed0": kept}


def test_a_runs_step_summary_reads_its_reward_halves_and_how_its_weights_moved(bench):
    rows = [{"step": 0, "accuracy": 0.4, "entropy": 0.2, "delta_norm": 0.0, "lr_x_n": 0.0, "lr_x_sqrt_n": 0.0}] + \
        [{"step": k, "accuracy": 0.4 + 0.1 * (k >= 2), "entropy": 0.1, "delta_norm": 0.01 * k, "lr_x_n": 1e-5 * k,
          "lr_x_sqrt_n": 1e-5 * k ** 0.5} for k in range(1, 4)]
    summary = bench.step_summary(rows)
    assert summary["halves"]["accuracy"] == pytest.approx([0.4, 0.5]) and summary["halves"]["grad_norm_pg"] == [None, None]
    assert summary["halves"]["entropy"] == pytest.approx([0.15, 0.1])
    assert (summary["from_step"], summary["to_step"]) == (1, 3)  # step 0 did not move the weights
    assert summary["growth"] == pytest.approx({"delta_norm": 3.0, "lr_x_n": 3.0, "lr_x_sqrt_n": 3 ** 0.5})


def test_the_arms_start_from_the_sweeps_pool_start_reading_and_run_at_the_chosen_rate(bench, tmp_path):
    """ONE screened pool for every step; on validation the sweep's run at the chosen rate is `rl`'s seed 0
    (same settings), under its arm name so `coa-lab arms` skips it; the confirmation split shares only the pool."""
    run = tmp_path / "run"
    sweep = run / "effect" / "sweep"
    (sweep / "scores").mkdir(parents=True)
    (sweep / "steps").mkdir()
    (sweep / "pool.json").write_text('{"pass_rates": {"t1": 0.5}}')
    (sweep / "settings.json").write_text('{"split": "val"}')
    (sweep / "scores" / "sft.json").write_text('{"arm": "sft"}')
    overrides = {"rl": {"learning_rate": 2e-05, "sft_coef": 0.0}}
    for rate in ("2e-05", "5e-05"):
        (sweep / "scores" / f"rl_lr{rate}_seed0.json").write_text(json.dumps({"arm": f"rl_lr{rate}", "seed": 0,
                                                                               "overrides": overrides}))
        (sweep / "steps" / f"rl_lr{rate}_seed0.jsonl").write_text(json.dumps({"step": 0, "lr": float(rate)}) + "\n")
    bench.from_sweep(run, "val", 2e-5)
    val = run / "effect" / "val"
    assert (val / "pool.json").read_text() == (sweep / "pool.json").read_text()
    assert (val / "scores" / "sft.json").exists() and (val / "settings.json").exists()
    rl = json.loads((val / "scores" / "rl_seed0.json").read_text())
    assert rl["arm"] == "rl" and rl["overrides"] == overrides and rl["from"] == "sweep/rl_lr2e-05_seed0"
    assert json.loads((val / "steps" / "rl_seed0.jsonl").read_text())["lr"] == 2e-5
    assert sorted(p.name for p in (val / "scores").iterdir()) == ["rl_seed0.json", "sft.json"]
    # the arm as `arms` defines it is the sweep's: same overrides
    assert bench.rl_arm("rl", 2e-5).split("=", 1)[1] == "rl.learning_rate=2e-05,rl.sft_coef=0.0"
    bench.from_sweep(run, "confirm", 2e-5)
    confirm = run / "effect" / "confirm"
    assert (confirm / "pool.json").exists() and list((confirm / "scores").iterdir()) == []


def test_a_step_stops_when_its_base_settings_moved_between_sessions(bench, tmp_path, monkeypatch):
    """The arms of one step run over many sessions: a default moved in between (e.g. the recipe adopted
    into cpu-tiny) would pair arms trained under different settings, so the step refuses, naming it."""
    monkeypatch.chdir(REPO)  # `coa-lab arms` trains with the working folder's coa_lab: this checkout's
    out = tmp_path / "val"
    bench.same_base(out, bench.BUDGET)
    saved = json.loads((out / "base_preset.json").read_text())
    assert saved["rl"]["steps"] == 16 and saved["rl"]["advantage"] == "dr_grpo"
    bench.same_base(out, bench.BUDGET)  # the same settings: fine
    with pytest.raises(SystemExit, match=r"rl\.temperature"):
        bench.same_base(out, bench.BUDGET + ["rl.temperature=1.0"])
    monkeypatch.chdir(_checkout(tmp_path, "anchors_per_step: int = 3", "anchors_per_step: int = 0"))
    with pytest.raises(SystemExit, match=r"rl\.anchors_per_step"):  # a moved default, not an override
        bench.same_base(out, bench.BUDGET)


def _checkout(tmp_path: Path, default: str, moved: str) -> Path:
    """A checkout of coa_lab whose config.py moved one default: the working folder `coa-lab arms` trains from."""
    folder = tmp_path / "checkout"
    shutil.copytree(REPO / "coa_lab", folder / "coa_lab", ignore=shutil.ignore_patterns("__pycache__"))
    config = folder / "coa_lab" / "config.py"
    assert default in config.read_text()
    config.write_text(config.read_text().replace(default, moved))
    return folder


def test_a_step_is_held_to_the_defaults_of_the_code_it_trains_with(bench, tmp_path, monkeypatch):
    """A measurement run from a frozen checkout (its working folder) trains with that checkout's coa_lab: its
    steps are held to those defaults, so the recipe can move in this checkout while it runs, and not under it."""
    out = tmp_path / "val"
    frozen = _checkout(tmp_path, "clip_high: float = 0.28", "clip_high: float = 0.3")
    monkeypatch.chdir(frozen)
    bench.same_base(out, bench.BUDGET)
    assert json.loads((out / "base_preset.json").read_text())["rl"]["clip_high"] == 0.3
    assert bench.base_settings(bench.BUDGET, cwd=REPO)["rl"]["clip_high"] == 0.28  # this checkout's own
    bench.same_base(out, bench.BUDGET)  # the frozen code again: fine
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit, match=r"rl\.clip_high"):  # run with other code, the step refuses
        bench.same_base(out, bench.BUDGET)


def test_a_field_the_training_code_lacks_does_not_stop_its_step(bench, tmp_path, monkeypatch):
    """Kept settings resolved by newer code name fields an older frozen checkout lacks (the demo's eval.control):
    they cannot act on its arms. A field the training code has and the kept settings lack stops it."""
    monkeypatch.chdir(REPO)
    out = tmp_path / "val"
    bench.same_base(out, bench.BUDGET)
    older = _checkout(tmp_path, "    control_samples: int = 2", "")
    monkeypatch.chdir(older)
    bench.same_base(out, bench.BUDGET)
    assert "control_samples" not in json.loads((out / "base_preset.json").read_text())["eval"]
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit, match=r"eval\.control_samples"):
        bench.same_base(out, bench.BUDGET)


def _finished(run_dir: Path) -> Path:
    _adapter(run_dir / "rl" / "adapter", b"w")
    (run_dir / "rl" / "adapter" / "adapter_config.json").write_text("{}")
    (run_dir / "rl" / "summary.json").write_text('{"metrics": []}')
    return run_dir


def test_the_confirmation_split_reads_the_adapters_validation_trained(bench, tmp_path):
    """The final arms are validation's adapters read once more: each finished run (rl seed 0: the sweep's at the
    chosen rate) is linked into effect/confirm/runs; one validation has not finished is left to train there."""
    run = tmp_path / "run"
    effect = run / "effect"
    sweep_rl = _finished(effect / "sweep" / "runs" / "rl_lr2e-05" / "seed0")
    _finished(effect / "sweep" / "runs" / "rl_lr5e-05" / "seed0")
    control = _finished(effect / "val" / "runs" / "control" / "seed0")
    (effect / "val" / "runs" / "rft" / "seed0" / "rl").mkdir(parents=True)  # killed mid-training
    half = effect / "confirm" / "runs" / "control" / "seed0"
    half.mkdir(parents=True)  # a confirm run started before: validation's finished one replaces it
    done = bench.reuse_val_adapters(run, 2e-5, ["control", "rft", "rl", "rl+ptx"], [0, 1])
    assert done == {"control@0": "val/runs/control/seed0", "rl@0": "sweep/runs/rl_lr2e-05/seed0"}
    confirm = effect / "confirm" / "runs"
    assert (confirm / "control" / "seed0").resolve() == control.resolve()
    assert (confirm / "rl" / "seed0").resolve() == sweep_rl.resolve()
    assert not (confirm / "rft").exists() and not (confirm / "rl+ptx").exists()
    assert json.loads((effect / "confirm" / "trained_in.json").read_text()) == done
    assert bench.reuse_val_adapters(run, 2e-5, ["control", "rft", "rl", "rl+ptx"], [0, 1]) == done  # again: same


def test_the_target_is_met_only_on_the_confirmation_split_over_five_seeds(bench):
    """rl − the start ≥ +3 points greedy or ≥ +5 avg@4, 5 seeds, the interval above zero, read on confirm."""
    def block(split, seeds, greedy, avg):
        return {"split": split, "arms": {"rl": {"seeds": list(range(seeds)),
                                                 "greedy": {"mean": greedy[0], "ci95": greedy[1]},
                                                 "avg_at_4": {"mean": avg[0], "ci95": avg[1]}}}}
    hit = block("confirm", 5, (0.02, [0.005, 0.04]), (0.06, [0.03, 0.09]))
    got = bench.target(hit)
    assert got["met"] and not got["greedy"]["reached"] and got["avg_at_4"]["reached"]
    assert not bench.target(block("val", 5, (0.02, [0.005, 0.04]), (0.06, [0.03, 0.09])))["met"]  # validation decides nothing
    assert not bench.target(block("confirm", 4, (0.04, [0.01, 0.07]), (0.06, [0.03, 0.09])))["met"]  # too few seeds
    assert not bench.target(block("confirm", 5, (0.04, [-0.01, 0.09]), (0.06, [-0.002, 0.12])))["met"]  # interval
    assert bench.target(block("confirm", 5, (0.031, [0.001, 0.06]), (0.0, [-0.02, 0.02])))["met"]  # greedy alone
    assert bench.target({"split": "confirm", "arms": {}}) == {"met": False, "why": "no rl arm read"}


def test_the_confirmation_step_is_held_to_validations_settings(bench, tmp_path, monkeypatch):
    """Confirm reads validation's adapters (and trains any it lacks): under other defaults it would mix arms."""
    monkeypatch.chdir(REPO)
    bench.same_base(tmp_path / "val", bench.BUDGET)
    monkeypatch.chdir(_checkout(tmp_path, "clip_low: float = 0.2", "clip_low: float = 0.25"))
    with pytest.raises(SystemExit, match=r"rl\.clip_low"):
        bench.same_base(tmp_path / "confirm", bench.BUDGET)
    assert not (tmp_path / "confirm" / "base_preset.json").exists()
    monkeypatch.chdir(REPO)
    bench.same_base(tmp_path / "confirm", bench.BUDGET)
    assert (tmp_path / "confirm" / "base_preset.json").read_text() == (tmp_path / "val" / "base_preset.json").read_text()


def test_a_confirmation_reading_made_from_another_checkout_is_recorded_here(bench, tmp_path, monkeypatch):
    """Run from a frozen checkout, `coa-lab arms` records the reading there; this checkout's record gets it too."""
    ours, theirs = tmp_path / "ours.jsonl", tmp_path / "frozen" / "confirm_readings.jsonl"
    monkeypatch.setattr(bench, "READINGS", ours)
    theirs.parent.mkdir()
    old, new = json.dumps({"date": "2026-11-01", "arms": ["a"]}), json.dumps({"date": "2026-12-01", "arms": ["rl"]})
    ours.write_text(old + "\n")
    theirs.write_text(old + "\n" + new + "\n")
    bench.keep_readings(theirs)
    bench.keep_readings(theirs)  # twice: recorded once
    assert ours.read_text().splitlines() == [old, new]
    bench.keep_readings(ours)  # the same record: nothing to do
    assert ours.read_text().splitlines() == [old, new]


def test_the_reading_is_copied_while_the_arms_run_so_a_killed_session_keeps_it(bench, tmp_path, monkeypatch):
    ours, theirs = tmp_path / "ours.jsonl", tmp_path / "frozen" / "confirm_readings.jsonl"
    theirs.parent.mkdir()
    monkeypatch.setattr(bench, "READINGS", ours)
    monkeypatch.setattr(bench, "their_readings", lambda: theirs)
    monkeypatch.setattr(bench, "same_base", lambda *a: None)
    row = json.dumps({"date": "2026-11-29", "arms": ["control", "rft", "rl"]})

    class Arms:  # `coa-lab arms`: records its reading first, then trains for hours, then dies with the session
        def __init__(self, cmd):
            theirs.write_text(row + "\n")

        waits = []

        def wait(self, timeout):
            self.waits.append(ours.exists())  # was the reading here yet, each time the driver looked?
            if len(self.waits) == 1:
                raise bench.subprocess.TimeoutExpired("arms", timeout)
            return -9

    monkeypatch.setattr(bench.subprocess, "Popen", Arms)
    with pytest.raises(bench.subprocess.CalledProcessError):
        bench.arms(tmp_path / "confirm", tmp_path / "start", ["rl=rl.sft_coef=0"], [0], [], 4, split="confirm")
    assert Arms.waits == [False, True]  # copied while the arms still ran, not only after they ended
    assert ours.read_text().splitlines() == [row]


def test_the_pool_summary_says_what_the_shared_screening_kept(bench, tmp_path):
    pool = tmp_path / "pool.json"
    assert bench.pool_summary(pool) is None  # a step not screened yet
    pool.write_text(json.dumps({"candidates": 200, "samples": 4, "rollouts": 726, "kept": 63,
                                "histogram": {"4/4": 103}, "pass_rates": {"t1": 0.5}, "anchors": ["a"]}))
    assert bench.pool_summary(pool) == {"candidates": 200, "samples": 4, "rollouts": 726, "kept": 63,
                                        "histogram": {"4/4": 103}}


def _converged_from(run: Path, weights: bytes) -> Path:
    """A start as `converge` leaves it: link0's control run, with distill/ and preset.json in its folder."""
    _with_start(run, weights)
    home = run / "effect" / "start" / "link0" / "runs" / "control" / "seed0"
    (home / "rl" / "adapter" / "adapter_config.json").write_text('{"r": 16}')
    (home / "distill").mkdir()
    (home / "distill" / "kept.jsonl").write_text('{"id": "t1"}\n')
    (home / "preset.json").write_text('{"name": "cpu-tiny"}')
    link = run / "effect" / "start" / "link0"
    (link / "scores").mkdir()
    (link / "scores" / "sft.json").write_text('{"arm": "sft"}')
    return home / "rl" / "adapter"


def test_the_confirmation_start_is_kept_with_its_weights_and_restored_in_place_of_a_rebuild(bench, tmp_path):
    """Validation's start was lost with its machine; the confirmation's own start (another sha256) is saved
    with its weights and trajectories, and a fresh RUN of a later session on any draw resumes from it."""
    val_run = tmp_path / "val_run"
    _with_start(val_run, b"validation's start")
    (val_run / "effect" / "val" / "scores").mkdir(parents=True)
    (val_run / "effect" / "val" / "scores" / "sft.json").write_text('{"arm": "sft"}')
    bench.save_state(val_run)
    val_sha = (bench.STATE / "start_sha256").read_text()

    first = tmp_path / "first"
    start = _converged_from(first, b"the confirmation's start")
    (first / "effect" / "confirm" / "scores").mkdir(parents=True)
    (first / "effect" / "confirm" / "scores" / "rl_seed0.json").write_text('{"arm": "rl"}')
    (first / "effect" / "confirm" / "runs" / "rl" / "seed0").mkdir(parents=True)  # weights: never kept
    bench.save_state(first)
    saved = bench.STATE / bench.CONFIRM_START
    assert (bench.STATE / "start_sha256").read_text() == val_sha  # validation's record untouched
    val_record = (val_run / "effect" / "start" / "start.json").read_text()
    saved_record = (bench.STATE / "start" / "start.json").read_text()  # the same record, its paths not absolute
    assert saved_record == bench.portable_text(val_record, Path.cwd()) and saved_record != val_record
    assert bench.from_portable(json.loads(saved_record)["start"], Path.cwd()) == bench._start(val_run)
    assert (saved / "adapter" / "adapter_model.safetensors").read_bytes() == b"the confirmation's start"
    assert (saved / "distill" / "kept.jsonl").exists() and (saved / "link0" / "scores" / "sft.json").exists()
    assert (saved / "sha256").read_text().strip() == bench.sha256(start)
    assert (bench.STATE / "confirm" / "scores" / "rl_seed0.json").exists()
    assert not (bench.STATE / "confirm" / "runs").exists()

    later = tmp_path / "later"  # a fresh RUN: the saved start, not a rebuild
    bench.restore_confirm_start(later)
    restored = bench._start(later)
    assert bench.sha256(restored) == bench.sha256(start)
    assert (restored.parent.parent / "distill" / "kept.jsonl").read_text() == '{"id": "t1"}\n'  # where arms looks
    bench.restore(later, "confirm")
    assert (later / "effect" / "confirm" / "scores" / "rl_seed0.json").exists()
    (later / "effect" / "confirm" / "scores" / "rl_seed1.json").write_text('{"arm": "rl"}')
    bench.save_state(later)  # the restored run saves back into the same place
    assert (bench.STATE / "confirm" / "scores" / "rl_seed1.json").exists()
    saved_start = json.loads((saved / "start.json").read_text())["start"]  # the record is the first run's
    assert bench.from_portable(saved_start, Path.cwd()) == start and not Path(saved_start).is_absolute()

    other = tmp_path / "other"
    _converged_from(other, b"a third start")
    with pytest.raises(SystemExit, match="another start"):
        bench.save_state(other)  # its outcomes would not pair with the saved confirmation's


def test_the_confirmation_start_trains_on_validations_pool_and_settings(bench, tmp_path, monkeypatch):
    """A RUN without validation's steps (the confirmation's own start): the saved screening is its pool,
    and the saved validation settings hold its arms."""
    (bench.STATE / "val").mkdir(parents=True)
    (bench.STATE / "val" / "pool.json").write_text('{"pass_rates": {"t1": 0.5}}')
    run = tmp_path / "run"
    bench.from_sweep(run, "confirm", 2e-5)
    assert (run / "effect" / "confirm" / "pool.json").read_text() == '{"pass_rates": {"t1": 0.5}}'
    monkeypatch.chdir(REPO)
    bench.same_base(bench.STATE / "val", bench.BUDGET)
    monkeypatch.chdir(_checkout(tmp_path, "clip_low: float = 0.2", "clip_low: float = 0.25"))
    with pytest.raises(SystemExit, match=r"rl\.clip_low"):
        bench.same_base(run / "effect" / "confirm", bench.BUDGET)


def _table(split: str, seeds: list[int], arms=("control", "rft", "rl")) -> dict:
    block = {"gains": [0.01] * len(seeds), "paired_se": [0.01] * len(seeds), "mean": 0.01, "ci95": [-0.01, 0.03],
             "won": [1] * len(seeds), "lost": [0] * len(seeds)}
    return {"split": split, "tasks": 3, "task_ids": ["a", "b", "c"], "seeds": seeds, "metrics": ["greedy"],
            "sft": {"greedy": 0.5}, "arms": {a: {"seeds": seeds, "greedy": block} for a in arms}}


def test_publish_reads_the_saved_state_and_keeps_validation_on_top_until_the_confirmation_is_complete(
        bench, tmp_path, monkeypatch):
    saved = {}
    monkeypatch.setattr(bench, "save", lambda name, result: saved.update(result))
    monkeypatch.setattr(bench, "machine_peak", lambda: {"cores": 2})
    (bench.STATE / "start").mkdir(parents=True)
    (bench.STATE / "start" / "start.json").write_text('{"start": "validation\'s"}')
    for split, seeds in (("val", [0, 1, 2, 3, 4]), ("confirm", [0, 1])):
        (bench.STATE / split).mkdir()
        (bench.STATE / split / "arms.json").write_text(json.dumps(_table(split, seeds)))
    (bench.STATE / bench.CONFIRM_START).mkdir()
    (bench.STATE / bench.CONFIRM_START / "start.json").write_text('{"start": "its own"}')
    (bench.STATE / bench.CONFIRM_START / "sha256").write_text("abc\n")
    bench.publish()
    assert saved["split"] == "val" and not saved["complete"] and saved["start"] == {"start": "validation's"}
    assert saved["confirm"]["start"] == {"start": "its own", "sha256": "abc"} and saved["confirm"]["seeds"] == [0, 1]
    assert saved["confirm_start"] == saved["confirm"]["start"]  # published before any confirmation arm is read too
    (bench.STATE / "confirm" / "arms.json").write_text(json.dumps(_table("confirm", [0, 1, 2, 3, 4], ("rft", "rl"))))
    bench.publish()
    assert saved["split"] == "val" and not saved["complete"]  # the control, a final arm, not read yet
    (bench.STATE / "confirm" / "arms.json").write_text(json.dumps(_table("confirm", [0, 1, 2, 3, 4])))
    bench.publish()
    assert saved["split"] == "confirm" and saved["complete"]  # rl+ptx, not a final arm, is not waited for


def test_the_confirmation_runs_the_final_arms_and_validation_all_four(bench, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setenv("COA_LAB_CPU_BF16", "0")
    for helper in ("restore_confirm_start", "restore", "from_sweep", "reuse_val_adapters"):
        monkeypatch.setattr(bench, helper, lambda *a, **k: None)
    monkeypatch.setattr(bench, "_start", lambda run: run / "start")
    monkeypatch.setattr(bench, "arms",
                        lambda out, start, specs, *a, **k: calls.append([x.split("=")[0] for x in specs]))
    run = ["arms", "--run", str(tmp_path), "--rate", "2e-5"]
    bench.main(run + ["--split", "confirm", "--final"])
    bench.main(run)
    bench.main(run + ["--split", "confirm", "--final", "--arms", "rl+ptx"])
    assert calls == [["control", "rft", "rl"], ["control", "rft", "rl", "rl+ptx"], ["rl+ptx"]]


def test_the_confirmation_arms_refuse_any_mode_but_fp32(bench, monkeypatch):
    monkeypatch.delenv("COA_LAB_CPU_BF16", raising=False)
    with pytest.raises(SystemExit, match="COA_LAB_CPU_BF16=0"):
        bench.fp32_only()  # unset: the draw would decide, and a bf16 draw would autocast
    monkeypatch.setenv("COA_LAB_CPU_BF16", "1")
    with pytest.raises(SystemExit, match="COA_LAB_CPU_BF16=0"):
        bench.fp32_only()
    monkeypatch.setenv("COA_LAB_CPU_BF16", "0")
    bench.fp32_only()


def test_published_differences_read_one_way_whichever_arm_the_last_call_ran(bench):
    """`coa-lab arms --arms rft` alone names the rl/control pair control_minus_rl (its call's order); the
    published file keeps rl_minus_control, the same figures turned round, as a call of `--arms rl` writes them."""
    from coa_lab.rl_arms import table
    committed = Path(bench.__file__).parent / "state" / "rl_effect" / "confirm"  # the confirmation's real outcomes
    sft, runs = table.load_scores(committed)
    runs = {arm: {0: by_seed[0]} for arm, by_seed in runs.items() if arm in ("control", "rft", "rl")}
    by_rl = bench._diffs(table.build(sft, runs, ["rl"], "rft", 4, resamples=2000))
    by_rft = bench._diffs(table.build(sft, runs, ["rft"], "rft", 4, resamples=2000))
    assert "control_minus_rl" in table.build(sft, runs, ["rft"], "rft", 4, resamples=10)  # what the call writes
    assert set(by_rl) == set(by_rft) == {"rl_minus_rft", "rl_minus_control", "control_minus_rft"}
    for m in ("greedy", "avg_at_4"):
        a, b = by_rl["rl_minus_control"][m], by_rft["rl_minus_control"][m]
        assert a["gains"] == pytest.approx(b["gains"]) and a["mean"] == pytest.approx(b["mean"])
        assert (a["won"], a["lost"]) == (b["won"], b["lost"]) and a["won"] != a["lost"]
        assert a["ci95"] == pytest.approx(b["ci95"], abs=0.006)  # the same bootstrap, mirrored


def test_resummarize_gives_the_committed_tables_and_the_published_file_from_the_committed_outcomes(
        bench, tmp_path, monkeypatch):
    """Every published interval is coa_lab/comparison.py's of the committed per-task outcomes (the bootstrap
    over seeds and tasks): the state's tables recomputed with no model are the committed ones, and what
    publish writes from them is docs/results/rl_effect.json's."""
    committed = Path(bench.__file__).parent / "state" / "rl_effect"
    shutil.copytree(committed, bench.STATE, ignore=shutil.ignore_patterns("adapter", "distill"))
    saved = {}
    monkeypatch.setattr(bench, "save", lambda name, result: saved.update(result))
    monkeypatch.setattr(bench, "machine_peak", lambda: {"cores": 2})
    bench.resummarize()
    for f in committed.rglob("*.json"):
        if (bench.STATE / f.relative_to(committed)).exists():
            assert json.loads((bench.STATE / f.relative_to(committed)).read_text()) == json.loads(f.read_text()), f
    published = json.loads((REPO / "docs" / "results" / "rl_effect.json").read_text())
    for key in ("val", "confirm", "sweep", "step1", "start", "confirm_start", "target", "intervals", "paths"):
        assert saved[key] == published[key], key
    assert "seeds and tasks" in published["intervals"]
