"""A value checked against a preset field's declared type (config.get_preset's overrides), and
`--set section.field=value` text read into such overrides."""

from __future__ import annotations

import json
from typing import Any


def checked_value(where: str, annotation: str, value: Any) -> Any:
    """`value` as the field's declared type wants it (an int where a float is declared becomes a
    float, a JSON list a tuple); anything else is a ValueError naming the field and the type, so
    `--set rl.steps=abc` fails at once rather than deep inside a stage."""
    kinds = {part.strip().split("[")[0] for part in annotation.split("|")}
    if value is None and "None" in kinds:
        return None
    if isinstance(value, bool):
        ok = "bool" in kinds
    elif isinstance(value, int) and "int" not in kinds and "float" in kinds:
        return float(value)
    elif isinstance(value, (int, float, str)):
        ok = type(value).__name__ in kinds
    elif isinstance(value, (list, tuple)) and "tuple" in kinds:
        return tuple(value)
    else:
        ok = type(value).__name__ in kinds
    if not ok:
        raise ValueError(f"{where} must be {annotation}, got {value!r}")
    return value


def parse_overrides(items: list[str]) -> dict[str, dict]:
    """["rl.steps=2", "model.name=Qwen/Qwen2.5-3B-Instruct"] -> {"rl": {"steps": 2}, ...}"""
    out: dict[str, dict] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        section, dot, fld = key.partition(".")
        if not sep or not dot:
            raise SystemExit(f"--set expects section.field=value, got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw  # bare strings need no quotes
        out.setdefault(section, {})[fld] = value
    return out
