"""The test suite's own time: what `make test` costs on this machine, with the probe beside it.

Run:  python -m benchmarks.bench_test_suite [--pytest-args "-q -n auto --maxprocesses=4 --dist loadfile --durations=15"]
Writes runs/bench/test_suite.json (under COA_LAB_RUNS if set; with COA_LAB_PUBLISH=1 also
docs/results/test_suite.json, the file README's "Tests" figures link to).

Runs pytest in a subprocess with the README's arguments (`make test`: `-q -n auto --maxprocesses=4 --dist loadfile --durations=15`),
reads the counts from its JUnit XML (passed, failed, errors, skipped; deselected from the
summary line) and the slowest tests from `--durations`, and probes the matmul peak before and
after (the suite's time follows the probe: minutes x GFLOP/s stayed at 3,000-3,300 across
the runs published so far). The target: `make test` <= 15 min on a machine whose fp32 probe reads
>= 250 GFLOP/s. For the fresh-clone figure, run it in a fresh clone after `make setup`
(`.ci/run` is `make test`: the same pytest command).

`--compare FILE ...` measures what the workers buy instead: the given test files once in one
process (`-q`) and once as `make test` runs them (`--pytest-args`), back to back on the same
machine, and writes runs/bench/test_suite_workers.json (each arm's counts and seconds, and
`speedup`, one process's seconds over the workers').
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from benchmarks.results import save  # noqa: E402

from coa_lab.config import get_preset  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402

# "102.16s call     tests/e2e/test_distributed.py::test_sft_under_..." (pytest --durations)
DURATION = re.compile(r"^\s*([0-9.]+)s\s+(setup|call|teardown)\s+(\S.*)$")
DESELECTED = re.compile(r"(\d+) deselected")


def junit_failures(xml_path: Path) -> list[str]:
    """The ids ("file::name") of the test cases that failed or errored, from the JUnit XML."""
    out = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            path = (case.get("classname") or "").replace(".", "/")
            out.append(f"{path}.py::{case.get('name')}" if path else case.get("name", "?"))
    return out


def junit_counts(xml_path: Path) -> dict:
    """passed / failed / errors / skipped from pytest's JUnit XML (its <testsuite> totals)."""
    root = ET.parse(xml_path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise ValueError(f"{xml_path}: no <testsuite> element")
    tests, failures, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    return {"passed": tests - failures - errors - skipped, "failed": failures, "errors": errors, "skipped": skipped}


def slowest(output: str) -> list[dict]:
    """The `--durations` table: seconds, phase and test id of each listed entry, slowest first."""
    rows = [m.groups() for m in map(DURATION.match, output.splitlines()) if m]
    return [{"seconds": float(s), "phase": phase, "test": test.strip()} for s, phase, test in rows]


MAKE_TEST_ARGS = "-q -n auto --maxprocesses=4 --dist loadfile --durations=15"


def run_pytest(pytest_args: str) -> dict:
    """One pytest run in a subprocess, as `make test` runs it: counts from its JUnit XML, the
    summary line, the slowest tests, seconds and exit code."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        command = [sys.executable, "-m", "pytest", *shlex.split(pytest_args), f"--junitxml={junit}"]
        # the suite must not publish: under `make bench` COA_LAB_PUBLISH=1 is set, and the
        # benchmarks the tests run at smoke size would overwrite docs/results/ with their figures;
        # nor think it is a worker of a pytest-xdist run this benchmark was started from
        env = {k: v for k, v in os.environ.items() if k != "COA_LAB_PUBLISH" and not k.startswith("PYTEST_")}
        t0 = time.time()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
        seconds = round(time.time() - t0, 1)
        output = done.stdout + done.stderr
        if not junit.exists():
            sys.stderr.write(output[-4000:])
            raise SystemExit(f"pytest wrote no JUnit report (exit code {done.returncode}): see its output above")
        counts = junit_counts(junit)
        failures = junit_failures(junit)
    summary = [line for line in output.splitlines() if " in " in line and ("passed" in line or "failed" in line)]
    deselected = DESELECTED.search(summary[-1]) if summary else None
    return {"command": f"python -m pytest {pytest_args}", "exit_code": done.returncode, **counts,
            # pytest-xdist's summary does not count the deselected (slow) tests: None then, not 0
            "deselected": int(deselected.group(1)) if deselected else None, "seconds": seconds,
            "minutes": round(seconds / 60, 1), "summary_line": summary[-1].strip("= ") if summary else None,
            "failures": failures, "slowest": slowest(output)}


def compare(files: list[str], pytest_args: str, preset) -> int:
    """The same files in one process, then in `make test`'s workers: what the workers buy."""
    machine_start = machine_peak(preset)
    one = run_pytest("-q " + " ".join(files))
    workers = run_pytest(f"{pytest_args} {' '.join(files)}")
    machine = machine_peak(preset)
    result = {"files": files, "one_process": one, "workers": workers,
              "speedup": round(one["seconds"] / workers["seconds"], 2),
              "machine_start": machine_start, "machine": machine}
    print(f"{len(files)} files: one process {one['seconds']} s ({one['passed']} passed), workers {workers['seconds']} s "
          f"({workers['passed']} passed): x{result['speedup']}")
    save("test_suite_workers", result)
    return 0 if one["exit_code"] == workers["exit_code"] == 0 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pytest-args", default=MAKE_TEST_ARGS, help="what `make test` passes to pytest")
    ap.add_argument("--preset", default="cpu-tiny", help="the preset whose numeric mode the probe reports")
    ap.add_argument("--compare", nargs="+", metavar="FILE", help="time these test files in one process and in workers")
    args = ap.parse_args()
    preset = get_preset(args.preset)
    if args.compare:
        return compare(args.compare, args.pytest_args, preset)
    machine_start = machine_peak(preset)
    result = run_pytest(args.pytest_args)
    machine = machine_peak(preset)
    result.update({
        # minutes x the probe: roughly constant across draws of the machine, so comparable
        "minutes_x_fp32_gflops": round(result["seconds"] / 60 * machine["fp32_gflops"]),
        "machine_start": machine_start, "machine": machine,
    })
    print(f"{result['passed']} passed, {result['failed']} failed, {result['errors']} errors in {result['minutes']} min "
          f"(fp32 probe {machine_start['fp32_gflops']} -> {machine['fp32_gflops']} GFLOP/s)")
    save("test_suite", result)
    return 0 if result["exit_code"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
