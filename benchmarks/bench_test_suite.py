"""The test suite's own time: what `make test` costs on this machine, with the probe beside it.

Run:  PYTHONPATH=. python benchmarks/bench_test_suite.py [--pytest-args "-q -n auto --maxprocesses=4 --dist loadfile --durations=15"]
Writes runs/bench/test_suite.json (under COA_LAB_RUNS if set; with COA_LAB_PUBLISH=1 also
docs/results/test_suite.json, the file README's "Tests" figures link to).

Runs pytest in a subprocess with the README's arguments (`make test`: `-q -n auto --maxprocesses=4 --dist loadfile --durations=15`),
reads the counts from its JUnit XML (passed, failed, errors, skipped; deselected from the
summary line) and the slowest tests from `--durations`, and probes the matmul peak before and
after (the suite's time follows the probe: minutes x GFLOP/s stayed at 3,000-3,300 across
earlier runs). Issue 27's target: `make test` <= 15 min on a machine whose fp32 probe reads
>= 250 GFLOP/s. For the fresh-clone figure, run it in a fresh clone after `make setup`
(`.ci/run` is `make test`: the same pytest command).
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
sys.path.insert(0, str(ROOT))

from results import save  # noqa: E402 - benchmarks/results.py, beside this script

from coa_lab.config import get_preset  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402

# "102.16s call     tests/test_distributed.py::test_sft_under_..." (pytest --durations)
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pytest-args", default="-q -n auto --maxprocesses=4 --dist loadfile --durations=15", help="what `make test` passes to pytest")
    ap.add_argument("--preset", default="cpu-tiny", help="the preset whose numeric mode the probe reports")
    args = ap.parse_args()
    preset = get_preset(args.preset)
    machine_start = machine_peak(preset)
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        command = [sys.executable, "-m", "pytest", *shlex.split(args.pytest_args), f"--junitxml={junit}"]
        # the suite must not publish: under `make bench` COA_LAB_PUBLISH=1 is set, and the
        # benchmarks the tests run at smoke size would overwrite docs/results/ with their figures
        env = {k: v for k, v in os.environ.items() if k != "COA_LAB_PUBLISH"}
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
    machine = machine_peak(preset)
    result = {
        "command": f"python -m pytest {args.pytest_args}", "exit_code": done.returncode, **counts,
        "deselected": int(deselected.group(1)) if deselected else 0, "seconds": seconds,
        "minutes": round(seconds / 60, 1), "summary_line": summary[-1].strip("= ") if summary else None,
        "failures": failures, "slowest": slowest(output),
        # minutes x the probe: roughly constant across draws of the machine, so comparable
        "minutes_x_fp32_gflops": round(seconds / 60 * machine["fp32_gflops"]),
        "machine_start": machine_start, "machine": machine,
    }
    print(f"{result['passed']} passed, {result['failed']} failed, {result['errors']} errors in {result['minutes']} min "
          f"(fp32 probe {machine_start['fp32_gflops']} -> {machine['fp32_gflops']} GFLOP/s)")
    save("test_suite", result)
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
