"""The `coa-lab arms` command's flow: check everything, read SFT, train and read each missing
(arm, seed) or read the given adapters, then write OUT/arms.json and print the table."""

from __future__ import annotations

import json
import time
from pathlib import Path

from coa_lab import pipeline
from coa_lab.generation.models import numeric_mode
from coa_lab.paths import from_portable, portable_path
from coa_lab.rl.pool import headroom
from coa_lab.rl_arms import readout, runner, spec, table


def _arms(args) -> dict[str, dict]:
    # default: the recipe (the policy gradient alone) against more SFT
    names = [a for group in (args.arm or []) for a in group] or ["control", "rl"]
    arms = dict(spec.parse_arm(a) for a in names)
    if len(arms) != len(names):
        raise SystemExit("coa-lab arms: an arm name is given twice")
    return arms


def _paths(args) -> tuple[Path, Path]:
    """(OUT, the start adapter): --out / --start, else RUN/arms and RUN/sft/adapter."""
    if args.run is None and (args.out is None or (args.start is None and not args.table_only)):
        raise SystemExit("coa-lab arms: give --run RUN (or --out DIR and --start ADAPTER)")
    out = args.out or args.run / "arms"
    start = args.start or (args.run / "sft" / "adapter" if args.run else None)
    return out, start


def main(args) -> int:
    out, start = _paths(args)
    if args.table_only:  # no model: the table again from the stored outcomes
        return _finish(args, out, json.loads((out / "settings.json").read_text()), t0=time.time(), start=None)
    if args.split == "confirm" and not args.final:
        raise SystemExit("coa-lab arms: the confirmation split is read only for a final recipe, and each reading "
                         "is recorded: pass --final to read it")
    if args.samples < 0:
        raise SystemExit("coa-lab arms: --samples is K >= 0 (0: greedy only)")
    if not (start / "adapter_config.json").exists():
        raise SystemExit(f"coa-lab arms: {start} is not a LoRA adapter folder (no adapter_config.json): "
                         f"the arms start from an SFT adapter (coa-lab sft --run RUN)")
    base = runner.base_preset(args)
    if args.readout_only:
        todo = {k: Path(v) for k, v in spec.parse_adapters(args.adapters or []).items()}
        if not todo:
            raise SystemExit("coa-lab arms: --readout-only reads the adapters given with --adapters NAME[@SEED]=DIR")
        for (name, seed), path in todo.items():
            if not (path / "adapter_config.json").exists():
                raise SystemExit(f"coa-lab arms: {name}@{seed}: {path} is not a LoRA adapter folder")
        arms = {}
    else:
        if args.adapters:
            raise SystemExit("coa-lab arms: --adapters is for --readout-only (it trains nothing)")
        arms = _arms(args)
        spec.check_arms(base, arms)
    kept = start.resolve().parent.parent / "distill" / "kept.jsonl"
    if any(spec.arm_preset(base, n, o).rl.sft_coef > 0 for n, o in arms.items()) and not kept.exists():
        raise SystemExit(f"coa-lab arms: {kept} is missing: an arm with rl.sft_coef > 0 mixes the adapter's SFT "
                         f"trajectories into its updates, read from beside it (RUN/sft/adapter -> RUN/distill)")
    mix, groups = readout.task_groups(base, args.split)
    settings = {"split": args.split, "mix": mix, "samples": args.samples, "temperature": base.rl.temperature,
                "greedy_temperature": base.eval.temperature, "start": portable_path(start.resolve()),
                "model": base.model.name, "preset": base.name, "numerics": numeric_mode(base.model)}
    runner._check_settings(out, settings)
    if args.split == "confirm":
        runner.record_reading(args, mix, base.name, list(arms) or [f"{n}@{s}" for n, s in todo])
    t0 = time.time()

    tools = pipeline.make_tools(base)
    read = lambda path, label: readout.read_adapter(base, path, groups, tools, args.samples, label)  # noqa: E731
    sft_file = out / "scores" / "sft.json"
    if not sft_file.exists():
        readout.write_atomic(sft_file, {"arm": "sft", **read(start, "sft")})
    if args.readout_only:
        _read_given(out, todo, read)
    else:
        _train_and_read(args, base, out, start, kept, arms, read, lambda: _finish(args, out, settings, t0, start))
    return _finish(args, out, settings, t0, start, show=True)


