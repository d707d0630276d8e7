"""Parsers for code-benchmark layouts: HumanEval, MBPP (two layouts), APPS stdin/stdout and
the tests inside AFM/verl code parquet rows (LiveCodeBench).

Each turns one raw row into a ``Task(profile="code")`` whose ``metadata["tests"]`` follows
the schema documented in :mod:`coa_lab.tasks.records`; detection and error wrapping live in
:mod:`coa_lab.tasks.loaders`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from coa_lab.tasks.records import Task, check_tests
from coa_lab.tasks.rows import literal, str_list, text

# Appended to benchmark prompts that are bare code or a bare description, so the question
# says what kind of answer is expected.  Our own words; the agent's system prompt adds the
# answer format.
_FUNCTION_ASK = "Complete the following Python function. Answer with the complete function.\n\n"
_STDIO_ASK = "\n\nWrite a complete Python program that reads the input from standard input and prints the answer to standard output."


def _lf(code: str) -> str:
    # MBPP stores Windows line endings; normalise so fenced answers and tests look the same.
    return code.replace("\r\n", "\n")


def parse_humaneval(row: dict, path: Path, i: int) -> Task:
    prompt, entry = text(row, "prompt"), text(row, "entry_point")
    test = text(row, "test")
    number = str(row["task_id"]).split("/")[-1]
    tests = check_tests({
        "style": "assert",
        # HumanEval's test defines check(candidate); calling it is the whole test.
        "cases": [f"{test}\n\ncheck({entry})\n"],
        "entry_point": entry, "prompt": prompt, "setup": "",
    })
    meta: dict[str, Any] = {"tests": tests}
    if row.get("canonical_solution"):
        meta["canonical_solution"] = prompt + row["canonical_solution"]
    return Task(f"humaneval-{number}", _FUNCTION_ASK + f"```python\n{prompt}```", [], "humaneval", "code", meta)


def parse_mbpp(row: dict, path: Path, i: int) -> Task:
    """Both MBPP layouts: google-research ``text/code/test_list/test_setup_code`` and
    DeepSeek-Coder's ``prompt/code/test`` (test = repr of the assert list)."""
    description = text(row, "text" if "text" in row else "prompt")
    asserts = str_list(row["test_list"] if "test_list" in row else row["test"], "MBPP tests")
    if not asserts:
        raise ValueError("MBPP row has no test asserts")
    tests = check_tests({"style": "assert", "cases": [_lf(a) for a in asserts], "entry_point": None,
                         "prompt": None, "setup": _lf(row.get("test_setup_code") or "")})
    # MBPP's own prompt format shows the tests: without them the function name is unknown.
    question = description + "\nYour code should pass these tests:\n\n" + "\n".join(tests["cases"])
    meta: dict[str, Any] = {"tests": tests}
    if row.get("code"):
        meta["canonical_solution"] = _lf(row["code"])
    return Task(f"mbpp-{row['task_id']}", question, [], "mbpp", "code", meta)


def _joined_output(value: Any) -> str:
    # APPS outputs are a string or a list of output lines/chunks.
    value = literal(value)
    if isinstance(value, list):
        return "\n".join(str(v).rstrip("\n") for v in value) + "\n"
    return str(value)


def parse_apps(row: dict, path: Path, i: int) -> Task:
    if str(row.get("starter_code") or "").strip():
        raise ValueError("call-based APPS problem (starter_code set); only stdin/stdout problems are supported")
    cases = literal(row["test_list"])
    if not isinstance(cases, list):
        raise ValueError("'test_list' must be a list of {input, output}")
    tests = check_tests({"style": "stdio", "cases": [{"input": str(c["input"]), "output": _joined_output(c["output"])}
                                                     for c in cases], "entry_point": None, "prompt": None, "setup": ""})
    meta = {"tests": tests, "difficulty": row.get("difficulty")}
    return Task(f"apps-{row['id']}", text(row, "description") + _STDIO_ASK, [], "apps", "code", meta)


def afm_code_tests(truth: Any, extra: dict) -> dict[str, Any]:
    """The AFM/verl code ground truth (JSON text) in our tests schema.

    Two shapes occur: ``{"stdin": [...], "expected_output": [...]}`` and
    ``{"functional": "<assert code calling Solution()>"}`` (LeetCode-style problems).
    """
    if isinstance(truth, str):
        try:
            truth = json.loads(truth)
        except json.JSONDecodeError as exc:
            raise ValueError(f"code ground_truth is not JSON ({exc.msg})") from exc
    if not isinstance(truth, dict):
        raise ValueError("code ground_truth must be an object")
    if "functional" in truth:
        return check_tests({"style": "assert", "cases": [str(truth["functional"])], "entry_point": None,
                            "prompt": None, "setup": ""})
    if "stdin" in truth and "expected_output" in truth:
        ins, outs = truth["stdin"], truth["expected_output"]
        if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
            raise ValueError("code ground_truth: stdin and expected_output must be lists of equal length")
        return check_tests({"style": "stdio", "cases": [{"input": str(a), "output": str(b)} for a, b in zip(ins, outs)],
                            "entry_point": None, "prompt": None, "setup": ""})
    raise ValueError(f"code ground_truth has keys {sorted(truth)}; expected stdin/expected_output or functional")
