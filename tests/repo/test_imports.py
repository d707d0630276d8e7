"""Imports sit at the top of a module: a function imports a standard-library or coa_lab module
only where LATE below says why (an import circle, a command of `coa-lab` that must not slow its
--help, a path that stays without torch). Third-party packages may import late (an optional extra,
torch kept off a light path); this test reads only the standard library and coa_lab. Static (ast):
nothing under coa_lab is imported here, except where a test says so."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.repo.test_layout import PACKAGE_DIR, import_graph

# `coa-lab --help` reads cli.py and what it imports at its top: a command imports what it runs
# when it runs (torch, FastAPI, the tools package, the stages stay out of --help)
CLI_COMMAND = "a `coa-lab` command's own modules: `coa-lab --help` stays without them"
# {(path under coa_lab/, imported module): why it is imported inside a function}
LATE: dict[tuple[str, str], str] = {
    ("cli.py", "coa_lab.capture.recorder"): CLI_COMMAND,
    ("cli.py", "coa_lab.tools.sandbox"): CLI_COMMAND,
    ("cli.py", "coa_lab.tools.code_tool"): CLI_COMMAND,
    ("cli.py", "coa_lab.tasks.file_checks"): CLI_COMMAND,
    ("cli.py", "coa_lab.serve.app"): CLI_COMMAND,
    ("cli.py", "coa_lab.rl_arms.command"): CLI_COMMAND,
    ("cli.py", "coa_lab.report"): CLI_COMMAND,
    ("cli.py", "coa_lab.pipeline"): CLI_COMMAND,
    ("cli.py", "coa_lab.demo"): CLI_COMMAND,
    ("cli.py", "coa_lab.planning.plan_report"): CLI_COMMAND,
    ("cli.py", "coa_lab.evaluate"): CLI_COMMAND,
    ("cli.py", "coa_lab.tasks.records"): CLI_COMMAND,
    ("cli.py", "coa_lab.generation.http_client"): CLI_COMMAND,
    ("cli.py", "coa_lab.generation.models"): CLI_COMMAND,
    ("cli.py", "coa_lab.distributed"): CLI_COMMAND,
    ("cli.py", "coa_lab.planning.memory_plan"): CLI_COMMAND,
    ("planning/plan_report.py", "coa_lab.rl.update"):
        "rl.update imports torch; `coa-lab plan` runs without it (only --calibration reads MICRO_BATCH)",
    ("generation/engine_share.py", "coa_lab.generation.models"):
        "models imports torch; `coa-lab plan` reads engine_share's shares without it",
    ("generation/engine_share.py", "coa_lab.generation.llm"):
        "llm imports the backends and torch; `coa-lab plan` reads engine_share without them",
    ("generation/engine_share.py", "coa_lab.generation.vllm_engine"):
        "vllm_engine imports torch (and reads engine_share): sizing a CPU engine is the stages' step only",
    ("tasks/scorers.py", "coa_lab.tasks.code_tests"):
        "code tests bring the tools package (sandbox, bm25s, numpy: ~0.25 s); scoring text stays without it",
}


def _module_of(node: ast.Import | ast.ImportFrom, alias: ast.alias) -> str:
    """The module an import statement reads: `from coa_lab import pipeline` is coa_lab.pipeline."""
    if isinstance(node, ast.Import):
        return alias.name
    base = node.module or ""
    candidate = f"{base}.{alias.name}"
    return candidate if (PACKAGE_DIR.parent / Path(*candidate.split("."))).with_suffix(".py").exists() or \
        (PACKAGE_DIR.parent / Path(*candidate.split(".")) / "__init__.py").exists() else base


def late_imports(source: str) -> list[tuple[int, str, str]]:
    """(line, function, module) for every standard-library or coa_lab module a function imports."""
    found = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name if function is None else f"{function}.{child.name}")
                continue
            if function is not None and isinstance(child, (ast.Import, ast.ImportFrom)) and \
                    not getattr(child, "level", 0):
                for module in dict.fromkeys(_module_of(child, alias) for alias in child.names):
                    top = module.split(".")[0]
                    if top == "coa_lab" or top in sys.stdlib_module_names:
                        found.append((child.lineno, function, module))
            visit(child, function)

    visit(ast.parse(source), None)
    return found


MODULES = sorted(p.relative_to(PACKAGE_DIR).as_posix() for p in PACKAGE_DIR.rglob("*.py"))


@pytest.mark.parametrize("rel", MODULES)
def test_a_function_imports_no_stdlib_or_coa_lab_module_unless_listed(rel):
    found = late_imports((PACKAGE_DIR / rel).read_text(encoding="utf-8"))
    unlisted = [f"coa_lab/{rel}:{line} in {fn}(): {module}" for line, fn, module in found if (rel, module) not in LATE]
    assert not unlisted, ("move these imports to the module's top, or list them in LATE with the reason:\n"
                          + "\n".join(unlisted))


def test_every_listed_late_import_still_exists_and_says_why():
    stale = []
    for (rel, module), why in LATE.items():
        path = PACKAGE_DIR / rel
        if not why.strip() or not path.exists() or module not in {m for _, _, m in late_imports(path.read_text())}:
            stale.append(f"{rel}: {module}")
    assert not stale, f"LATE lists imports that are no longer late (or give no reason): {stale}"


def test_the_checker_sees_nested_and_from_imports():
    source = ("import json\n"
              "def f():\n    import os\n    from coa_lab import pipeline\n    import torch\n"
              "    def g():\n        from collections import Counter\n"
              "class C:\n    def m(self):\n        from coa_lab.config import Preset\n")
    assert late_imports(source) == [(3, "f", "os"), (4, "f", "coa_lab.pipeline"), (7, "f.g", "collections"),
                                    (10, "m", "coa_lab.config")]


def test_no_stage_asks_the_planner():
    """The stages size vLLM's share themselves (generation/engine_share.py, which the planner calls
    too): nothing the pipeline imports, directly or through another module, is coa_lab.planning."""
    graph = import_graph()
    reached, todo = set(), ["coa_lab.pipeline", "coa_lab.demo"]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in reached:
                reached.add(nxt)
                todo.append(nxt)
    assert not [m for m in reached if m.startswith("coa_lab.planning")], sorted(reached)
    assert "coa_lab.generation.engine_share" in reached
