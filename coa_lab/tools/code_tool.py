"""The "code" tool (local bwrap sandbox or remote E2B) and the ``coa-lab exec`` CLI.

``CodeTool`` turns an agent's ```python block into a sandboxed run (``sandbox.run_python``)
and the run's output into an ``Observation``; ``E2BCodeTool`` does the same in a remote
E2B sandbox; ``make_code_tool`` picks one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

from coa_lab.tools import sandbox as _sandbox
from coa_lab.tools.base import Observation, Tool, error_observation
from coa_lab.tools.sandbox import SandboxUnavailableError

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(block: str) -> str:
    """The code inside ```python fences (all blocks, joined), or the bare text."""
    blocks = _FENCE.findall(block)
    code = "\n".join(blocks) if blocks else block
    return code.strip("\n").rstrip()


def format_exec(stdout: str, stderr: str, timed_out: bool, timeout_s: float) -> str:
    parts = [stdout.rstrip("\n")] if stdout.strip() else []
    if stderr.strip():
        parts.append("[stderr]\n" + stderr.rstrip("\n"))
    if timed_out:
        parts.append(f"[timed out after {timeout_s:g}s]")
    return "\n".join(parts) if parts else "(no output)"


class CodeTool(Tool):
    """Run Python locally in the bwrap sandbox."""

    name = "code"
    description = "run a Python snippet (numpy/sympy available, no network) and return what it prints"

    def __init__(self, timeout_s: float = 10, memory_mb: int = 1024,
                 max_output_chars: int = 1500, allow_unsandboxed: bool = False) -> None:
        self.timeout_s, self.memory_mb = timeout_s, memory_mb
        self.max_output_chars = max_output_chars
        self.allow_unsandboxed = allow_unsandboxed

    def run(self, arg: str) -> Observation:
        code = extract_code(arg)
        if not code.strip():
            return error_observation("empty code: send a ```python ...``` block or bare code")
        res = _sandbox.run_python(code, timeout_s=self.timeout_s, memory_mb=self.memory_mb,
                         max_output_chars=max(self.max_output_chars, 1000),
                         allow_unsandboxed=self.allow_unsandboxed)
        ok = res.exit_code == 0 and not res.timed_out
        error = None if ok else ("timeout" if res.timed_out else f"exit code {res.exit_code}")
        return Observation(text=format_exec(res.stdout, res.stderr, res.timed_out, self.timeout_s),
                           ok=ok, latency_s=res.duration_s, error=error)


class E2BCodeTool(Tool):
    """Run Python in a remote E2B sandbox (needs E2B_API_KEY; the SDK reads it from env)."""

    name = "code"
    description = "run a Python snippet in a remote sandbox and return what it prints"

    def __init__(self, timeout_s: float = 30, max_output_chars: int = 1500,
                 template: str | None = None) -> None:
        if not os.environ.get("E2B_API_KEY"):
            raise RuntimeError("E2BCodeTool needs the E2B_API_KEY environment variable "
                               "(get one at e2b.dev); or use the local CodeTool")
        try:
            import e2b_code_interpreter  # noqa: F401  (lazy: optional dependency)
        except ImportError as exc:
            raise RuntimeError("E2BCodeTool needs `pip install e2b-code-interpreter`") from exc
        self.timeout_s, self.max_output_chars, self.template = timeout_s, max_output_chars, template
        self._sandbox = None

    def _get_sandbox(self):
        if self._sandbox is None:
            from e2b_code_interpreter import Sandbox

            # The key is NOT passed or logged here: the SDK reads E2B_API_KEY itself.
            kwargs = {"template": self.template} if self.template else {}
            self._sandbox = Sandbox.create(**kwargs)
        return self._sandbox

    def run(self, arg: str) -> Observation:
        code = extract_code(arg)
        if not code.strip():
            return error_observation("empty code: send a ```python ...``` block or bare code")
        start = time.perf_counter()
        execution = self._get_sandbox().run_code(code, timeout=self.timeout_s)
        stdout = "".join(execution.logs.stdout)
        if getattr(execution, "text", None):  # value of the last expression, notebook-style
            stdout += ("" if stdout.endswith("\n") or not stdout else "\n") + execution.text
        stderr = "".join(execution.logs.stderr)
        err = execution.error
        if err is not None:
            stderr += f"{err.name}: {err.value}\n{err.traceback}"
        return Observation(text=format_exec(stdout, stderr, False, self.timeout_s),
                           ok=err is None, latency_s=time.perf_counter() - start,
                           error=None if err is None else f"{err.name}: {err.value}")

    def close(self) -> None:
        if self._sandbox is not None:
            try:
                self._sandbox.kill()
            finally:
                self._sandbox = None


def make_code_tool(backend: str = "auto", **kwargs) -> Tool:
    """``backend``: "local" (bwrap), "e2b", or "auto" (e2b iff E2B_API_KEY is set)."""
    if backend == "auto":
        backend = "e2b" if os.environ.get("E2B_API_KEY") else "local"
    if backend == "local":
        return CodeTool(**kwargs)
    if backend == "e2b":
        kwargs = {k: v for k, v in kwargs.items() if k in ("timeout_s", "max_output_chars", "template")}
        return E2BCodeTool(**kwargs)
    raise ValueError(f"unknown code backend {backend!r}; choose 'auto', 'local' or 'e2b'")


# ---------------------------------------------------------------------------- CLI


def exec_main(argv: list[str] | None = None) -> int:
    """``coa-lab exec FILE [--timeout S] [--memory MB]``: print one JSON result object."""
    parser = argparse.ArgumentParser(prog="coa-lab exec", description="run a Python file in the sandbox")
    parser.add_argument("file", help="Python file to run ('-' for stdin)")
    parser.add_argument("--timeout", type=float, default=10.0, help="wall-clock seconds (default 10)")
    parser.add_argument("--memory", type=int, default=1024, help="address-space limit in MB (default 1024)")
    parser.add_argument("--allow-unsandboxed", action="store_true", help="run without bwrap (unsafe)")
    args = parser.parse_args(argv)
    code = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    try:
        res = _sandbox.run_python(code, timeout_s=args.timeout, memory_mb=args.memory,
                         allow_unsandboxed=args.allow_unsandboxed)
    except SandboxUnavailableError as exc:
        print(f"coa-lab exec: {exc}", file=sys.stderr)
        return 2
    out = asdict(res)
    out["duration"] = out.pop("duration_s")
    print(json.dumps(out))
    return 0
