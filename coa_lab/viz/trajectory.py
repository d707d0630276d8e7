"""A CoA trajectory (or a teacher's team run) as self-contained HTML, coloured by agent role.

    from coa_lab.viz.trajectory import show_trajectory
    show_trajectory(record)                       # one trajectory, coloured by agent role

Every view is a self-contained HTML string (inline styles, no scripts, no external assets),
so it renders the same in Jupyter, VS Code, Colab or a saved .html file. Trajectory text is
model output, hence untrusted: every piece of it is escaped.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from coa_lab import protocol
from coa_lab.protocol import DEFAULT_TOOLS, PROFILE_TOOLS, Step
from coa_lab.trajectories import TrajectoryRecord
from coa_lab.viz.style import (FONT, HATCH, OBSERVATION_COLOURS, PRE, ROLE_COLOURS, TOOL_COLOURS, badge, box,
                               esc)

MASKED_BADGE = "masked (no loss)"
# Observations longer than this are folded into <details>: search results and program
# outputs can run to pages and would bury the agent's own reasoning.
COLLAPSE_CHARS = 400
COLLAPSE_LINES = 12


def _unclosed_badge(step: Step) -> str:
    # A block without its closing tag is a truncated or malformed generation: flag it
    # where it happens, not only in the problem list at the bottom.
    return "" if step.closed else badge("unclosed", "#b00020")


# ----------------------------------------------------------------------------- step views


def _role_html(step: Step) -> str:
    border, background = ROLE_COLOURS[step.tag]
    body = f'<div style="white-space:pre-wrap;word-break:break-word">{esc(step.content.strip())}</div>'
    return box(f"coa-step coa-role coa-role-{step.tag}", border, background,
               badge(step.tag, border) + _unclosed_badge(step) + body, step.tag)


def _tool_html(step: Step) -> str:
    border, background = TOOL_COLOURS
    body = f'<pre style="{PRE}">{esc(step.content.strip())}</pre>'
    return box("coa-step coa-tool", border, background,
               badge(f"tool: {step.tag}", border, "coa-badge coa-tool-name") + _unclosed_badge(step) + body,
               step.tag)


def _is_long(content: str) -> bool:
    return len(content) > COLLAPSE_CHARS or content.count("\n") > COLLAPSE_LINES


def _observation_html(step: Step, show_mask: bool) -> str:
    border, background = OBSERVATION_COLOURS
    content = step.content.strip()
    badges = badge("observation", "#777777")
    if show_mask:
        badges += badge(MASKED_BADGE, "#555555", "coa-badge coa-masked")
        background = HATCH
    badges += _unclosed_badge(step)
    pre = f'<pre style="{PRE};color:#444">{esc(content)}</pre>'
    if _is_long(content):
        summary = f"{len(content)} characters, {content.count(chr(10)) + 1} lines (click to expand)"
        pre = (f'<details><summary style="cursor:pointer;color:#555;font-size:12px">{esc(summary)}</summary>'
               f"{pre}</details>")
    cls = "coa-step coa-observation" + (" coa-masked-step" if show_mask else "")
    return box(cls, border, background, badges + pre)


def _text_html(step: Step) -> str:
    # Whitespace between blocks is normal formatting; anything else is stray text the
    # parser flagged, shown dimmed so it is visible but clearly outside every agent.
    return (f'<div class="coa-step coa-text" style="opacity:.55;font-style:italic;white-space:pre-wrap;'
            f'margin:4px 0;padding:0 8px">{badge("stray text", "#999999")}{esc(step.content.strip())}</div>')


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
    chips = [badge(tag, border, f"coa-badge coa-legend-{tag}") for tag, (border, _) in ROLE_COLOURS.items()]
    chips.append(badge("tool call", TOOL_COLOURS[0]))
    chips.append(badge(MASKED_BADGE if show_mask else "observation", "#777777"))
    return f'<div class="coa-legend" style="margin:4px 0 8px 0">{"".join(chips)}</div>'


def _issue_list(heading: str, items: Sequence[str], colour: str, cls: str) -> str:
    rows = "".join(f"<li>{esc(item)}</li>" for item in items)
    return (f'<div class="{cls}" style="margin-top:8px;color:{colour}"><b>{esc(heading)}</b>'
            f'<ul style="margin:2px 0">{rows}</ul></div>')


def grammar_violations(text: str, profile: str, tools: Iterable[str] | None) -> list[str]:
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
    violations = [v for v in grammar_violations(text, profile, tools) if v not in traj.problems]
    if violations:
        parts.append(_issue_list(f"Grammar violations for the {profile} agent ({len(violations)})",
                                 violations, "#b00020", "coa-violations"))
    elif not traj.problems:
        parts.append(f'<div class="coa-valid" style="margin-top:8px;color:#007a4d"><b>Valid</b> '
                     f"for the {esc(profile)} agent grammar.</div>")
    return "".join(parts)


def _parse_tools(profile: str | None, tools: Iterable[str] | None) -> tuple[str, ...]:
    if tools is not None:
        return tuple(tools)
    return tuple(DEFAULT_TOOLS) + tuple(PROFILE_TOOLS.get(profile or "", ()))


def _document(title: str | None, header: str, body: str) -> str:
    heading = f'<h3 style="margin:0 0 4px 0">{esc(title)}</h3>' if title else ""
    return f'<div class="coa-trajectory" style="{FONT};max-width:960px">{heading}{header}{body}</div>'


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
    """A multi-agent teacher run (capture/teacher.py TeacherRun), agent by agent: the agent's
    own context (folded: instruction, worked examples, the task as handed over), what it
    said, the tool call the orchestrator ran and its observation, and the tokens it cost."""
    boxes = []
    for act in run.activations:
        border, background = AGENT_COLOURS.get(act.agent, TOOL_COLOURS)
        context = "".join(f'<div><b>{esc(m["role"])}</b>: <pre style="{PRE}">{esc(m["content"])}</pre></div>'
                          for m in act.messages)
        inner = (f"{badge(act.agent, border)} <span style=\"color:#555\">{act.prompt_tokens} prompt + "
                 f"{act.completion_tokens} output tokens, {len(act.messages)} messages of context</span>"
                 f"<details><summary>its own context</summary>{context}</details>"
                 f'<pre style="{PRE}">{esc(act.output)}</pre>')
        if act.tool:
            ok = "ok" if act.tool_ok else "failed"
            inner += (f"<div>{badge(act.tool, TOOL_COLOURS[0])}<pre style=\"{PRE}\">{esc(act.tool_input)}</pre></div>"
                      f'<div style="background:{OBSERVATION_COLOURS[1]};padding:2px 6px">observation ({ok}):'
                      f'<pre style="{PRE}">{esc(act.observation)}</pre></div>')
        boxes.append(box("coa-agent", border, background, inner, act.agent))
    header = (f"<div>{esc(run.question)} — final answer <b>{esc(run.final_answer)}</b> "
              f"(gold {esc(', '.join(run.answers))}); {run.tokens} tokens, {len(run.activations)} agent calls, "
              f"{run.tool_calls} tool calls{'; error: ' + esc(run.error) if run.error else ''}</div>")
    return _document(title, header, "".join(boxes))


def _header_row(name: str, value: object) -> str:
    return (f'<tr><th style="text-align:left;padding-right:8px;vertical-align:top;color:#555">{esc(name)}</th>'
            f'<td style="white-space:pre-wrap">{esc(value)}</td></tr>')


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


def as_record(obj) -> TrajectoryRecord:
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
    return HTML(record_html(as_record(text_or_record), **kw))

