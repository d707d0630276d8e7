"""See what the model sees: HTML views of CoA trajectories, SFT masks and training curves.

    from coa_lab.viz import show_trajectory, TrajectoryBrowser, mask_html, plot_curves
    show_trajectory(record)                       # one trajectory, coloured by agent role
    TrajectoryBrowser("runs/demo/sft/kept.jsonl")  # page through a file, filter by source/validity
    HTML(mask_html(tok, row["input_ids"], row["labels"]))  # which tokens the loss sees

Every view is a self-contained HTML string (inline styles, no scripts, no external assets),
so it renders the same in Jupyter, VS Code, Colab or a saved .html file. Styles are inline
rather than in a <style> block because some frontends sanitize <style> out of untrusted
outputs. Trajectory text is model output, hence untrusted: every piece of it is escaped.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Iterable, Sequence

from coa_lab import protocol
from coa_lab.protocol import DEFAULT_TOOLS, PROFILE_TOOLS, Step
from coa_lab.trajectories import TrajectoryRecord, load_records


def _show_figures_inline() -> None:
    """Let a notebook show a bare matplotlib Figure (what the plot helpers return) as an image.

    The inline backend registers IPython's PNG formatter only when pyplot is imported, which the
    lab never does (pyplot's global state would show each figure twice); without this a Figure
    displays as "<Figure size 640x320>" in JupyterLab (caught by tests/test_jupyterlab.py)."""
    try:
        from IPython import get_ipython
        from IPython.core.pylabtools import select_figure_formats
    except ImportError:  # plain Python: nothing to display into
        return
    shell = get_ipython()
    if shell is not None and hasattr(shell, "display_formatter"):
        select_figure_formats(shell, {"png"})


_show_figures_inline()

# One hue per agent role (Okabe-Ito-like, distinguishable with common colour-vision
# deficiencies); each is a (border, background) pair so text on it stays readable.
ROLE_COLOURS: dict[str, tuple[str, str]] = {
    "think": ("#0072b2", "#e3f0fa"),
    "plan": ("#e69f00", "#fdf1d8"),
    "reflection": ("#cc79a7", "#f8e6f0"),
    "suggested_answer": ("#009e73", "#dcf3ea"),
    "double_check": ("#6a3d9a", "#eee6f6"),
    "answer": ("#d55e00", "#fbe5d6"),
}
TOOL_COLOURS = ("#333333", "#f4f4f4")
OBSERVATION_COLOURS = ("#999999", "#eeeeee")
# Diagonal hatching = "not part of the loss", the same convention mask_html uses.
_HATCH = "repeating-linear-gradient(135deg,#eeeeee 0 8px,#e2e2e2 8px 16px)"
MASKED_BADGE = "masked (no loss)"
# Observations longer than this are folded into <details>: search results and program
# outputs can run to pages and would bury the agent's own reasoning.
COLLAPSE_CHARS = 400
COLLAPSE_LINES = 12

_FONT = "font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:13px;line-height:1.45"
_MONO = "font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px"
_PRE = f"margin:4px 0 0 0;white-space:pre-wrap;word-break:break-word;{_MONO}"


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _badge(label: str, colour: str, cls: str = "coa-badge") -> str:
    return (f'<span class="{cls}" style="display:inline-block;padding:0 6px;border-radius:8px;'
            f'background:{colour};color:#fff;font-size:11px;font-weight:600;margin-right:4px">'
            f"{_esc(label)}</span>")


def _box(cls: str, border: str, background: str, inner: str, tag: str = "") -> str:
    data = f' data-tag="{_esc(tag)}"' if tag else ""
    return (f'<div class="{cls}"{data} style="border-left:4px solid {border};background:{background};'
            f'padding:4px 8px;margin:4px 0;border-radius:3px">{inner}</div>')


def _unclosed_badge(step: Step) -> str:
    # A block without its closing tag is a truncated or malformed generation: flag it
    # where it happens, not only in the problem list at the bottom.
    return "" if step.closed else _badge("unclosed", "#b00020")


# ----------------------------------------------------------------------------- step views


def _role_html(step: Step) -> str:
    border, background = ROLE_COLOURS[step.tag]
    body = f'<div style="white-space:pre-wrap;word-break:break-word">{_esc(step.content.strip())}</div>'
    return _box(f"coa-step coa-role coa-role-{step.tag}", border, background,
                _badge(step.tag, border) + _unclosed_badge(step) + body, step.tag)


def _tool_html(step: Step) -> str:
    border, background = TOOL_COLOURS
    body = f'<pre style="{_PRE}">{_esc(step.content.strip())}</pre>'
    return _box("coa-step coa-tool", border, background,
                _badge(f"tool: {step.tag}", border, "coa-badge coa-tool-name") + _unclosed_badge(step) + body,
                step.tag)


def _is_long(content: str) -> bool:
    return len(content) > COLLAPSE_CHARS or content.count("\n") > COLLAPSE_LINES


def _observation_html(step: Step, show_mask: bool) -> str:
    border, background = OBSERVATION_COLOURS
    content = step.content.strip()
    badges = _badge("observation", "#777777")
    if show_mask:
        badges += _badge(MASKED_BADGE, "#555555", "coa-badge coa-masked")
        background = _HATCH
    badges += _unclosed_badge(step)
    pre = f'<pre style="{_PRE};color:#444">{_esc(content)}</pre>'
    if _is_long(content):
        summary = f"{len(content)} characters, {content.count(chr(10)) + 1} lines (click to expand)"
        pre = (f'<details><summary style="cursor:pointer;color:#555;font-size:12px">{_esc(summary)}</summary>'
               f"{pre}</details>")
    cls = "coa-step coa-observation" + (" coa-masked-step" if show_mask else "")
    return _box(cls, border, background, badges + pre)


def _text_html(step: Step) -> str:
    # Whitespace between blocks is normal formatting; anything else is stray text the
    # parser flagged, shown dimmed so it is visible but clearly outside every agent.
    return (f'<div class="coa-step coa-text" style="opacity:.55;font-style:italic;white-space:pre-wrap;'
            f'margin:4px 0;padding:0 8px">{_badge("stray text", "#999999")}{_esc(step.content.strip())}</div>')


def _step_html(step: Step, show_mask: bool) -> str:
    if step.kind == "role":
        return _role_html(step)
    if step.kind == "tool":
        return _tool_html(step)
    if step.kind == "observation":
        return _observation_html(step, show_mask)
    return _text_html(step) if step.content.strip() else ""


# ----------------------------------------------------------------------------- page parts


def legend_html(show_mask: bool = True) -> str:
    """Colour key: every role, tool calls and observations."""
    chips = [_badge(tag, border, f"coa-badge coa-legend-{tag}") for tag, (border, _) in ROLE_COLOURS.items()]
    chips.append(_badge("tool call", TOOL_COLOURS[0]))
    chips.append(_badge(MASKED_BADGE if show_mask else "observation", "#777777"))
    return f'<div class="coa-legend" style="margin:4px 0 8px 0">{"".join(chips)}</div>'


def _issue_list(heading: str, items: Sequence[str], colour: str, cls: str) -> str:
    rows = "".join(f"<li>{_esc(item)}</li>" for item in items)
    return (f'<div class="{cls}" style="margin-top:8px;color:{colour}"><b>{_esc(heading)}</b>'
            f'<ul style="margin:2px 0">{rows}</ul></div>')


def _violations(text: str, profile: str, tools: Iterable[str] | None) -> list[str]:
    # A viewer must show a bad record, not crash on it: an unknown profile is reported.
    try:
        return protocol.validate(text, profile, tools)
    except ValueError as exc:
        return [f"cannot validate: {exc}"]


def _issues_html(traj: protocol.Trajectory, text: str, profile: str | None, tools: Iterable[str] | None) -> str:
    parts = []
    if traj.problems:
        parts.append(_issue_list(f"Parse problems ({len(traj.problems)})", traj.problems, "#8a4b00", "coa-problems"))
    if profile is None:
        return "".join(parts)
    # validate() repeats the parse problems; list only what the grammar adds.
    violations = [v for v in _violations(text, profile, tools) if v not in traj.problems]
    if violations:
        parts.append(_issue_list(f"Grammar violations for the {profile} agent ({len(violations)})",
                                 violations, "#b00020", "coa-violations"))
    elif not traj.problems:
        parts.append(f'<div class="coa-valid" style="margin-top:8px;color:#007a4d"><b>Valid</b> '
                     f"for the {_esc(profile)} agent grammar.</div>")
    return "".join(parts)


def _parse_tools(profile: str | None, tools: Iterable[str] | None) -> tuple[str, ...]:
    if tools is not None:
        return tuple(tools)
    return tuple(DEFAULT_TOOLS) + tuple(PROFILE_TOOLS.get(profile or "", ()))


def _document(title: str | None, header: str, body: str) -> str:
    heading = f'<h3 style="margin:0 0 4px 0">{_esc(title)}</h3>' if title else ""
    return f'<div class="coa-trajectory" style="{_FONT};max-width:960px">{heading}{header}{body}</div>'


def _trajectory_body(text: str, profile: str | None, tools, show_mask: bool) -> str:
    traj = protocol.parse(text, _parse_tools(profile, tools))
    steps = "".join(_step_html(step, show_mask) for step in traj.steps)
    if not traj.steps:
        steps = '<div style="color:#888">(empty trajectory)</div>'
    return legend_html(show_mask) + steps + _issues_html(traj, text, profile, tools)


def trajectory_html(text: str, profile: str | None = None, tools=None, show_mask: bool = True,
                    title: str | None = None) -> str:
    """A CoA trajectory as self-contained HTML, one colour per agent role.

    profile: also check the grammar of that agent profile and list the violations.
    tools: tool names to recognise (default: the built-ins plus the profile's tools).
    show_mask: mark observations as masked out of the SFT/RL loss.
    """
    return _document(title, "", _trajectory_body(text, profile, tools, show_mask))


# The teacher's agents, coloured like the CoA roles they become after distillation.
AGENT_COLOURS = {"planner": ROLE_COLOURS["plan"], "thinker": ROLE_COLOURS["think"],
                 "reflector": ROLE_COLOURS["reflection"], "answerer": ROLE_COLOURS["answer"]}


def team_run_html(run, title: str | None = None) -> str:
    """A multi-agent teacher run (agents/teacher.py TeacherRun), agent by agent: the agent's
    own context (folded: instruction, worked examples, the task as handed over), what it
    said, the tool call the orchestrator ran and its observation, and the tokens it cost."""
    boxes = []
    for act in run.activations:
        border, background = AGENT_COLOURS.get(act.agent, TOOL_COLOURS)
        context = "".join(f'<div><b>{_esc(m["role"])}</b>: <pre style="{_PRE}">{_esc(m["content"])}</pre></div>'
                          for m in act.messages)
        inner = (f"{_badge(act.agent, border)} <span style=\"color:#555\">{act.prompt_tokens} prompt + "
                 f"{act.completion_tokens} output tokens, {len(act.messages)} messages of context</span>"
                 f"<details><summary>its own context</summary>{context}</details>"
                 f'<pre style="{_PRE}">{_esc(act.output)}</pre>')
        if act.tool:
            ok = "ok" if act.tool_ok else "failed"
            inner += (f"<div>{_badge(act.tool, TOOL_COLOURS[0])}<pre style=\"{_PRE}\">{_esc(act.tool_input)}</pre></div>"
                      f'<div style="background:{OBSERVATION_COLOURS[1]};padding:2px 6px">observation ({ok}):'
                      f'<pre style="{_PRE}">{_esc(act.observation)}</pre></div>')
        boxes.append(_box("coa-agent", border, background, inner, act.agent))
    header = (f"<div>{_esc(run.question)} — final answer <b>{_esc(run.final_answer)}</b> "
              f"(gold {_esc(', '.join(run.answers))}); {run.tokens} tokens, {len(run.activations)} agent calls, "
              f"{run.tool_calls} tool calls{'; error: ' + _esc(run.error) if run.error else ''}</div>")
    return _document(title, header, "".join(boxes))


def _header_row(name: str, value: object) -> str:
    return (f'<tr><th style="text-align:left;padding-right:8px;vertical-align:top;color:#555">{_esc(name)}</th>'
            f'<td style="white-space:pre-wrap">{_esc(value)}</td></tr>')


def record_header_html(record: TrajectoryRecord) -> str:
    """Where a trajectory came from and how it scored."""
    rows = [("source", record.source), ("profile", record.profile),
            ("reward", "n/a" if record.reward is None else record.reward),
            ("question", record.question), ("gold", " | ".join(map(str, record.answers)))]
    table = "".join(_header_row(name, value) for name, value in rows)
    return f'<table class="coa-header" style="border-collapse:collapse;margin-bottom:6px">{table}</table>'


def record_html(record: TrajectoryRecord, show_mask: bool = True, tools=None, title: str | None = None) -> str:
    """A record's trajectory under a header, validated against the record's own profile."""
    body = _trajectory_body(record.text, record.profile, tools, show_mask)
    return _document(title if title is not None else record.id, record_header_html(record), body)


def _as_record(obj) -> TrajectoryRecord:
    # Importers hand out ImportedTrajectory objects; they know how to become records.
    if isinstance(obj, TrajectoryRecord):
        return obj
    if hasattr(obj, "to_record"):
        return obj.to_record()
    raise TypeError(f"expected a str or a TrajectoryRecord, got {type(obj).__name__}")


def show_trajectory(text_or_record, **kw):
    """IPython HTML for a trajectory string, or a record (with its source/profile/reward header).

    Keyword arguments go to trajectory_html (for a string) or record_html (for a record).
    """
    from IPython.display import HTML

    if isinstance(text_or_record, str):
        return HTML(trajectory_html(text_or_record, **kw))
    return HTML(record_html(_as_record(text_or_record), **kw))


# ----------------------------------------------------------------------------- SFT mask view

IGNORE_INDEX = -100  # same as coa_lab.sft.IGNORE_INDEX; not imported, to keep torch optional
_TRAINED_STYLE = "background:#c8f0d2;border-bottom:2px solid #2e9e53"
_MASKED_STYLE = f"background:{_HATCH};color:#999;text-decoration:line-through"


def _as_list(values) -> list[int]:
    # Accept lists, tuples, numpy arrays and torch tensors alike.
    return [int(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]


def _token_text(tokenizer, token_id: int) -> str:
    # Decoded one at a time, a token holding part of a multi-byte character shows as U+FFFD;
    # that is the honest view of what the model sees.
    text = tokenizer.decode([token_id])
    # Make whitespace visible: a masked newline must still show up as a masked token.
    return text.replace("\n", "\u21b5\n").replace("\t", "\u2192") or "\u2205"


def _mask_summary(n_tokens: int, n_masked: int) -> str:
    return (f'<div class="coa-mask-summary" style="margin-bottom:6px">{n_tokens} tokens: '
            f'<span style="{_TRAINED_STYLE}">{n_tokens - n_masked} trained</span>, '
            f'<span style="background:{_HATCH};color:#666">{n_masked} masked (label -100)</span></div>')


def mask_html(tokenizer, input_ids, labels) -> str:
    """Token-level view of one SFT example: trained tokens highlighted, -100 tokens struck out."""
    ids, labs = _as_list(input_ids), _as_list(labels)
    if len(ids) != len(labs):
        raise ValueError(f"input_ids has {len(ids)} tokens but labels has {len(labs)}")
    spans = []
    for position, (token_id, label) in enumerate(zip(ids, labs)):
        masked = label == IGNORE_INDEX
        cls = "coa-tok coa-tok-masked" if masked else "coa-tok coa-tok-trained"
        style = _MASKED_STYLE if masked else _TRAINED_STYLE
        spans.append(f'<span class="{cls}" title="#{position} id={token_id}" '
                     f'style="{style};margin:0 1px">{_esc(_token_text(tokenizer, token_id))}</span>')
    n_masked = sum(label == IGNORE_INDEX for label in labs)
    tokens = f'<div style="white-space:pre-wrap;word-break:break-word;{_MONO};line-height:1.8">{"".join(spans)}</div>'
    return f'<div class="coa-mask" style="{_FONT}">{_mask_summary(len(ids), n_masked)}{tokens}</div>'


# ----------------------------------------------------------------------------- browser

SOURCE_ALL = "all"
VALIDITY_CHOICES = ("all", "valid", "invalid")


def _load_path(path: str | Path) -> list[TrajectoryRecord]:
    """Records JSONL, or a raw FireAct/ToRA file (converted on the fly by the importers)."""
    path = Path(path)
    with open(path, encoding="utf-8") as fh:
        first = next((line for line in fh if line.strip()), "")
    try:
        row = json.loads(first) if first else {}
    except json.JSONDecodeError:
        row = {}  # let load_records name the broken line
    if isinstance(row, dict) and row and "text" not in row:
        from coa_lab.distill.importers import detect_trajectory_format, load_imported

        if detect_trajectory_format(row) is not None:
            return [t.to_record() for t in load_imported(path)]
    return load_records(path)


def _is_valid(record: TrajectoryRecord) -> bool:
    return not _violations(record.text, record.profile, None)


class TrajectoryBrowser:
    """Page through trajectories with Previous/Next, filtered by source and grammar validity.

    Navigation wraps around: Next on the last match shows the first, Previous on the first
    shows the last. The logic (next/prev/set_filter, position, current, html) works without
    a notebook frontend; `.widget` is the ipywidgets VBox.
    """

    def __init__(self, records_or_path, show_mask: bool = True):
        import ipywidgets as w

        if isinstance(records_or_path, (str, Path)):
            records = _load_path(records_or_path)
        else:
            records = [_as_record(r) for r in records_or_path]
        self.records: list[TrajectoryRecord] = records
        self.show_mask = show_mask
        self._valid: dict[int, bool] = {}  # validated lazily: only when filtering by validity
        self.indices: list[int] = list(range(len(records)))
        self.position = 0
        self._syncing = False

        sources = sorted({r.source for r in records})
        self._prev_button = w.Button(description="Previous", icon="arrow-left")
        self._next_button = w.Button(description="Next", icon="arrow-right")
        self._label = w.Label()
        self._source = w.Dropdown(options=[SOURCE_ALL, *sources], value=SOURCE_ALL, description="source")
        self._validity = w.Dropdown(options=list(VALIDITY_CHOICES), value="all", description="validity")
        self._output = w.HTML()
        self._prev_button.on_click(lambda _: self.prev())
        self._next_button.on_click(lambda _: self.next())
        self._source.observe(self._on_dropdown, names="value")
        self._validity.observe(self._on_dropdown, names="value")
        controls = w.HBox([self._prev_button, self._label, self._next_button, self._source, self._validity])
        self.widget = w.VBox([controls, self._output])
        self._render()

    # -- filtering

    def valid(self, index: int) -> bool:
        """Whether records[index] follows its profile's grammar (cached)."""
        if index not in self._valid:
            self._valid[index] = _is_valid(self.records[index])
        return self._valid[index]

    def _matches(self, index: int, source: str, validity: str) -> bool:
        if source != SOURCE_ALL and self.records[index].source != source:
            return False
        if validity == "all":
            return True
        return self.valid(index) == (validity == "valid")

    def set_filter(self, source: str | None = None, validity: str | None = None) -> int:
        """Show only records of `source` and `validity` ("valid"/"invalid"); None or "all"
        lifts that filter. Jumps to the first match and returns the number of matches."""
        source = source or SOURCE_ALL
        validity = validity or "all"
        if source not in self._source.options:
            raise ValueError(f"unknown source {source!r}; choose from {list(self._source.options)}")
        if validity not in VALIDITY_CHOICES:
            raise ValueError(f"unknown validity {validity!r}; choose from {list(VALIDITY_CHOICES)}")
        # Keep the dropdowns in step without their observers re-entering set_filter.
        self._syncing = True
        try:
            self._source.value, self._validity.value = source, validity
        finally:
            self._syncing = False
        self.indices = [i for i in range(len(self.records)) if self._matches(i, source, validity)]
        self.position = 0
        self._render()
        return len(self.indices)

    def _on_dropdown(self, _change) -> None:
        if not self._syncing:
            self.set_filter(self._source.value, self._validity.value)

    # -- navigation

    @property
    def current(self) -> TrajectoryRecord | None:
        return self.records[self.indices[self.position]] if self.indices else None

    def next(self) -> TrajectoryRecord | None:
        if self.indices:
            self.position = (self.position + 1) % len(self.indices)
        self._render()
        return self.current

    def prev(self) -> TrajectoryRecord | None:
        if self.indices:
            self.position = (self.position - 1) % len(self.indices)
        self._render()
        return self.current

    # -- display

    @property
    def label(self) -> str:
        return self._label.value

    @property
    def html(self) -> str:
        return self._output.value

    def _empty_message(self) -> str:
        if not self.records:
            why = "This collection has no trajectories."
        else:
            why = (f"No trajectory matches source = {self._source.value!r} and validity = "
                   f"{self._validity.value!r}. Choose 'all' in a filter to see more.")
        return f'<div class="coa-empty" style="{_FONT};color:#666;padding:12px">{_esc(why)}</div>'

    def _render(self) -> None:
        n = len(self.indices)
        self._label.value = f"{self.position + 1 if n else 0} / {n}"
        self._prev_button.disabled = self._next_button.disabled = n <= 1
        record = self.current
        self._output.value = self._empty_message() if record is None else record_html(record, self.show_mask)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


# ----------------------------------------------------------------------------- curves


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
    import platform
    import subprocess
    import time

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    try:
        git = lambda *args: subprocess.run(["git", *args], capture_output=True, text=True,  # noqa: E731
                                           cwd=path.parent, timeout=10).stdout.strip()
        commit = git("rev-parse", "--short", "HEAD") or None
        if commit and git("status", "--porcelain", "--untracked-files=no", "--", "coa_lab", "notebooks/*.ipynb"):
            commit += "+uncommitted"  # the code that drew it differs from that commit
    except (OSError, subprocess.SubprocessError):
        commit = None  # not a git checkout: the figure is still real, its commit unknown
    meta = {"figure": path.name, "date": time.strftime("%Y-%m-%d"), "commit": commit,
            "machine": f"{platform.machine()}, {os.cpu_count()} cores", "data": data}
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
