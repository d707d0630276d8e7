"""RL's own effect, measured from a converged start: `coa-lab arms` driven through the steps of the
measurement, each resumable (every step keeps its outcomes on disk and skips what is done).

Run (RUN holds distill/ and sft/adapter, e.g. the demo's run folder or bench_rl_seeds' SFT):
    python -m benchmarks.bench_rl_effect converge --run RUN      # 1. SFT extended until it stops rising
    python -m benchmarks.bench_rl_effect sweep --run RUN         # 2. the policy gradient's rate, one seed
    python -m benchmarks.bench_rl_effect arms --run RUN --seeds 0 1 2 3 4   # 3. control, rft, rl, rl+ptx
    python -m benchmarks.bench_rl_effect arms --run RUN --seeds 0 1 2 3 4 --split confirm --final  # control rft rl
    python -m benchmarks.bench_rl_effect save-state --run RUN    # outcomes -> benchmarks/state/rl_effect
    python -m benchmarks.bench_rl_effect publish                 # docs/results/rl_effect.json, from the state
    python -m benchmarks.bench_rl_effect resummarize             # the state's tables recomputed, then publish

Across sessions: `save-state` copies every stored outcome (scores, pools, tables; no weights) into
benchmarks/state/rl_effect/, committed. A later session on another machine runs `converge` again
(the start is rebuilt from the shipped capture: SFT, then the control's steps); `sweep` and `arms`
then restore the saved outcomes into RUN/effect only when the rebuilt start's weights hash to the
saved start's sha256 (the same adapter, so the outcomes pair), and otherwise start over from it.
A rebuild matches only on the same kind of machine in the same numeric mode: validation's start
(bf16 autocast) was lost with its machine before seed 4 of three arms had run. The confirmation
split is therefore read from its own start, rebuilt by the same protocol (converge) in fp32, which
every draw has, and kept WITH its weights (benchmarks/state/rl_effect/confirm_start/, ~20 MB):
`arms --split confirm` on a fresh RUN restores that adapter instead of rebuilding it, so the arms of
any later session pair with those of the first. Validation's settings, pool and budget still hold.
Paths in the state and the published file are relative to the working folder the measurement ran from
(the checkout whose runs/ holds RUN: runs/r57 for validation, runs/r58 for the confirmation), never
absolute. `resummarize` recomputes every saved table from its per-task outcomes (no model), as a change
to coa_lab/comparison.py's intervals needs.

1. converge: the control arm (the SFT loss alone, RL's steps and rows, nothing sampled) from the SFT
   adapter, then from its result, and so on, each read greedy on validation; the start is the first
   adapter from which one more control run adds less than `--min-gain` (1 point). Why: a student
   that is not converged gives more SFT easy points, and the arms must not be read against them.
2. sweep: the policy gradient alone (`rl`) from that start at each `--rates`, seed 0, on one pool
   screened once from ~200 candidates, read greedy and avg@4 / pass@4 at the sampling temperature.
3. arms: control (more SFT), rft (SFT on the student's own correct rollouts of the same sampler
   and pool), rl (the policy gradient alone, at the chosen rate), rl+ptx (the recipe at that rate),
   over the seeds, paired against the start and against rft. Every step trains on the sweep's pool, and on
   validation `rl` seed 0 is the sweep's run at the chosen rate (the same settings: not run twice).
   `--split confirm --final` reads the final arms (control, rft, rl; rl+ptx only with --arms) on tasks
   nobody selected on: validation's adapters where they exist (reuse_val_adapters), else trained from the
   confirmation's own saved start on validation's pool and settings.
Every arm shares BUDGET: ~1,400 rollouts a run (16 steps x 6 questions x 8 samples + 3 anchor
groups a step), one optimizer step per sampled batch, a 2-step warm-up, advantages without the
std division (Dr. GRPO: a lone success in a group of 4 was weighed +1.73 under std-normalisation).
Hours on a 2-core CPU: run each step in the background and rerun it after any interruption.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.results import save
from coa_lab.machine import machine_peak
from coa_lab.published import RESULTS_DIR
from coa_lab.paths import from_portable, portable_path, portable_text

VAL = {"math/arith": 160, "mhqa/lookup": 64}  # the arms' validation tasks (rl_arms.json's 224)
POOL = {"math/arith": 150, "mhqa/lookup": 50}  # ~200 candidates, screened once, shared by every arm
BUDGET = [f"eval.val_tasks={json.dumps(VAL)}", f"rl.pool={json.dumps(POOL)}", "rl.steps=16",
          "rl.prompts_per_step=6", "rl.group_size=8", "rl.mini_batches=1", "rl.warmup_steps=2",
          "rl.advantage=dr_grpo"]
# the converge step's control runs sample nothing: a token pool keeps their screening to seconds
CHAIN = [f"eval.val_tasks={json.dumps(VAL)}", 'rl.pool={"math/arith": 2, "mhqa/lookup": 2}', "rl.pool_samples=2"]
ALL_ARMS = ("control", "rft", "rl", "rl+ptx")
# the confirmation reads the arms its claims need: rl (the target), rft (rl − rft) and control (is it more SFT?);
# rl+ptx lost the recipe's rule on validation (rl.sft_coef 0 adopted), so it is read there only after these
FINAL_ARMS = ("control", "rft", "rl")
SFT_RATE = 1e-4  # the control's and RFT's rate: the SFT loss's, as the recipe's control ran it
STATE = Path(__file__).resolve().parent / "state" / "rl_effect"  # committed outcomes, for the next session
CONFIRM_START = "confirm_start"  # under STATE: the confirmation's own start, weights included (save_confirm_start)
READINGS = Path(__file__).resolve().parents[1] / "docs" / "results" / "confirm_readings.jsonl"  # coa_lab's record
KEPT = ("scores/*.json", "settings.json", "pool.json", "arms.json", "steps/*.jsonl", "base_preset.json",
        "trained_in.json")  # a step's outcomes, no weights
# per step of every arm's run, what the measurement needs to show: its own reward, ‖∇PG‖ beside ‖∇SFT‖, and how far the
# weights moved (‖Δθ‖) against a drift's lr·N and a random walk's lr·√N
STEP_FIELDS = ("step", "accuracy", "anchor_accuracy", "kept_groups", "sampled_groups", "revisit_reward", "loss",
               "grad_norm_pg", "grad_norm_sft", "delta_norm", "lr", "lr_x_n", "lr_x_sqrt_n", "clip_frac", "entropy")


def arms(out: Path, start: Path, arm_specs: list[str], seeds: list[int], sets: list[str], samples: int,
         split: str = "val", final: bool = False, against: str | None = None) -> dict:
    """One `coa-lab arms` call (resumes on its own); its arms.json."""
    same_base(out, sets)
    cmd = [sys.executable, "-m", "coa_lab.cli", "arms", "--out", str(out), "--start", str(start),
           "--preset", "cpu-tiny", "--split", split, "--samples", str(samples), "--seeds", *map(str, seeds),
           "--arm", *arm_specs] + [a for s in sets for a in ("--set", s)] + (["--final"] if final else []) + (["--against", against] if against else [])
    print("$", " ".join(cmd), flush=True)
    theirs = their_readings() if split == "confirm" else None
    proc = subprocess.Popen(cmd)
    while True:  # the reading is copied while the arms run: a session that ends mid-arm still has it on record
        try:
            code = proc.wait(timeout=READINGS_POLL_S)
            break
        except subprocess.TimeoutExpired:
            if theirs is not None:
                keep_readings(theirs)
    if theirs is not None:
        keep_readings(theirs)
    if code:
        raise subprocess.CalledProcessError(code, cmd)
    return json.loads((out / "arms.json").read_text())


READINGS_POLL_S = 60


def their_readings() -> Path:
    """The reading record of the coa_lab `python -m coa_lab.cli` imports from the working folder."""
    code = "from coa_lab.rl_arms.runner import READINGS; print(READINGS)"
    return Path(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip())


def keep_readings(theirs: Path) -> None:
    """Every reading of the confirmation split in THIS checkout's record (docs/results/confirm_readings.jsonl):
    `coa-lab arms` records it in the checkout it imports, which is the working folder's when the measurement
    runs from a frozen checkout of its code (a run over many sessions does)."""
    ours = READINGS
    if theirs.resolve() == ours.resolve() or not theirs.exists():
        return
    have = ours.read_text().splitlines() if ours.exists() else []
    home = theirs.resolve().parents[2]  # the checkout that made the reading: its paths, relative to it
    rows = [portable_text(row, home) for row in theirs.read_text().splitlines() if row.strip()]
    new = [row for row in rows if row not in have]
    if new:
        with ours.open("a") as fh:
            fh.write("".join(row + "\n" for row in new))
        print(f"{len(new)} confirmation reading(s) recorded in {ours} too")


MISSING = object()  # a field absent from kept settings


def base_settings(sets: list[str], cwd: Path | None = None) -> dict:
    """cpu-tiny with `sets`, resolved by the coa_lab the arms train with: `python -m coa_lab.cli` imports the
    working folder's, so a measurement run from a frozen checkout of its code is held to that code's defaults,
    not this checkout's (the recipe can be adopted here while it runs; its steps cannot move under it)."""
    code = ("import json, sys; from coa_lab.config import get_preset; from coa_lab.field_types import parse_overrides; "
            "print(json.dumps(get_preset('cpu-tiny', **parse_overrides(json.loads(sys.argv[1]))).to_dict()))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(sets)], capture_output=True, text=True, cwd=cwd)
    if done.returncode:
        raise SystemExit(f"the arms' settings did not resolve: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


def same_base(out: Path, sets: list[str]) -> None:
    """The settings every arm of a step is laid over (cpu-tiny with `sets`), resolved, kept beside its
    outcomes: a step that runs over several sessions must not pair arms trained under moved defaults
    (a default changed in the code the arms train with, see base_settings), so a difference stops it,
    naming the fields.
    The confirmation split reads validation's adapters, so it is held to validation's settings too."""
    now = base_settings(sets)
    path = out / "base_preset.json"
    val = out.parent / "val" / "base_preset.json"
    if not val.exists():  # a RUN from the confirmation's own start: validation's settings are the saved ones
        val = STATE / "val" / "base_preset.json"
    for kept in (path, val) if out.name == "confirm" else (path,):
        if not kept.exists():
            continue
        old = json.loads(kept.read_text())
        # a field the training code lacks cannot act on its arms (afb3354 predates the demo's eval.control)
        moved = sorted(f"{sec}.{k}" for sec in now if isinstance(now[sec], dict)
                       for k in now[sec] if now[sec][k] != old.get(sec, {}).get(k, MISSING))
        moved += sorted(sec for sec in now if not isinstance(now[sec], dict) and now[sec] != old.get(sec))
        if moved:
            raise SystemExit(f"{out}: its arms were trained with other base settings ({', '.join(moved)}): run this "
                             f"step with the code it started with (git log {kept}), or start it over in another RUN")
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(now, indent=1))


def converge(run: Path, min_gain: float, max_links: int) -> dict:
    """The control arm, link after link, until one more link adds < min_gain greedy."""
    base = run / "effect" / "start"
    state_file = base / "start.json"
    start, links = run / "sft" / "adapter", []
    for k in range(max_links):
        out = base / f"link{k}"
        table = arms(out, start, ["control"], [0], CHAIN, samples=0)  # the built-in: the preset's SFT mix alone
        block = table["arms"]["control"]["greedy"]
        links.append({"start": portable_path(start, Path.cwd()), **link_record(table)})
        print(f"link {k}: start {table['sft']['greedy']:.3f}, one more control run {100 * block['mean']:+.1f} "
              f"[{100 * block['ci95'][0]:+.1f}, {100 * block['ci95'][1]:+.1f}]", flush=True)
        if block["mean"] < min_gain:
            break
        start = out / "runs" / "control" / "seed0" / "rl" / "adapter"
    state = {"start": portable_path(start, Path.cwd()), "converged": links[-1]["gain"] < min_gain, "min_gain": min_gain,
             "rule": "the first adapter from which one more control run (rl.pg_coef=0: the SFT loss on 8 rows "
                     "a step, 8 steps x 2 mini-batches at lr 1e-4) adds less than min_gain greedy on validation",
             "links": links}
    state_file.write_text(json.dumps(state, indent=1))
    return state


def link_record(table: dict) -> dict:
    """What the start's record keeps of one link's arms.json: the start's greedy, one more control run's gain."""
    block = table["arms"]["control"]["greedy"]
    return {"start_greedy": table["sft"]["greedy"], "gain": block["mean"], "ci95": block["ci95"],
            "won": block["won"][0], "lost": block["lost"][0]}


def _start(run: Path) -> Path:
    state = run / "effect" / "start" / "start.json"
    if not state.exists():
        raise SystemExit(f"{state} is missing: run `converge` first")
    return from_portable(json.loads(state.read_text())["start"], Path.cwd())


def sha256(adapter: Path) -> str:
    return hashlib.sha256((adapter / "adapter_model.safetensors").read_bytes()).hexdigest()


def step_logs(step_dir: Path) -> None:
    """Each arm run's rl/metrics.jsonl, cut to STEP_FIELDS, as step_dir/steps/<arm>_seed<k>.jsonl: an outcome
    that outlives the run folders (which hold weights and are not kept)."""
    for metrics in sorted(step_dir.glob("runs/*/seed*/rl/metrics.jsonl")):
        seed_dir = metrics.parent.parent
        if not (step_dir / "scores" / f"{seed_dir.parent.name}_{seed_dir.name}.json").exists():
            continue  # a run still going (or killed): its log is kept once its adapter is read
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        out = step_dir / "steps" / f"{seed_dir.parent.name}_{seed_dir.name}.jsonl"
        out.parent.mkdir(exist_ok=True)
        out.write_text("".join(json.dumps({k: r[k] for k in STEP_FIELDS if k in r}) + "\n" for r in rows))


def _copy_outcomes(src: Path, dst: Path, patterns: tuple[str, ...]) -> None:
    """The files under src matching `patterns` (outcomes), outside any runs/ folder (weights), into dst; the
    paths they hold relative to the working folder (portable_text): the state is committed and read elsewhere."""
    for pattern in patterns:
        for f in src.rglob(pattern.split("/")[-1]):
            rel = f.relative_to(src)
            if "runs" in rel.parts or not f.match(pattern):
                continue
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            (dst / rel).write_text(portable_text(f.read_text(), Path.cwd()))


def save_state(run: Path) -> None:
    """Every outcome under RUN/effect (no weights) into STATE, with the start's sha256; a run from the
    confirmation's own start (not validation's) keeps that start, weights included (save_confirm_start)."""
    effect = run / "effect"
    for step_dir in effect.iterdir():
        if step_dir.is_dir():
            step_logs(step_dir)
    kept = STATE / "start_sha256"
    if kept.exists() and kept.read_text().strip() != sha256(_start(run)):
        return save_confirm_start(run)
    _copy_outcomes(effect, STATE, KEPT + ("start/start.json",))
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(sha256(_start(run)) + "\n")
    print(f"saved the outcomes under {effect} to {STATE}")


def save_confirm_start(run: Path) -> None:
    """A run from another start than validation's: its start (converge record, adapter weights, the SFT
    trajectories rl.sft_coef mixes in) into STATE/confirm_start, its confirmation outcomes into STATE/confirm.
    Why the weights: a rebuild matches bit for bit only on the same kind of machine and numeric mode, and
    the confirmation's arms, read over many sessions on whatever draw comes, must pair with one start."""
    effect, saved = run / "effect", STATE / CONFIRM_START
    start = _start(run)
    if (saved / "sha256").exists() and (saved / "sha256").read_text().strip() != sha256(start):
        raise SystemExit(f"{saved} holds another start (sha256 {(saved / 'sha256').read_text()[:12]}): this run's "
                         f"outcomes would not pair with the saved ones; restore that start (arms --split confirm)")
    others = sorted(d.name for d in effect.iterdir() if d.is_dir() and d.name not in ("start", "confirm"))
    if others:
        print(f"not saved: {', '.join(others)} (validation's steps belong to validation's start; this run's "
              f"start is another)")
    restored = "restored_from" in json.loads((effect / "start" / "start.json").read_text())
    _copy_outcomes(effect / "start", saved, KEPT + (() if restored else ("start.json",)))
    (saved / "adapter").mkdir(parents=True, exist_ok=True)
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        shutil.copy(start / name, saved / "adapter" / name)
    home = start.resolve().parent.parent  # the start's run folder: the trajectories beside it, its settings
    for name in ("distill/kept.jsonl", "preset.json"):
        if (home / name).exists():
            (saved / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(home / name, saved / name)
    (saved / "sha256").write_text(sha256(start) + "\n")
    if (effect / "confirm").exists():
        _copy_outcomes(effect / "confirm", STATE / "confirm", KEPT)
    print(f"saved the confirmation's start (weights included) to {saved}, its outcomes to {STATE / 'confirm'}")


def restore_confirm_start(run: Path) -> None:
    """The saved confirmation start into a fresh RUN (effect/start/saved/rl/adapter, its trajectories at
    saved/distill/kept.jsonl where `coa-lab arms` looks beside an adapter), instead of rebuilding one."""
    saved, state = STATE / CONFIRM_START, run / "effect" / "start" / "start.json"
    if state.exists() or not (saved / "adapter" / "adapter_model.safetensors").exists():
        return
    home = run / "effect" / "start" / "saved"
    shutil.copytree(saved / "adapter", home / "rl" / "adapter")
    for name in ("distill/kept.jsonl", "preset.json"):
        if (saved / name).exists():
            (home / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(saved / name, home / name)
    record = json.loads((saved / "start.json").read_text())
    record.update(start=portable_path(home / "rl" / "adapter", Path.cwd()), restored_from=portable_path(saved))
    state.write_text(json.dumps(record, indent=1))
    print(f"the confirmation's start restored from {saved} (sha256 {sha256(home / 'rl' / 'adapter')[:12]})")


def fp32_only() -> None:
    """The confirmation's own start and arms run in fp32 on every draw (its arms pair only within one numeric
    mode, and the `coa-lab arms` of validation's frozen code does not record the mode): COA_LAB_CPU_BF16=0."""
    if os.environ.get("COA_LAB_CPU_BF16") != "0":
        raise SystemExit("the confirmation split's arms run in fp32 on every draw: set COA_LAB_CPU_BF16=0 "
                         "(docs/rl-effect.md, step 5)")


def restore(run: Path, step: str) -> None:
    """Saved outcomes of `step` (sweep, val, confirm) into RUN/effect/<step>, when the start is the same adapter."""
    saved, out = STATE / step, run / "effect" / step
    if not saved.exists() or out.exists():
        return
    sha = STATE / CONFIRM_START / "sha256"
    want = (sha if step == "confirm" and sha.exists() else STATE / "start_sha256").read_text().strip()
    if sha256(_start(run)) != want:
        print(f"the rebuilt start is not the saved one (sha256 {want[:12]}): {step} starts over from it")
        return
    shutil.copytree(saved, out)
    settings = out / "settings.json"  # the same adapter at this machine's path: its outcomes pair
    if settings.exists():
        settings.write_text(json.dumps({**json.loads(settings.read_text()), "start": str(_start(run).resolve())}, indent=1))
    print(f"restored {step}'s saved outcomes from {saved}")


def from_sweep(run: Path, split: str, rate: float) -> None:
    """A new arms step starts from what the sweep already measured with the same settings: its pool (every
    arm and seed trains on ONE screening), and on validation its reading of the start and its seed-0 run at
    the chosen rate, which is the `rl` arm's seed 0 (same start, budget, pool, seed and overrides).
    Why: a screening is ~730 rollouts and a run ~50 minutes; redoing them would re-measure the same thing."""
    sweep, out = run / "effect" / "sweep", run / "effect" / split
    pool = sweep / "pool.json"
    if not pool.exists() and split == "confirm":  # the confirmation's own start trains on the same screening
        pool = STATE / "val" / "pool.json"
    if not pool.exists():
        return
    (out / "scores").mkdir(parents=True, exist_ok=True)
    if not (out / "pool.json").exists():
        shutil.copy(pool, out / "pool.json")
    if split != "val":
        return
    name = f"rl_lr{rate:g}"
    for src, dst in ((sweep / "settings.json", out / "settings.json"),
                     (sweep / "scores" / "sft.json", out / "scores" / "sft.json"),
                     (sweep / "steps" / f"{name}_seed0.jsonl", out / "steps" / "rl_seed0.jsonl")):
        if src.exists() and not dst.exists():
            dst.parent.mkdir(exist_ok=True)
            shutil.copy(src, dst)
    score, dst = sweep / "scores" / f"{name}_seed0.json", out / "scores" / "rl_seed0.json"
    if score.exists() and not dst.exists():
        dst.write_text(json.dumps({**json.loads(score.read_text()), "arm": "rl", "from": f"sweep/{name}_seed0"}))
        print(f"rl seed 0 is the sweep's {name} run (same settings); the pool and the start's reading are the sweep's")


def reuse_val_adapters(run: Path, rate: float, arm_names: list[str], seeds: list[int]) -> dict:
    """The confirmation split reads the adapters validation trained: each finished (arm, seed) run folder
    of effect/val (rl seed 0: the sweep's run at the chosen rate) is linked into effect/confirm/runs, where
    `coa-lab arms` finds it finished and only reads it; an (arm, seed) validation has not finished is
    trained there. Why: an adapter is trained on the pool, never on a split, so training it again would
    draw another sample of the same arm at ~30 minutes a run, and the final arms are these.
    Returns (and keeps in trained_in.json) where each linked run was trained."""
    effect, done = run / "effect", {}
    for arm in arm_names:
        for seed in seeds:
            src = effect / "val" / "runs" / arm / f"seed{seed}"
            if arm == "rl" and seed == 0 and not src.exists():
                src = effect / "sweep" / "runs" / f"rl_lr{rate:g}" / f"seed{seed}"
            if not ((src / "rl" / "summary.json").exists() and (src / "rl" / "adapter" / "adapter_config.json").exists()):
                continue
            dst = effect / "confirm" / "runs" / arm / f"seed{seed}"
            if not dst.is_symlink():
                shutil.rmtree(dst, ignore_errors=True)  # a half-trained confirm run: validation's is finished
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.symlink_to(src.resolve())
            done[f"{arm}@{seed}"] = str(src.relative_to(effect))
    if done:
        (effect / "confirm" / "trained_in.json").write_text(json.dumps(done, indent=1))
    return done


def rl_arm(name: str, rate: float, ptx: bool = False) -> str:
    return f"{name}=rl.learning_rate={rate},rl.sft_coef={1.0 if ptx else 0.0}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["converge", "sweep", "arms", "publish", "save-state", "resummarize"])
    ap.add_argument("--run", type=Path, help="the run folder (every step but publish, which reads the saved state)")
    ap.add_argument("--min-gain", type=float, default=0.01)
    ap.add_argument("--max-links", type=int, default=5)
    ap.add_argument("--rates", type=float, nargs="+", default=[1e-5, 2e-5, 5e-5])
    ap.add_argument("--rate", type=float, default=None, help="arms: the policy gradient's rate (from sweep)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--split", default="val", choices=["val", "confirm"])
    ap.add_argument("--final", action="store_true")
    ap.add_argument("--arms", nargs="+", choices=ALL_ARMS, default=None,
                    help=f"arms: which to run (default: all four on val, the final ones on confirm: "
                         f"{' '.join(FINAL_ARMS)})")
    args = ap.parse_args(argv)
    if args.run is None and args.step not in ("publish", "resummarize"):
        ap.error(f"{args.step} needs --run RUN")
    if args.step == "converge":
        converge(args.run, args.min_gain, args.max_links)
    elif args.step == "save-state":
        save_state(args.run)
    elif args.step == "sweep":
        restore(args.run, "sweep")
        arms(args.run / "effect" / "sweep", _start(args.run), [rl_arm(f"rl_lr{r:g}", r) for r in args.rates],
             [0], BUDGET, samples=4)
    elif args.step == "arms":
        if args.rate is None:
            raise SystemExit("give --rate: the policy gradient's rate the sweep chose on validation")
        if args.split == "confirm":
            fp32_only()
            restore_confirm_start(args.run)
        restore(args.run, args.split)
        from_sweep(args.run, args.split, args.rate)
        specs = [f"control=rl.pg_coef=0,rl.sft_coef=1.0,rl.learning_rate={SFT_RATE}",
                 f"rft=rl.advantage=rft,rl.sft_coef=0.0,rl.learning_rate={SFT_RATE}",
                 rl_arm("rl", args.rate), rl_arm("rl+ptx", args.rate, ptx=True)]
        chosen = args.arms or (FINAL_ARMS if args.split == "confirm" else ALL_ARMS)
        specs = [s for s in specs if s.split("=", 1)[0] in chosen]
        if args.split == "confirm":
            reuse_val_adapters(args.run, args.rate, [s.split("=", 1)[0] for s in specs], args.seeds)
        arms(args.run / "effect" / args.split, _start(args.run), specs, args.seeds, BUDGET, samples=4,
             split=args.split, final=args.final, against="rft")
    elif args.step == "resummarize":
        resummarize()
    else:
        publish()
    return 0


def _arm_block(row: dict, step_dir: Path | None = None, arm: str = "") -> dict:
    keep = ("gains", "paired_se", "mean", "ci95", "won", "lost")
    block = {"seeds": row["seeds"], "overrides": row.get("overrides"), "by_family": row.get("by_family"),
             **{m: {k: row[m][k] for k in keep} for m in ("greedy", "avg_at_4", "pass_at_4") if m in row}}
    if step_dir is not None:  # the runs' per-step logs, by seed (step_logs)
        logs = {f"seed{s}": step_dir / "steps" / f"{arm}_seed{s}.jsonl" for s in row["seeds"]}
        block["steps"] = {seed: [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
                          for seed, f in logs.items() if f.exists()}
        block["step_summary"] = {seed: step_summary(rows) for seed, rows in block["steps"].items() if rows}
    return block


# the differences the docs quote, in one direction: `coa-lab arms` names a pair by the order of the call that wrote
# arms.json (a run of `--arms rft` alone writes control_minus_rl), so the other direction is turned round
ORIENTED = ("rl_minus_rft", "rl_minus_control", "control_minus_rft")
DIFF_FIELDS = ("gains", "paired_se", "mean", "ci95", "won", "lost")


def _diffs(table: dict) -> dict:
    """Every arm − arm block of an arms.json (rl_minus_rft, rl_lr2e_05_minus_rl_lr1e_05, ...), seed by seed."""
    out = {}
    for name, diff in table.items():
        if "_minus_" not in name or not isinstance(diff, dict):
            continue
        a, b = name.split("_minus_", 1)
        turn = f"{b}_minus_{a}" in ORIENTED
        out[f"{b}_minus_{a}" if turn else name] = {
            "seeds": diff["seeds"], **{m: (_turned if turn else dict)({k: diff[m][k] for k in DIFF_FIELDS})
                                      for m in table["metrics"]}}
    return out


def _turned(block: dict) -> dict:
    """b − a from a − b: the gains and interval negated (the bootstrap's percentiles mirror), won and lost swapped."""
    return {"gains": [-g for g in block["gains"]], "paired_se": block["paired_se"], "mean": -block["mean"],
            "ci95": [-block["ci95"][1], -block["ci95"][0]], "won": block["lost"], "lost": block["won"]}


def step_summary(rows: list[dict]) -> dict:
    """A run's log in the few numbers the docs quote: its own reward, ‖∇PG‖ and entropy over the first
    and second half of its steps; ‖Δθ‖'s growth from the first step that moved to the last, beside the
    growth of lr·N (a steady drift would match it) and of lr·√N (a random walk would)."""
    half = len(rows) // 2

    def halves(key: str) -> list[float | None]:
        parts = [[r[key] for r in rows[:half] if r.get(key) is not None],
                 [r[key] for r in rows[half:] if r.get(key) is not None]]
        return [sum(p) / len(p) if p else None for p in parts]

    moved = [r for r in rows if r.get("delta_norm")]
    growth = {k: moved[-1][k] / moved[0][k] for k in ("delta_norm", "lr_x_n", "lr_x_sqrt_n")
              if len(moved) > 1 and moved[0].get(k)}
    return {"halves": {k: halves(k) for k in ("accuracy", "grad_norm_pg", "grad_norm_sft", "entropy")},
            "growth": growth, "from_step": moved[0]["step"] if moved else None,
            "to_step": moved[-1]["step"] if moved else None}


def pool_summary(pool_json: Path) -> dict | None:
    """What the shared screening kept: candidates, samples each, rollouts spent, kept, and the pass-count histogram."""
    if not pool_json.exists():
        return None
    p = json.loads(pool_json.read_text())
    return {k: p[k] for k in ("candidates", "samples", "rollouts", "kept", "histogram") if k in p}


PATHS = "relative to the working folder the measurement ran from (its runs/ holds RUN)"
INTERVALS = ("ci95: 95% percentile bootstrap over seeds and tasks (coa_lab.comparison.bootstrap_seeds_tasks): "
             "the tasks drawn once for every seed and side, each side's seeds drawn on their own; "
             "with one seed, over tasks alone")


def resummarize(state: Path | None = None) -> None:
    """Every saved table (each arms.json under STATE) computed again from its stored per-task outcomes
    (scores/*.json) by the code `coa-lab arms` writes it with (coa_lab.rl_arms.table.build: the intervals of
    coa_lab/comparison.py), the converged starts' records from their links' tables, then publish: what a
    change to the statistics does to the published figures, with no model and no training. A table's
    other fields (settings, start, seconds) are kept."""
    from coa_lab.rl_arms import table
    from coa_lab.rl_arms.readout import write_atomic

    state = state or STATE
    for f in sorted(state.rglob("arms.json")):
        if not (f.parent / "scores" / "sft.json").exists():
            continue
        old = json.loads(f.read_text())
        sft, runs = table.load_scores(f.parent)
        new = table.build(sft, runs, list(old["arms"]), old.get("against"), old["samples"])
        merged = {k: new.get(k, old[k]) for k in old if k in new or "_minus_" not in k}
        write_atomic(f, {**merged, **{k: v for k, v in new.items() if k not in merged}})
        print(f"{f.relative_to(state)}: recomputed from {len(runs)} arm(s)' outcomes")
    for record in (state / "start" / "start.json", state / CONFIRM_START / "start.json"):
        if not record.exists():
            continue
        start = json.loads(record.read_text())
        for k, link in enumerate(start.get("links", [])):
            link_table = record.parent / f"link{k}" / "arms.json"
            if link_table.exists():
                link.update(link_record(json.loads(link_table.read_text())))
        record.write_text(json.dumps(start, indent=1))
    # the outcomes were measured on the machine the published file names: no model ran here
    published = RESULTS_DIR / "rl_effect.json"
    publish(state, machine=json.loads(published.read_text()).get("machine") if published.exists() else None)


def publish(state: Path | None = None, machine: dict | None = None) -> None:
    """docs/results/rl_effect.json from the saved outcomes (STATE, see save_state): validation, and the
    confirmation split as far as it has been read, from its own start where it has one."""
    state = state or STATE
    start = json.loads((state / "start" / "start.json").read_text())
    sweep = state / "sweep" / "arms.json"
    out: dict = {"start": start, "budget": BUDGET, "sft_rate": SFT_RATE, "paths": PATHS,
                 "intervals": INTERVALS}
    own = state / CONFIRM_START / "start.json"
    if own.exists():  # the confirmation's own start (save_confirm_start says why), as `converge` made it
        out["confirm_start"] = {**json.loads(own.read_text()), "sha256": (own.parent / "sha256").read_text().strip()}
    step1 = state / "step1" / "arms.json"
    if step1.exists():  # the sampled readout beside greedy, at the SFT adapter, with the old recipe's control
        s1 = json.loads(step1.read_text())
        out["step1"] = {"split": s1["split"], "tasks": s1["tasks"], "start": "RUN/sft/adapter",
                        "sft": {m: s1["sft"][m] for m in s1["metrics"]}, "sft_by_family": s1["sft"]["by_family"],
                        "arms": {a: _arm_block(r) for a, r in s1["arms"].items()}}
    if sweep.exists():
        s = json.loads(sweep.read_text())
        out["sweep"] = {"split": s["split"], "tasks": s["tasks"], "pool": pool_summary(sweep.parent / "pool.json"),
                        "sft": {m: s["sft"][m] for m in s["metrics"]},
                        "sft_by_family": s["sft"]["by_family"],
                        "arms": {a: _arm_block(r, sweep.parent, a) for a, r in s["arms"].items()}, **_diffs(s)}
    for split in ("val", "confirm"):
        f = state / split / "arms.json"
        if not f.exists():
            continue
        t = json.loads(f.read_text())
        block = {"split": split, "tasks": t["tasks"], "task_ids": t["task_ids"], "seeds": t["seeds"],
                 "sft": {m: t["sft"][m] for m in t["metrics"]},
                 "arms": {a: _arm_block(r, f.parent, a) for a, r in t["arms"].items()}, **_diffs(t)}
        if split == "confirm" and "confirm_start" in out:  # read from its own start
            block["start"] = out["confirm_start"]
        out[split] = {**block, "target": target(block)}
    confirm = out.get("confirm")
    out["complete"] = bool(confirm) and all(len(confirm["arms"].get(a, {}).get("seeds", [])) >= TARGET_SEEDS
                                            for a in FINAL_ARMS)
    final = confirm if out["complete"] else out.get("val")
    if final:  # the top-level fields: the confirmation split's arms once all read, validation's until then
        out.update({k: final[k] for k in ("split", "tasks", "seeds", "arms", "rl_minus_rft", "target") if k in final})
    save("rl_effect", {**out, "machine": machine or machine_peak()})


TARGET = {"greedy": 0.03, "avg_at_4": 0.05}  # the target for the policy gradient's own effect, rl − the start
TARGET_SEEDS = 5


def target(block: dict) -> dict:
    """Whether `rl` − the start reaches the target on this block: +3 points greedy or +5 avg@4 at the
    sampling temperature, mean of 5 seeds, with the 95% interval above zero (met on the confirmation split
    only: validation chose the settings)."""
    rl = block["arms"].get("rl")
    if rl is None:
        return {"met": False, "why": "no rl arm read"}
    each = {m: {"mean": rl[m]["mean"], "ci95": rl[m]["ci95"], "need": need,
                "reached": rl[m]["mean"] >= need and rl[m]["ci95"][0] > 0}
            for m, need in TARGET.items() if m in rl}
    seeds = len(rl["seeds"])
    met = seeds >= TARGET_SEEDS and any(e["reached"] for e in each.values())
    return {"met": met and block["split"] == "confirm", "seeds": seeds, "split": block["split"], **each}


if __name__ == "__main__":
    raise SystemExit(main())