def _read_given(out: Path, todo: dict, read) -> None:
    """--readout-only: each adapter read once (its scores file kept), nothing trained."""
    for (name, seed), path in todo.items():
        f = out / "scores" / f"{name}_seed{seed}.json"
        if f.exists():
            done = json.loads(f.read_text())
            if from_portable(done["adapter"]).resolve() != path.resolve():
                raise SystemExit(f"coa-lab arms: {name}@{seed} was read from {done['adapter']}; delete {f} to read {path}")
            continue
        readout.write_atomic(f, {"arm": name, "seed": seed, "overrides": None, **read(path, f"{name}@{seed}")})
        print(f"read {name}@{seed} ({path})")


def _start_screening(base, start: Path) -> Path | None:
    """RUN/rl/pool.json when it is the start's own screening of the candidates these arms draw:
    the start is RUN/sft/adapter (an arm's adapter as the start holds its own start's screening,
    another policy's) and rl.pool draws the same questions. Else None: the first arm screens anew."""
    shared = start.resolve().parent.parent / "rl" / "pool.json"
    if start.resolve().parent.name != "sft" or not shared.exists():
        return None
    candidates = pipeline.draw_tasks(base, base.rl.pool, "train", skip=base.capture.tasks)
    return shared if set(json.loads(shared.read_text())["pass_rates"]) == {t.id for t in candidates} else None


def _train_and_read(args, base, out: Path, start: Path, kept: Path, arms: dict, read, checkpoint) -> None:
    """Seed by seed, arm by arm: train what has no scores file, read it, rewrite the table."""
    pool = out / "pool.json"
    shared = _start_screening(base, start)
    if not pool.exists() and shared is not None:  # the start run's own screening: every arm trains on it
        pool.parent.mkdir(parents=True, exist_ok=True)
        pool.write_bytes(shared.read_bytes())
    for seed in args.seeds:
        for name, overrides in arms.items():
            f = out / "scores" / f"{name}_seed{seed}.json"
            if f.exists():
                if json.loads(f.read_text()).get("overrides") != json.loads(json.dumps(overrides)):
                    raise SystemExit(f"coa-lab arms: {f} holds arm {name!r} with other settings; give another "
                                     f"--out, or delete it to run the arm as now defined")
                continue
            preset = spec.arm_preset(base, name, overrides, seed)
            run = out / "runs" / name / f"seed{seed}"
            t1 = time.time()
            summary, how = runner.train_arm(preset, run, start, kept, pool)
            metrics = summary["metrics"]
            entry = {"arm": name, "seed": seed, "overrides": overrides, "how": how,
                     "rl_seconds": round(time.time() - t1, 1),
                     "train_accuracy_by_step": [m.get("accuracy") for m in metrics],
                     **read(run / "rl" / "adapter", f"{name}@{seed}")}
            readout.write_atomic(f, entry)
            print(f"{name} seed {seed} ({how}): greedy {sum(entry['greedy'].values()) / len(entry['greedy']):.3f}")
            checkpoint()


def _finish(args, out: Path, settings: dict, t0: float, start: Path | None, show: bool = False) -> int:
    """OUT/arms.json from every stored outcome; the table printed at the end."""
    sft, runs = table.load_scores(out)
    old = out / "arms.json"
    # The arms in the order the first call named them, then any new ones: a pair keeps one name (rl_minus_control)
    # however later calls, resuming one arm at a time, order their --arm.
    order = list(json.loads(old.read_text())["arms"]) if old.exists() else []
    given = [n for group in (getattr(args, "arm", None) or []) for n in (spec.parse_arm(a)[0] for a in group)]
    order += [n for n in given if n not in order]
    result = {"split": settings["split"], "mix": settings["mix"], "samples": settings["samples"],
              "temperature": settings["temperature"], "preset": settings.get("preset"), "overrides": args.set,
              **table.build(sft, runs, order, args.against, settings["samples"], args.resamples)}
    start_info = runner._start_info(start) if start else json.loads(old.read_text()).get("start") if old.exists() else None
    result = {**result, "start": start_info, "seconds": round(time.time() - t0, 1)}
    if (out / "pool.json").exists():
        result["pool_headroom"] = headroom(json.loads((out / "pool.json").read_text()))
    readout.write_atomic(old, result)
    if show or args.table_only:
        print(table.render(result))
        print(f"wrote {old}")
    return 0
