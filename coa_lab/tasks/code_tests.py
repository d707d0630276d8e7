"""Grade a code answer by running the task's tests in the bubblewrap sandbox.

One sandbox run per (task, answer): a small harness, written here and run by
:func:`coa_lab.tools.sandbox.run_python`, executes the solution and then the cases
(``metadata["tests"]``, schema in :mod:`coa_lab.tasks.records`), stops at the first failing
case, and prints one report line tagged with a random nonce.  Why this shape:

- one run, not one per case: a sandbox start costs ~0.1-0.3 s and LiveCodeBench problems
  have dozens of cases;
- stdin/stdout cases reset ``sys.stdin`` (and fd 0, for ``open(0)``) to the case input and
  capture ``sys.stdout`` per case, then compare outputs inside the sandbox, so a huge output
  never crosses the pipe;
- the nonce line (on a private copy of fd 1; fd 1 itself points at /dev/null) is the only
  proof of completion: a solution that calls ``os._exit(0)`` or prints "all passed" early
  cannot fake a pass.  This defends against accidental or lazy reward hacks, not against a
  program that deliberately introspects the harness (the sandbox bounds the damage of that);
- a per-case CPU-time alarm (``ITIMER_PROF``, so eight graders sharing a busy machine do
  not time each other out) turns an infinite loop into a fast "timeout" result; the
  sandbox's wall-clock limit is the backstop for sleeping loops and C code it cannot
  interrupt.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from coa_lab.tasks.records import Task, check_tests
from coa_lab.tools.code_tool import extract_code
from coa_lab.tools.sandbox import run_python

CASE_TIMEOUT_S = 6.0     # CPU seconds per test case (HumanEval's check() is one case)
MAX_TIMEOUT_S = 60.0     # whole run, however many cases
MEMORY_MB = 2048         # address-space cap; numpy/sympy imports alone reserve ~500 MB

_FENCED = re.compile(r"```")

# Runs inside the sandbox.  Kept stdlib-only and free of str.format braces: the data
# arrives as one JSON literal appended at the end.
_HARNESS = r'''
import io, json, math, os, signal, sys, threading
try:
    os.remove(__file__)  # the solution has no business reading the harness (or its nonce)
except OSError:
    pass
_REPORT = os.fdopen(os.dup(1), "w")
_null = os.open(os.devnull, os.O_WRONLY); os.dup2(_null, 1); os.close(_null)
sys.stdout = open(os.devnull, "w")

class _CaseTimeout(BaseException):
    pass

def _alarm(signum, frame):
    raise _CaseTimeout()

signal.signal(signal.SIGPROF, _alarm)

def _report(status, passed, detail=""):
    _REPORT.write("\n" + json.dumps({"nonce": _D["nonce"], "status": status, "passed": passed,
                                     "detail": str(detail)[-500:]}) + "\n")
    _REPORT.flush()
    os._exit(0)

def _same(got, want):
    g = [l.rstrip() for l in got.rstrip().splitlines()]
    w = [l.rstrip() for l in want.rstrip().splitlines()]
    if g == w:
        return True
    gt, wt = got.split(), want.split()
    if len(gt) != len(wt):
        return False
    for a, b in zip(gt, wt):
        if a == b:
            continue
        try:
            fa, fb = float(a), float(b)
        except ValueError:
            return False
        if not math.isclose(fa, fb, rel_tol=1e-6, abs_tol=1e-6):
            return False
    return True

def _join_threads():
    for t in threading.enumerate():
        if t is not threading.main_thread():
            t.join()

def _run():
    tests, budget = _D["tests"], _D["case_timeout"]
    try:
        program = compile(_D["program"], "solution.py", "exec")
    except BaseException as e:
        _report("syntax_error", 0, repr(e))
    if tests["style"] == "assert":
        ns = {"__name__": "__solution__", "__builtins__": __builtins__}
        try:
            signal.setitimer(signal.ITIMER_PROF, budget)
            exec(program, ns)
            # MBPP's setup builds test fixtures from the solution's classes: run it after.
            exec(compile(tests["setup"], "setup.py", "exec"), ns)
            signal.setitimer(signal.ITIMER_PROF, 0)
        except _CaseTimeout:
            _report("timeout", 0, "solution did not finish loading")
        except BaseException as e:
            _report("crash", 0, f"solution raised {type(e).__name__}: {e}")
        for k, case in enumerate(tests["cases"]):
            try:
                signal.setitimer(signal.ITIMER_PROF, budget)
                exec(compile(case, f"test_{k}.py", "exec"), ns)
                signal.setitimer(signal.ITIMER_PROF, 0)
            except _CaseTimeout:
                _report("timeout", k, f"case {k} exceeded {budget}s")
            except BaseException as e:
                _report("fail", k, f"case {k}: {type(e).__name__}: {e}")
        _report("pass", len(tests["cases"]))
    for k, case in enumerate(tests["cases"]):
        path = f"/tmp/_case_{k}.in"
        with open(path, "wb") as f:
            f.write(case["input"].encode())
        fd = os.open(path, os.O_RDONLY)
        if fd != 0:  # fd 0 is free (and reused) when the previous case's open(0) closed it
            os.dup2(fd, 0); os.close(fd)
        sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
        out = io.BytesIO()
        sys.stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
        ns = {"__name__": "__main__", "__builtins__": __builtins__}
        try:
            signal.setitimer(signal.ITIMER_PROF, budget)
            try:
                exec(program, ns)
            except SystemExit as e:
                if e.code not in (None, 0):
                    raise
            _join_threads()
            signal.setitimer(signal.ITIMER_PROF, 0)
        except _CaseTimeout:
            _report("timeout", k, f"case {k} exceeded {budget}s")
        except BaseException as e:
            _report("crash" if k == 0 else "fail", k, f"case {k}: {type(e).__name__}: {e}")
        sys.stdout.flush()
        got = out.getvalue().decode("utf-8", errors="replace")
        if not _same(got, case["output"]):
            _report("fail", k, f"case {k}: wrong output {got[:200]!r}, expected {case['output'][:200]!r}")
    _report("pass", len(tests["cases"]))

_D = json.loads(DATA)
_run()
'''


@dataclass
class TestReport:
    """Outcome of one graded run.  ``status``: pass | fail | timeout | crash | syntax_error
    | no_code.  ``passed`` counts cases passed before the run stopped (it stops at the
    first failure), so only ``status == "pass"`` means every case passed."""

    status: str
    passed: int
    total: int
    detail: str = ""
    duration_s: float = 0.0

    @property
    def all_passed(self) -> bool:
        return self.status == "pass" and self.passed == self.total


def solution_code(answer: str) -> str | None:
    """The program in an answer: its ```python fenced blocks (joined), else the bare text;
    None when there is nothing that looks like code."""
    code = extract_code(answer) if _FENCED.search(answer) else answer
    return code if code.strip() else None


def assemble(tests: dict[str, Any], code: str) -> str:
    """The program the tests run: the solution, completed with the task's ``prompt`` when
    it has one (HumanEval).  A full ``def entry_point`` answer goes after the prompt, so the
    prompt's imports and helper functions stay available; a body-only answer continues it."""
    prompt, entry = tests.get("prompt"), tests.get("entry_point")
    if not prompt:
        return code
    if entry and re.search(rf"^(?:async\s+)?def\s+{re.escape(entry)}\s*\(", code, re.M):
        return prompt.rstrip("\n") + "\n\n" + code + "\n"
    return prompt + code + "\n"


def run_tests(task: Task, answer: str, case_timeout_s: float = CASE_TIMEOUT_S) -> TestReport:
    """Run ``answer`` (text with a fenced program, or bare code) against ``task``'s tests."""
    tests = check_tests(task.metadata.get("tests"))
    code = solution_code(answer)
    total = len(tests["cases"])
    if code is None:
        return TestReport("no_code", 0, total, "the answer holds no code")
    program = assemble(tests, code)
    try:
        compile(program, "solution.py", "exec")  # compiling runs nothing: safe outside the sandbox
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return TestReport("syntax_error", 0, total, f"{type(exc).__name__}: {exc}")
    nonce = secrets.token_hex(16)
    data = {"nonce": nonce, "tests": tests, "program": program, "case_timeout": case_timeout_s}
    source = _HARNESS.replace("_D = json.loads(DATA)", f"_D = json.loads({json.dumps(data)!r})")
    wall = min(MAX_TIMEOUT_S, 5.0 + case_timeout_s * max(1, total))
    result = run_python(source, timeout_s=wall, memory_mb=MEMORY_MB)
    for line in reversed(result.stdout.splitlines()):
        if nonce in line:
            try:
                rep = json.loads(line)
            except json.JSONDecodeError:
                break
            if rep.get("nonce") == nonce:
                return TestReport(rep["status"], int(rep["passed"]), total, rep.get("detail", ""), result.duration_s)
    if result.timed_out:
        return TestReport("timeout", 0, total, f"sandbox wall clock {wall:g}s exceeded", result.duration_s)
    return TestReport("crash", 0, total, f"exit code {result.exit_code}: {result.stderr[-500:]}", result.duration_s)
