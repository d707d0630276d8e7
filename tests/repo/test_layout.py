"""The package's shape: no import cycles, no oversized modules, and each sub-package holds
what it says. Static (ast only): nothing under coa_lab is imported or executed here."""

import ast
from pathlib import Path


PACKAGE_DIR = Path(__file__).resolve().parents[2] / "coa_lab"
MAX_LINES = 450
# {path relative to coa_lab/: why this long module is one idea}; keep it short, ideally empty
LONG_MODULE_ALLOWED: dict[str, str] = {}

# Floors, lowest first: a module imports only from its own floor or below, so each stage can be
# read (and tested) without what is built on top of it. Named by coa_lab's top-level entries.
FLOORS: list[tuple[str, set[str]]] = [
    ("the format and the settings everything reads",
     {"field_types", "paths", "config", "protocol", "prompts", "trajectories", "progress", "throughput", "published",
      "distributed"}),
    ("what a rollout acts with: tools, tasks and their scorers, generation backends",
     {"tools", "tasks", "generation"}),
    ("a model's building blocks: training math, the student's rollout loop, the teacher's capture",
     {"machine", "training", "student_rollout", "capture"}),
    ("the stages that learn and measure", {"distill", "rl", "evaluate"}),
    ("running and planning stages",
     {"pipeline", "demo", "planning", "recipe_check", "report", "comparison", "rl_against_control", "rl_arms"}),
    ("front doors: the CLI, the server, the notebooks' helpers, figures", {"cli", "serve", "lessons", "viz"}),
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST):
    """Every import statement under `node`, function bodies included, except those guarded by
    `if TYPE_CHECKING:` (their `else:` branch still counts)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            yield from _import_nodes(ast.Module(body=child.orelse, type_ignores=[]))
            continue
        yield from _import_nodes(child)


def _resolve(known: set[str], target: str) -> str | None:
    """The longest known module that `target` names or lies inside (None: outside coa_lab)."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in known:
            return name
    return None


def import_graph() -> dict[str, set[str]]:
    """module -> the coa_lab modules it imports. `from pkg import sub` is an edge to the
    submodule `pkg.sub`; `from pkg import name` and `import pkg` are edges to pkg's __init__."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges = graph.setdefault(name, set())
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                           for alias in node.names]
            for target in targets:
                resolved = _resolve(known, target)
                if resolved is not None and resolved != name:
                    edges.add(resolved)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 50 and graph["coa_lab.cli"], "the graph builder found no modules or no imports"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_sees_function_level_and_relative_imports(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\nelse:\n    import y\n"
                     "def f():\n    from .z import w\n")
    found = [n.names[0].name if isinstance(n, ast.Import) else n.module for n in _import_nodes(tree)]
    assert sorted(found) == ["typing", "y", "z"]


def test_no_module_is_over_the_line_limit():
    too_long = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = path.relative_to(PACKAGE_DIR).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES and rel not in LONG_MODULE_ALLOWED:
            too_long[rel] = lines
    assert not too_long, f"modules over {MAX_LINES} lines (split them, or allow-list one idea): {too_long}"
    stale = [rel for rel in LONG_MODULE_ALLOWED if not (PACKAGE_DIR / rel).is_file()]
    assert not stale, f"allow-listed modules that no longer exist: {stale}"


def _floor(module: str) -> int:
    entry = module.split(".")[1] if "." in module else module
    for level, (_, entries) in enumerate(FLOORS):
        if entry in entries:
            return level
    raise KeyError(entry)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import that reaches a higher floor, as "a (floor i) -> b (floor j)"."""
    return [f"{a} (floor {_floor(a)}) -> {b} (floor {_floor(b)})" for a, targets in sorted(graph.items())
            for b in sorted(targets) if a != "coa_lab" and b != "coa_lab" and _floor(b) > _floor(a)]


def test_every_top_level_entry_has_a_floor():
    entries = {p.stem for p in PACKAGE_DIR.glob("*.py") if p.stem != "__init__"}
    entries |= {p.name for p in PACKAGE_DIR.iterdir() if (p / "__init__.py").is_file()}
    placed = set().union(*(e for _, e in FLOORS))
    assert entries - placed == set(), "new top-level modules need a floor in FLOORS"
    assert placed - entries == set(), "FLOORS names entries that no longer exist"


def test_no_import_reaches_up_a_floor():
    up = upward_imports(import_graph())
    assert not up, "imports from a lower floor into a higher one:\n" + "\n".join(up)


def test_the_floor_check_sees_an_upward_import():
    assert upward_imports({"coa_lab.protocol": {"coa_lab.rl.dapo"}, "coa_lab.rl.dapo": {"coa_lab.protocol"}}) == [
        "coa_lab.protocol (floor 0) -> coa_lab.rl.dapo (floor 3)"]
