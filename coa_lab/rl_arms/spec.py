"""Arms: a name and the settings it changes, written as --set overrides.

`--arm NAME=SECTION.FIELD=VALUE[,SECTION.FIELD=VALUE...]` defines one; a bare built-in name is a
shortcut. Every arm is checked against the preset (get_preset) before any work starts, so a typo'd
field fails in a second, not after an hour of training."""

from __future__ import annotations

import re

from coa_lab.config import Preset, get_preset
from coa_lab.field_types import parse_overrides

# the arms of benchmarks/rl_arms.py, and RFT (rejection-sampling fine-tuning: rl.advantage = "rft"); each
# names its SFT mix, so an arm means the same whichever mix the preset's recipe has
BUILTIN: dict[str, dict] = {
    "rl+ptx": {"rl": {"sft_coef": 1.0}},  # policy gradient + the SFT loss mixed in (PPO-ptx)
    "rl": {"rl": {"sft_coef": 0.0}},  # the policy gradient alone
    "control": {"rl": {"pg_coef": 0.0, "sft_coef": 1.0}},  # the SFT loss alone, same steps and rows: nothing sampled
    "rft": {"rl": {"advantage": "rft", "sft_coef": 0.0}},
}
_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")  # a file name too: scores/<arm>_seed<s>.json
# split "a.b=1,c.d=[1,2]" only before the next "section.field=": a value may hold commas (JSON)
_NEXT = re.compile(r",(?=[A-Za-z_]\w*\.[A-Za-z_]\w*=)")


def parse_arm(text: str) -> tuple[str, dict]:
    """"kl=rl.kl_coef=0.05,rl.sft_coef=0" -> ("kl", {"rl": {"kl_coef": 0.05, "sft_coef": 0}});
    "control" -> the built-in."""
    name, sep, rest = text.partition("=")
    if not _NAME.match(name) or name == "sft":  # "sft" names the start every arm is paired against
        raise SystemExit(f"coa-lab arms: bad arm name {name!r} (letters, digits, _ . + - ; not 'sft')")
    if not sep:
        if name not in BUILTIN:
            raise SystemExit(f"coa-lab arms: unknown arm {name!r}: built-ins are {', '.join(BUILTIN)}; "
                             f"define others as NAME=SECTION.FIELD=VALUE[,...]")
        return name, BUILTIN[name]
    items = _NEXT.split(rest) if rest else []
    try:
        return name, parse_overrides(items)
    except SystemExit as exc:
        raise SystemExit(f"coa-lab arms: arm {name!r}: {exc.code}") from None


def layered(base: Preset, *layers: dict) -> Preset:
    """`base` with each layer of overrides laid over it in turn (section by section), checked by
    get_preset: an unknown section or field raises ValueError naming it."""
    merged = base.to_dict()
    name = merged.pop("name")
    for layer in layers:
        for section, values in layer.items():
            if isinstance(values, dict) and isinstance(merged.get(section), dict):
                merged[section] = {**merged[section], **values}
            else:
                merged[section] = values
    return get_preset(name, **merged)


def arm_preset(base: Preset, name: str, overrides: dict, seed: int | None = None) -> Preset:
    """One arm's settings (at one seed: rl.seed), or a clear error naming the arm."""
    seeded = {"rl": {"seed": seed}} if seed is not None else {}
    try:
        return layered(base, overrides, seeded)
    except ValueError as exc:
        raise SystemExit(f"coa-lab arms: arm {name!r}: {exc}") from None


def check_arms(base: Preset, arms: dict[str, dict]) -> None:
    """Every arm resolves to valid settings, and the SFT mix is there where an arm needs it."""
    for name, overrides in arms.items():
        preset = arm_preset(base, name, overrides)
        if preset.rl.pg_coef == 0 and preset.rl.sft_coef <= 0:
            raise SystemExit(f"coa-lab arms: arm {name!r} has rl.pg_coef = 0 and rl.sft_coef = 0: it would "
                             f"train nothing (the control is the SFT mix alone: it needs rl.sft_coef > 0)")


def parse_adapters(items: list[str]) -> dict[tuple[str, int], str]:
    """--adapters NAME[@SEED]=DIR ... -> {(name, seed): dir}: seeds of one arm share its name."""
    out: dict[tuple[str, int], str] = {}
    for item in items:
        key, sep, path = item.partition("=")
        name, at, seed = key.partition("@")
        if not sep or not path or not _NAME.match(name) or name == "sft" or (at and not seed.isdigit()):
            raise SystemExit(f"coa-lab arms: --adapters expects NAME[@SEED]=DIR (NAME not 'sft'), got {item!r}")
        out[(name, int(seed) if at else 0)] = path
    return out
