"""How long each lesson takes: the eight notebooks run in order, as a learner runs them.

Run:  python -m benchmarks.bench_notebooks [--smoke] [--only 00 02]
Writes runs/bench/notebooks_full.json (or notebooks_smoke.json with --smoke; under COA_LAB_RUNS
if set; benchmarks/results.py). The README's notebook table links its times here.

Each notebook is copied into a scratch folder and executed there by a Jupyter kernel (nbclient,
as tests/e2e/test_notebooks.py does), in order, with one shared COA_LAB_RUNS, so each lesson reads what
the one before it wrote (02 distils 01's capture, 03 trains on 02's trajectories, ...). Each lesson
saves its figures under runs/nbNN/figures (coa_lab/lessons/inputs.lesson_figures), so the committed
notebooks/figures/ (which the notebooks' text describes) stay as they are; run with
COA_LAB_REFERENCE_FIGURES=1 to refresh those, together with the prose that quotes them (`python -m coa_lab.published
05_cost.json notebooks/*.ipynb README.md docs/*.md` restates every figure linked into one file; the words around
them are yours to reread). `--keep DIR`
keeps the scratch folder (its runs/, figures included) for a look. The matmul probe is taken before and after: a lesson's time
means little without it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path


from benchmarks.results import save  # noqa: E402

from coa_lab.config import get_preset  # noqa: E402
from coa_lab.paths import PROJECT_ROOT  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402

NOTEBOOKS = sorted((PROJECT_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def run_notebook(path: Path, workdir: Path, timeout: int) -> dict:
    """Execute one notebook copied into workdir; its time, and the first error if it failed."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    copy = workdir / path.name
    shutil.copy(path, copy)
    nb = nbformat.read(copy, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(workdir)}})
    t0 = time.perf_counter()
    error = None
    try:
        client.execute()
    except CellExecutionError as e:  # the time up to the failure is still reported, with the reason
        error = str(e).strip().splitlines()[-1][:300]
    seconds = time.perf_counter() - t0
    nbformat.write(nb, copy)  # outputs kept in the scratch copy, never in notebooks/
    return {"notebook": path.name, "seconds": round(seconds, 1), "ok": error is None, "error": error}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="COA_LAB_SMOKE=1: each lesson as small as it runs")
    ap.add_argument("--only", nargs="+", default=None, help="notebook numbers, e.g. 00 02 (default: all, in order)")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds a cell may take")
    ap.add_argument("--keep", type=Path, default=None, help="scratch folder to keep (default: a temporary one)")
    ap.add_argument("--preset", default="cpu-tiny", help="the preset whose numeric mode the probe reports")
    args = ap.parse_args()
    chosen = [p for p in NOTEBOOKS if args.only is None or p.name[:2] in args.only]
    if not chosen:
        sys.exit(f"no notebook matches {args.only}; there are {[p.name[:2] for p in NOTEBOOKS]}")
    mode = "smoke" if args.smoke else "full"
    scratch = args.keep or Path(tempfile.mkdtemp(prefix="coa-notebooks-"))
    workdir = scratch / "notebooks"
    workdir.mkdir(parents=True, exist_ok=True)
    # the kernel inherits this process's environment; the result itself goes where results go
    own_runs = os.environ.get("COA_LAB_RUNS")
    os.environ["COA_LAB_RUNS"] = str(scratch / "runs")
    os.environ["COA_LAB_SMOKE"] = "1" if args.smoke else "0"
    os.environ.setdefault("TQDM_DISABLE", "1")
    # this checkout's coa_lab, whatever the scratch folder (a relative PYTHONPATH=. would point there)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    preset = get_preset(args.preset)
    machine = machine_peak(preset)
    rows = []
    for path in chosen:
        row = run_notebook(path, workdir, args.timeout)
        rows.append(row)
        print(f"  {row['notebook']}: {row['seconds']} s{'' if row['ok'] else ' FAILED: ' + row['error']}", flush=True)
    result = {"mode": mode, "notebooks": rows, "total_seconds": round(sum(r["seconds"] for r in rows), 1),
              "total_minutes": round(sum(r["seconds"] for r in rows) / 60, 1), "all_ok": all(r["ok"] for r in rows),
              "by_number": {r["notebook"][:2]: r["seconds"] for r in rows},
              "machine": {"start": machine, "end": machine_peak(preset)}}
    if own_runs is None:
        os.environ.pop("COA_LAB_RUNS")
    else:
        os.environ["COA_LAB_RUNS"] = own_runs
    print(f"{mode}: {result['total_minutes']} min for {len(rows)} notebooks; all ran: {result['all_ok']}")
    save(f"notebooks_{mode}", result)
    if args.keep is None:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
