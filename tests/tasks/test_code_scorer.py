"""score_code: code answers graded by running the task's tests in the bubblewrap sandbox.

Covers both test styles, wrong answers, crashes, timeouts (bounded time), missing code,
early-exit hacks, and the canonical solutions of HumanEval and MBPP (a fast 20-task sample
by default; every task under ``pytest -m slow``).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from coa_lab.tasks import Task, load_suite, reward, score, score_code
from coa_lab.tasks.code_tests import assemble, run_tests
from coa_lab.tools.sandbox import sandbox_available

pytestmark = pytest.mark.skipif(not sandbox_available(), reason="bubblewrap sandbox not usable here")


def _fenced(code: str) -> str:
    return f"<answer>\n```python\n{code}\n```\n</answer>"


ADD = Task("t-add", "Write add(a, b).", [], "test", "code", {"tests": {
    "style": "assert", "cases": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
    "entry_point": "add", "prompt": None, "setup": ""}})
ECHO_SUM = Task("t-sum", "Read n then n ints; print their sum.", [], "test", "code", {"tests": {
    "style": "stdio", "cases": [{"input": "3\n1 2 3\n", "output": "6\n"}, {"input": "1\n-5\n", "output": "-5"}],
    "entry_point": None, "prompt": None, "setup": ""}})
HUMANEVAL_LIKE = Task("t-he", "complete", [], "test", "code", {"tests": {
    "style": "assert", "cases": ["def check(candidate):\n    assert candidate(2) == 4\n\ncheck(double)\n"],
    "entry_point": "double", "prompt": "import math\n\ndef double(x):\n    \"\"\"Twice x.\"\"\"\n", "setup": ""}})


def test_assert_style_pass_and_wrong():
    assert score(ADD, _fenced("def add(a, b):\n    return a + b")) == 1.0
    assert score(ADD, _fenced("def add(a, b):\n    return a - b")) == 0.0
    assert run_tests(ADD, _fenced("def add(a, b):\n    return 3")).status == "fail"  # passes case 0 only
    assert reward(ADD, _fenced("def add(a, b):\n    return a + b")) == 1.0


@pytest.mark.parametrize("program", [
    "n = int(input())\nprint(sum(map(int, input().split())))",
    "import sys\ndata = sys.stdin.read().split()\nprint(sum(map(int, data[1:])))",
    "import sys\ndata = sys.stdin.buffer.read().split()\nsys.stdout.write(str(sum(map(int, data[1:]))) + '\\n')",
    "data = open(0).read().split()\nprint(sum(map(int, data[1:])))",
    "import sys\ndef main():\n    input()\n    print(sum(map(int, input().split())))\n    sys.exit(0)\nif __name__ == '__main__':\n    main()",
])
def test_stdio_style_reads_stdin_every_way(program):
    assert score(ECHO_SUM, _fenced(program)) == 1.0


def test_stdio_wrong_output_and_whitespace_tolerance():
    assert score(ECHO_SUM, _fenced("input(); print(sum(map(int, input().split())) + 1)")) == 0.0
    assert score(ECHO_SUM, _fenced("input(); print(' ', end=''); print(sum(map(int, input().split())), '  ')")) == 1.0


def test_humaneval_style_body_or_full_function():
    assert score(HUMANEVAL_LIKE, _fenced("def double(x):\n    return 2 * x")) == 1.0
    assert score(HUMANEVAL_LIKE, "```python\n    return int(math.pow(x, 1)) * 2\n```") == 1.0  # body only
    assert assemble(HUMANEVAL_LIKE.metadata["tests"], "    return 2 * x").startswith("import math")


def test_crashes_score_zero():
    assert run_tests(ADD, _fenced("raise RuntimeError('boom')")).status == "crash"
    assert score(ECHO_SUM, _fenced("print(1/0)")) == 0.0
    assert score(ADD, _fenced("def add(a, b):\n    return [0] * (10 ** 12)")) == 0.0  # MemoryError
    assert run_tests(ADD, _fenced("def add(a, b) return a")).status == "syntax_error"


def test_early_exit_cannot_fake_a_pass():
    for hack in ("import os\nos._exit(0)", "import sys\nsys.exit(0)", "print('pass')\nraise SystemExit"):
        assert score(ADD, _fenced(hack)) == 0.0, hack
    # A program that exits cleanly after printing correct output is fine for stdio.
    assert score(ECHO_SUM, _fenced("input(); print(sum(map(int, input().split()))); exit()")) == 1.0


def test_timeouts_are_bounded():
    start = time.monotonic()
    assert run_tests(ADD, _fenced("while True:\n    pass"), case_timeout_s=1).status == "timeout"
    assert run_tests(ECHO_SUM, _fenced("while True:\n    pass"), case_timeout_s=1).status == "timeout"
    report = run_tests(ADD, _fenced("def add(a, b):\n    while True:\n        pass"), case_timeout_s=1)
    assert report.status == "timeout" and report.passed == 0
    assert time.monotonic() - start < 20


def test_missing_code_scores_zero_without_running():
    for answer in (None, "", "   ", "I am not sure how to do this."):
        assert score_code(ADD, answer) == 0.0
    assert run_tests(ADD, "I do not know").status == "syntax_error"
    assert run_tests(ADD, "```python\n\n```").status == "no_code"


def test_task_without_tests_is_a_data_error():
    with pytest.raises(ValueError, match="tests"):
        score(Task("t", "q", [], "test", "code", {}), _fenced("print(1)"))


def _canonical_pass_rate(tasks: list[Task]) -> tuple[float, list[str]]:
    def run(task: Task) -> tuple[str, float]:
        return task.id, score(task, _fenced(task.metadata["canonical_solution"]))

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, tasks))
    failed = [tid for tid, s in results if s != 1.0]
    return 1 - len(failed) / len(results), failed


def test_canonical_solutions_sample():
    tasks = load_suite("code", "eval", benchmark="humaneval")[:10] + load_suite("code", "eval", benchmark="mbpp")[:10]
    rate, failed = _canonical_pass_rate(tasks)
    assert rate == 1.0, failed


@pytest.mark.slow
@pytest.mark.parametrize("benchmark", ["humaneval", "mbpp"])
def test_canonical_solutions_full(benchmark):
    rate, failed = _canonical_pass_rate(load_suite("code", "eval", benchmark=benchmark))
    assert rate >= 0.99, failed
