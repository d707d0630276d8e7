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
from coa_lab.paths import PROJECT_ROOT, portable_paths


def plot_curves(values: dict[str, list[float]], title: str = "", ylabel: str = "", xlabel: str = "step",
                first_step: int = 1, bands: dict[str, tuple[list[float], list[float]]] | None = None):
    """One line per series (e.g. {"train loss": [...]}) on a fresh Figure, which is returned.

    first_step: the number of the first point, as the text names steps (RL's log counts from 0,
    an SFT run's optimizer steps from 1); the x axis ticks whole steps only.
    bands: {series: (low, high)}, a shaded interval around that series (say what it is in the
    legend label or the title: seeds' range, a standard error).

    A bare Figure, not pyplot: nothing global is touched, and a notebook shows the returned
    figure once instead of twice.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.2), layout="constrained")
    ax = fig.add_subplot()
    series = {name: list(ys) for name, ys in values.items() if len(ys)}
    for name, ys in series.items():
        xs = range(first_step, first_step + len(ys))
        line, = ax.plot(xs, ys, label=name, marker="o" if len(ys) < 30 else None)
        if bands and name in bands:
            low, high = bands[name]
            ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    if not series:
        ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes, color="#888")
    elif len(series) > 1:
        ax.legend(fontsize=8)
    step_axis(ax, max(map(len, series.values()), default=0), first_step)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    return fig


def step_axis(ax, points: int, first_step: int = 0) -> None:
    """Whole-number ticks on an x axis of `points` steps numbered from `first_step`: matplotlib's
    default ticks 1.25, 1.5, ... on a short run, and pads a one-point axis by fractions."""
    from matplotlib.ticker import MaxNLocator

    if points == 1:
        ax.set_xlim(first_step - 1, first_step + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def figure_problems(fig) -> list[str]:
    """What would keep a learner from reading `fig` at a glance: a title or axis label cut off at
    the figure's edge, or fractional ticks (1.25, 1.5, ...) on an axis whose points all sit at
    whole numbers (steps, k, epochs). save_figure refuses a figure with any, so every notebook's
    smoke run checks the figures its full run publishes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not hasattr(fig.canvas, "get_renderer"):  # a bare Figure: the Agg canvas savefig would use for a PNG
        FigureCanvasAgg(fig)
    fig.draw_without_rendering()  # lays the figure out (constrained layout included) as savefig will
    renderer = fig.canvas.get_renderer()
    edge = fig.bbox
    problems = []
    for n, ax in enumerate(fig.axes):
        name = ax.get_title() or f"axes {n}"
        for text in (ax.title, ax.xaxis.label, ax.yaxis.label, getattr(fig, "_suptitle", None)):
            if text is None or not text.get_text():
                continue
            box = text.get_window_extent(renderer)
            if box.x0 < edge.x0 - 1 or box.x1 > edge.x1 + 1 or box.y0 < edge.y0 - 1 or box.y1 > edge.y1 + 1:
                problems.append(f"{name}: {text.get_text()!r} is cut off at the figure's edge")
        xs = [x for line in ax.get_lines() for x in line.get_xdata()]
        if xs and all(float(x) == int(x) for x in xs if x == x):
            lo, hi = ax.get_xlim()
            fractional = [t for t in ax.get_xticks() if lo <= t <= hi and float(t) != int(t)]
            if fractional:
                problems.append(f"{name}: whole-number points on fractional x ticks {fractional[:3]}")
    return problems


def save_figure(fig, path: str | Path, data: dict) -> Path:
    """Write `fig` as PNG and, beside it, the numbers it plots with where and when they were
    measured (`<name>.json`). A notebook's full run saves into notebooks/figures/, which its
    text embeds: a reader on a code host sees the result of a real run without running it.
    A figure with a clipped title or fractional step ticks is refused (figure_problems)."""
    problems = figure_problems(fig)
    if problems:
        raise ValueError(f"{Path(path).name} is not readable at a glance: " + "; ".join(problems))
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
            "machine": f"{platform.machine()}, {os.cpu_count()} cores", "probe": machine_peak(),
            "data": portable_paths(data)}  # committed: its paths (a command line's too) never absolute
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

    def __init__(self, series: dict, title: str = "", ylabel: str = "", first_step: int = 0):
        self.series, self.title, self.ylabel, self.first_step = series, title, ylabel, first_step
        self.values: dict[str, list[float]] = {name: [] for name in series}
        self._handle = None

    def on_step(self, step: int, row: dict, model=None) -> None:
        for name, read in self.series.items():
            value = read(row)
            self.values[name].append(float("nan") if value is None else float(value))
        fig = plot_curves(self.values, title=f"{self.title} (step {step})", ylabel=self.ylabel,
                          first_step=self.first_step)
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
