"""Small row-parsing helpers shared by the layout parsers in :mod:`coa_lab.tasks.loaders`
and :mod:`coa_lab.tasks.code_layouts`.

They raise plain ``ValueError`` with a short reason; ``load_tasks`` wraps that into a
:class:`~coa_lab.tasks.records.DatasetError` naming the file and the 1-based row.
"""

from __future__ import annotations

import ast
from typing import Any


def literal(value: Any) -> Any:
    """Decode Python-repr strings ("['a', 'b']") that several public dumps store instead of lists."""
    if isinstance(value, str) and value[:1] in "[{(":
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return value


def str_list(value: Any, what: str) -> list[str]:
    """A string or list of strings (possibly repr-encoded) as a list of strings."""
    value = literal(value)
    if isinstance(value, (str, int, float)):
        return [str(value)]
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise ValueError(f"{what} must be a string or a list of strings, got {type(value).__name__}")


def text(row: dict, key: str) -> str:
    """``row[key]`` as a non-empty string, or a ValueError saying what is wrong."""
    if key not in row:
        raise ValueError(f"missing {key!r}")
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{key!r} must be a non-empty string")
    return value
