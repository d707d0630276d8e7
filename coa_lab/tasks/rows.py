"""Small row-parsing helpers shared by the layout parsers in :mod:`coa_lab.tasks.loaders`
and :mod:`coa_lab.tasks.code_layouts`.

They raise plain ``ValueError`` with a short reason; ``load_tasks`` wraps that into a
:class:`~coa_lab.tasks.records.DatasetError` naming the file and the 1-based row.
"""

from __future__ import annotations

import ast
from typing import Any


# ast.literal_eval's failures on hostile input: bad syntax, and nesting deep enough to
# exhaust the parser or the stack ("[[[[...")
_DECODE_ERRORS = (ValueError, SyntaxError, TypeError, MemoryError, RecursionError)


def literal(value: Any) -> Any:
    """Decode Python-repr strings ("[{'role': ...}]") that several public dumps store instead of
    lists and dicts. Only for fields whose layout says they ARE a list or a dict (prompts,
    reward models, contexts); answers go through `str_list`, which is stricter."""
    if isinstance(value, str) and value[:1] in "[{(":
        try:
            return ast.literal_eval(value)
        except _DECODE_ERRORS:
            return value
    return value


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def str_list(value: Any, what: str) -> list[str]:
    """An answer field that may hold several answers, as a list of strings.

    A list of scalars is that list. A string is ONE answer — unless it is a repr-encoded list
    of scalars ("['Paris', 'paris']", as some public dumps store lists). Anything else that
    merely parses as Python stays the string it is: the HLE answer
    "(-0.5,0.87),(0,0),(0.37,1.37),(0.87,0.5)" is four points, not a tuple to unpack."""
    if isinstance(value, str):
        if value.startswith("["):
            try:
                decoded = ast.literal_eval(value)
            except _DECODE_ERRORS:
                decoded = None
            if isinstance(decoded, list) and all(_scalar(v) for v in decoded):
                return [str(v) for v in decoded]
        return [value]
    if _scalar(value):
        return [str(value)]
    if isinstance(value, (list, tuple)) and all(_scalar(v) for v in value):
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
