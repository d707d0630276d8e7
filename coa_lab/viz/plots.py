"""Training curves and bar charts as bare matplotlib Figures, and `save_figure`, which keeps
the numbers a figure plots beside it.

    fig = plot_curves({"train loss": losses})
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

from coa_lab.machine import machine_peak
from coa_lab.paths import PROJECT_ROOT


def plot_curves(values: dict[str, list[float]], title: str = "", ylabel: str = "", xlabel: str = "step"):
    """One line per series (e.g. {"train loss": [...]}) on a fresh Figure, which is returned.

    A bare Figure, not pyplot: nothing global is touched, and a notebook shows the returned
    figure once instead of twice.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.2), layout="constrained")
    ax = fig.add_subplot()
    series = {name: list(ys) for name, ys in values.items() if len(ys)}
    for name, ys in series.items():
        ax.plot(range(1, len(ys) + 1), ys, label=name, marker="o" if len(ys) < 30 else None)
    if not series:
        ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes, color="#888")
    elif len(series) > 1:
        ax.legend()
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    return fig


def save_figure(fig, path: str | Path, data: dict) -> Path:
    """Write `fig` as PNG and, beside it, the numbers it plots with where and when they were
    measured (`<name>.json`). A notebook's full run saves into notebooks/figures/, which its
    text embeds: a reader on a code host sees the result of a real run without running it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)

    try:
        # the commit of the code that drew it: the lab's checkout, wherever the figure is written
        # (a benchmark runs the notebooks in a scratch copy outside the repository)
        git = lambda *args: subprocess.run(["git", *args], capture_output=True, text=True,  # noqa: E731
                                           cwd=PROJECT_ROOT, timeout=10).stdout.strip()
        commit = git("rev-parse", "--short", "HEAD") or None
        if commit and git("status", "--porcelain", "--untracked-files=no", "--", "coa_lab", "notebooks/*.ipynb"):
            commit += "+uncommitted"  # the code that drew it differs from that commit
    except (OSError, subprocess.SubprocessError):
        commit = None  # not a git checkout: the figure is still real, its commit unknown
    # the matmul probe beside the numbers: a figure's seconds mean little without it
    meta = {"figure": path.name, "date": time.strftime("%Y-%m-%d"), "commit": commit,
            "machine": f"{platform.machine()}, {os.cpu_count()} cores", "probe": machine_peak(), "data": data}
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    return path


def plot_bars(values: dict[str, dict[str, float]], title: str = "", ylabel: str = "", ylim=None):
    """Grouped bars: {group: {series: value}} -> one cluster per group, one colour per series
    (e.g. {"accuracy": {"masked": 0.8, "unmasked": 0.7}, ...}). A bare Figure, as plot_curves."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.2), layout="constrained")
    ax = fig.add_subplot()
    groups = list(values)
    series = list(dict.fromkeys(s for g in groups for s in values[g]))
    width = 0.8 / max(1, len(series))
    for i, name in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ys = [values[g].get(name, 0.0) for g in groups]
        bars = ax.bar(xs, ys, width, label=name)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(groups)), groups)
    ax.set(title=title, ylabel=ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    if len(series) > 1:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return fig


class LiveCurves:
    """A curve redrawn after every step of a running stage: pass `live.on_step` to
    `train_rl(on_step=...)`. `series` maps a label to a function of the step's metrics row (None
    where the row has no value, e.g. a step without an update). In a notebook the figure is
    replaced in place (one output, updated); elsewhere nothing is displayed and `values` still
    collects the points."""

    def __init__(self, series: dict, title: str = "", ylabel: str = ""):
        self.series, self.title, self.ylabel = series, title, ylabel
        self.values: dict[str, list[float]] = {name: [] for name in series}
        self._handle = None

    def on_step(self, step: int, row: dict, model=None) -> None:
        for name, read in self.series.items():
            value = read(row)
            self.values[name].append(float("nan") if value is None else float(value))
        fig = plot_curves(self.values, title=f"{self.title} (step {step + 1})", ylabel=self.ylabel)
        try:
            from IPython import get_ipython
            from IPython.display import display
        except ImportError:  # no IPython: a script's caller reads self.values
            return
        if get_ipython() is None:
            return
        if self._handle is None:
            self._handle = display(fig, display_id=True)
        else:
            self._handle.update(fig)
