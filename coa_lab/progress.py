"""Progress bars: tqdm, silenced by TQDM_DISABLE=1 everywhere.

tqdm reads TQDM_DISABLE only as a default, and a bar created with an explicit `disable=False`
(the lab's bars are switched on or off per call: one per process, none in tests) draws anyway.
Every bar of the lab comes from here, so the variable wins over the call's choice."""

from __future__ import annotations

import os


def silenced() -> bool:
    """TQDM_DISABLE set to anything but '', '0', 'false' or 'no'."""
    return os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false", "no")


def progress_bar(*args, disable: bool = False, **kwargs):
    """tqdm.auto.tqdm(*args, **kwargs), off when `disable` or TQDM_DISABLE says so."""
    from tqdm.auto import tqdm

    return tqdm(*args, disable=disable or silenced(), **kwargs)
