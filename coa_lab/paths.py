"""Where the lab reads shipped data and writes caches and runs.

Everything the lab needs at run time is inside the project (``datasets/``) or in the
cache directory; nothing reads ``../shared``.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# The shipped, license-tracked data subsets (see datasets/README.md).
DATASETS_DIR = Path(os.environ.get("COA_LAB_DATASETS", PROJECT_ROOT / "datasets"))
# accelerate launch configs (DDP, FSDP, DeepSpeed) and the SLURM example: docs/scaling.md
CONFIGS_DIR = PROJECT_ROOT / "configs"


def cache_dir() -> Path:
    """Converted models and search indexes; override with COA_LAB_CACHE."""
    path = Path(os.environ.get("COA_LAB_CACHE", Path.home() / ".cache" / "coa-lab"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def runs_dir() -> Path:
    """Where stages write their outputs unless told otherwise; override with COA_LAB_RUNS."""
    return Path(os.environ.get("COA_LAB_RUNS", PROJECT_ROOT / "runs"))


# the folders a machine's absolute paths start from (this machine's own roots are added at use)
_MACHINE_ROOTS = ("work", "home", "tmp", "root", "Users", "mnt", "scratch", "private", "var", "opt", "srv", "data")


def portable_path(path: str | Path, base: str | Path | None = None) -> str:
    """`path` as a result file records it, so that it means the same on another machine: relative to
    `base` (the working folder a run was made from; default the repository) when under it, else
    `$COA_LAB_RUNS/...`, `~/...` or `$TMPDIR/...`, else relative to `base` (`../...`). A relative path
    stays as it is. Never absolute: result files are committed and read elsewhere. from_portable reads it."""
    p = Path(path)
    if not p.is_absolute():
        return str(path)
    p, base = Path(os.path.abspath(p)), Path(os.path.abspath(base or PROJECT_ROOT))
    for root, prefix in ((base, ""), (runs_dir(), "$COA_LAB_RUNS/"), (Path.home(), "~/"),
                         (Path(tempfile.gettempdir()), "$TMPDIR/")):
        root = Path(os.path.abspath(root))
        if p == root:
            return prefix.rstrip("/") or "."
        if p.is_relative_to(root):
            return prefix + str(p.relative_to(root))
    return os.path.relpath(p, base)


def _absolute_paths() -> re.Pattern:
    """An absolute path inside a string: a `/` that starts a token (not `a/b`, `../b`, `$OUT/b` or a URL's
    `//`), then a machine root's folder."""
    firsts = set(_MACHINE_ROOTS)
    for root in (PROJECT_ROOT, runs_dir(), Path.home(), Path(tempfile.gettempdir())):
        parts = Path(os.path.abspath(root)).parts
        if len(parts) > 1:
            firsts.add(parts[1])
    names = "|".join(sorted(map(re.escape, firsts)))
    return re.compile(rf"(?<![\w.$~:/-])/(?:{names})(?:/[^\s\"'`()\[\]{{}},;|<>]*)?(?![\w.-])")


def portable_text(text: str, base: str | Path | None = None) -> str:
    """`text` with every absolute path in it written by portable_path ("--out /tmp/x" -> "--out $TMPDIR/x");
    a JSON file's text too (a path holds no quote)."""
    return _absolute_paths().sub(lambda m: portable_path(m.group(0), base), text) if "/" in text else text


def portable_paths(value, base: str | Path | None = None):
    """`value` (a result: dicts, lists, strings) with every absolute path in its strings written by
    portable_path, command lines and notes included."""
    if isinstance(value, dict):
        return {k: portable_paths(v, base) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable_paths(v, base) for v in value]
    return portable_text(value, base) if isinstance(value, str) else value


def from_portable(text: str, base: str | Path | None = None) -> Path:
    """The path portable_path wrote, on this machine: `$COA_LAB_RUNS/`, `~/` and `$TMPDIR/` expanded, a
    relative path taken from `base` (default the repository), an absolute one (an older file's) as it is."""
    for prefix, root in (("$COA_LAB_RUNS/", runs_dir), ("~/", Path.home), ("$TMPDIR/", tempfile.gettempdir)):
        if text.startswith(prefix):
            return Path(root()) / text[len(prefix):]
    path = Path(text)
    return path if path.is_absolute() else Path(base or PROJECT_ROOT) / path
