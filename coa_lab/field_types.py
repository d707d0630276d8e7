"""A value checked against a preset field's declared type (config.get_preset's overrides)."""

from __future__ import annotations

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
