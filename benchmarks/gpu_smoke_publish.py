"""Turn what benchmarks/gpu_smoke.sh brought back from a GPU machine into docs/results/<name>.json.

Run:  python -m benchmarks.gpu_smoke_publish RUN_DIR --gpu "NVIDIA H100 80GB HBM3" --date 2026-11-27 \
          --commit 5dcb108 --versions "torch 2.11.0+cu130, transformers 5.17.0, peft 0.21.2" \
          [--stage-seconds pool_screening=279] [--note "..."] [--name gpu_smoke_h100]

RUN_DIR is the unpacked run folder (gpu_smoke.tar.gz). Every figure is read from the run's own
files (capture/distill/sft summaries, rl/pool.json, rl/metrics.jsonl, eval/summary.json); a
stage the machine's time did not reach is listed under `not_reached`, never filled in.
`--stage-seconds` takes a time read off the run's log where the stage wrote no summary (a stage
cut off by the time limit writes none).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from coa_lab.published import publish
from coa_lab.rl.pool import headroom


def _read(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def summarize(run: Path) -> dict:
    out: dict = {"stages": {}, "not_reached": []}
    capture = _read(run / "capture" / "summary.json")
    if capture:
        out["stages"]["capture"] = {"seconds": capture["seconds"], "runs": capture["runs"],
                                    "teacher_accuracy": {k: v["accuracy"] for k, v in capture["success"].items()}}
    distill = _read(run / "distill" / "summary.json")
    if distill:
        out["stages"]["distill"] = {"input": distill["input"], "kept": distill["kept"],
                                    "kept_by_source": distill["kept_by_source"]}
    sft = _read(run / "sft" / "summary.json")
    if sft:
        out["stages"]["sft"] = {k: sft[k] for k in ("examples", "first_loss", "last_loss", "trained_tokens",
                                                    "masked_observation_tokens", "seconds")}
        out["stages"]["sft"]["optimizer_steps"] = len(sft.get("losses", []))
    pool = _read(run / "rl" / "pool.json")
    if pool:
        out["stages"]["pool_screening"] = headroom(pool)
    metrics = run / "rl" / "metrics.jsonl"
    steps = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    if steps:
        out["stages"]["rl"] = {"steps": len(steps), "rollouts": sum(s.get("rollouts", 0) for s in steps)}
    for stage, present in (("sft", sft), ("pool_screening", pool), ("rl", steps),
                           ("eval", (run / "eval" / "summary.json").exists())):
        if not present:
            out["not_reached"].append(stage)
    evaluation = _read(run / "eval" / "summary.json")
    if evaluation:
        out["stages"]["eval"] = evaluation
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--name", default="gpu_smoke_h100")
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--date", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--versions", required=True)
    ap.add_argument("--stage-seconds", action="append", default=[], metavar="STAGE=SECONDS")
    ap.add_argument("--note", default="")
    ap.add_argument("--source", default="benchmarks/gpu_smoke.sh (docs/gpu-validation.md has the commands)")
    args = ap.parse_args(argv)
    result = summarize(args.run)
    result["preset"] = _read(args.run / "preset.json")
    for item in args.stage_seconds:
        stage, seconds = item.split("=", 1)
        result["stages"].setdefault(stage, {})["seconds"] = float(seconds)
    for stage in result["stages"].values():
        if stage.get("rollouts") and stage.get("seconds"):
            stage["rollouts_per_second"] = round(stage["rollouts"] / stage["seconds"], 1)
    if args.note:
        result["note"] = args.note
    result["provenance"] = {"date": args.date, "commit": args.commit,
                            "machine": {"gpu": args.gpu, "versions": args.versions}}
    print(publish(args.name, result, args.source, {}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
