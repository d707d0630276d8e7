"""The Chain-of-Agents trajectory format: parse, render, validate, and the rollout helpers.

A CoA trajectory is ONE assistant turn in which the model "activates" agents by writing
plain-text tagged blocks (no special tokens, as in the AFM release):

    <think>..</think> <plan>..</plan> <reflection>..</reflection>
    <suggested_answer>..</suggested_answer> <double_check>..</double_check> <answer>..</answer>
    <TOOL>call</TOOL>              # the tag IS the tool name: wiki_search, code, web_search, ...
    <observation>..</observation>  # written by the environment, never by the model

`parse` never raises on model output: real generations are truncated, unclosed, nested,
odd-cased or sprinkled with stray text, and every such problem is recorded on the result
instead. Each step keeps its raw opening/closing tag, so `render(parse(t)) == t` for ANY
string t, not just well-formed ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

ROLE_TAGS = ("think", "plan", "reflection", "suggested_answer", "double_check", "answer")
OBSERVATION = "observation"
# Built-in tools; a custom ToolRegistry passes its own names to parse()/stop_strings().
DEFAULT_TOOLS = ("code", "wiki_search", "web_search", "crawl_page")

# Tools each agent profile is prompted with (arXiv 2508.13167: the MHQA, web and code/math agents).
PROFILE_TOOLS = {
    "mhqa": ("wiki_search",),
    "math": ("code",),
    "code": ("code",),
    "web": ("web_search", "crawl_page"),
}

_TAG_RE = re.compile(r"<(/?)\s*([A-Za-z_][\w-]*)\s*>")


@dataclass
class Step:
    """One piece of a trajectory.

    kind: "role" | "tool" | "observation" | "text" (anything between blocks).
    tag: canonical lowercase tag name ("" for text).
    start/end: character span of the whole piece (tags included) in the parsed string.
    open_raw/close_raw: the tags as written, so rendering is exact; close_raw == "" means
    the block was never closed (truncated generation).
    """

    kind: str
    tag: str
    content: str
    start: int = 0
    end: int = 0
    open_raw: str | None = None
    close_raw: str | None = None

    @property
    def closed(self) -> bool:
        return self.kind == "text" or self.close_raw != ""

    def render(self) -> str:
        if self.kind == "text":
            return self.content
        open_raw = self.open_raw if self.open_raw is not None else f"<{self.tag}>"
        close_raw = self.close_raw if self.close_raw is not None else f"</{self.tag}>"
        return f"{open_raw}{self.content}{close_raw}"


@dataclass
class Trajectory:
    steps: list[Step] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def blocks(self) -> list[Step]:
        """The tagged blocks only (stray text dropped)."""
        return [s for s in self.steps if s.kind != "text"]

    def tool_calls(self) -> list[Step]:
        return [s for s in self.steps if s.kind == "tool"]


def _kind_of(tag: str, tools: frozenset[str]) -> str | None:
    if tag in ROLE_TAGS:
        return "role"
    if tag == OBSERVATION:
        return "observation"
    if tag in tools:
        return "tool"
    return None


def parse(text: str, tools: Iterable[str] = DEFAULT_TOOLS) -> Trajectory:
    """Split `text` into ordered steps. Never raises; problems are listed on the result."""
    tool_set = frozenset(t.lower() for t in tools)
    traj = Trajectory()
    if not isinstance(text, str):
        traj.problems.append(f"not a string: {type(text).__name__}")
        return traj
    tags = [
        (m.start(), m.end(), m.group(1) == "/", m.group(2).lower(), m.group(0))
        for m in _TAG_RE.finditer(text)
    ]
    pos = 0  # everything before pos has been emitted as steps

    def emit_text(upto: int) -> None:
        nonlocal pos
        if upto > pos:
            chunk = text[pos:upto]
            traj.steps.append(Step("text", "", chunk, pos, upto))
            if chunk.strip():
                traj.problems.append(f"stray text at {pos}: {chunk.strip()[:40]!r}")
            pos = upto

    i = 0
    while i < len(tags):
        start, end, is_close, name, raw = tags[i]
        if start < pos:  # inside a block already emitted
            i += 1
            continue
        kind = _kind_of(name, tool_set)
        if kind is None:
            traj.problems.append(f"unknown tag {raw!r} at {start}")
            i += 1
            continue
        if is_close:
            traj.problems.append(f"closing tag {raw!r} without opening at {start}")
            i += 1
            continue
        if raw != f"<{name}>":
            traj.problems.append(f"non-canonical tag {raw!r} at {start}")
        # Find the matching close; a known opening tag before it means nesting or an
        # unclosed block, which we report but tolerate.
        j, close_idx, next_open = i + 1, None, None
        while j < len(tags):
            _, _, j_close, j_name, _ = tags[j]
            if j_close and j_name == name:
                close_idx = j
                break
            if not j_close and next_open is None and _kind_of(j_name, tool_set) is not None:
                next_open = j
            j += 1
        emit_text(start)
        if close_idx is not None:
            if next_open is not None and tags[next_open][0] < tags[close_idx][0]:
                traj.problems.append(f"<{tags[next_open][3]}> nested inside <{name}> at {tags[next_open][0]}")
            c_start, c_end, _, _, c_raw = tags[close_idx]
            traj.steps.append(Step(kind, name, text[end:c_start], start, c_end, raw, c_raw))
            pos = c_end
            i = close_idx + 1
        else:
            stop = tags[next_open][0] if next_open is not None else len(text)
            where = "truncated" if next_open is None else "unclosed"
            traj.problems.append(f"{where} <{name}> at {start}")
            traj.steps.append(Step(kind, name, text[end:stop], start, stop, raw, ""))
            pos = stop
            i = next_open if next_open is not None else len(tags)
    emit_text(len(text))
    return traj


def render(trajectory: Trajectory | Iterable[Step]) -> str:
    steps = trajectory.steps if isinstance(trajectory, Trajectory) else trajectory
    return "".join(step.render() for step in steps)


def block(tag: str, content: str) -> str:
    return f"<{tag}>{content}</{tag}>"


def escape_tags(text: str, tools: Iterable[str] = DEFAULT_TOOLS) -> str:
    """Neutralise CoA tags inside text that goes INTO a block (an agent's output, a tool's
    result): `<answer>` becomes `‹answer›`, so foreign text can never end or open a block.
    Only known tags are touched: `x < 3` in code or math stays as written."""
    names = "|".join(re.escape(t) for t in (*ROLE_TAGS, OBSERVATION, *tools))
    return re.sub(rf"<(/?)\s*({names})\s*>", r"‹\1\2›", text, flags=re.I)


# ----------------------------------------------------------------------------- rollout helpers


def stop_strings(tools: Iterable[str]) -> list[str]:
    """Generation pauses after a tool call (to run it) or after the final answer."""
    return [f"</{t}>" for t in tools] + ["</answer>"]


def wrap_observation(text: str) -> str:
    """What the environment appends after a tool call. Newlines keep BPE merges at the
    boundary stable, so the observation span maps cleanly onto tokens for masking."""
    return f"\n<observation>\n{text.strip()}\n</observation>\n"


def observation_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of observation blocks (tags included): the tokens SFT and RL mask.

    Character offsets avoid the AFM release's marker-token hack (their issue #15): a
    token is masked when it overlaps a span, whatever BPE does at the boundaries.
    """
    return [(s.start, s.end) for s in parse(text).steps if s.kind == "observation"]


def written_observations(text: str, tools: Iterable[str] = DEFAULT_TOOLS) -> int:
    """How many observation blocks in `text` the MODEL wrote: the environment only ever adds
    one right after a closed tool call, so any other observation block is a hallucinated tool
    result (what SFT without the observation mask teaches; notebook 07 counts them)."""
    count, previous = 0, None
    for step in parse(text, tools).steps:
        if step.kind == "text" and not step.content.strip():
            continue  # whitespace between a call and its observation
        if step.kind == "observation" and not (previous is not None and previous.kind == "tool" and previous.closed):
            count += 1
        previous = step
    return count


_TRAILING_CALL_RE = re.compile(r"<\s*([A-Za-z_][\w-]*)\s*>(.*?)<\s*/\s*\1\s*>\s*(<\|[\w]+\|>\s*)*$", re.DOTALL)


def unknown_tool_call(text: str, tools: Iterable[str] = DEFAULT_TOOLS) -> str | None:
    """The name of a tool the model tried to call that does not exist: `text` ends with a closed
    `<name>...</name>` block whose tag is neither a role, an observation nor one of `tools`
    (special tokens such as <|im_end|> after it are allowed). The rollout loop answers it with
    an error observation naming the tools that do exist."""
    m = _TRAILING_CALL_RE.search(text)
    if m is None:
        return None
    name = m.group(1).lower()
    if name in ROLE_TAGS or name == OBSERVATION or name in {t.lower() for t in tools}:
        return None
    return name


def pending_tool_call(text: str, tools: Iterable[str] = DEFAULT_TOOLS) -> Step | None:
    """The tool call that ends a generation and still awaits its observation, if any."""
    blocks = parse(text, tools).blocks
    if blocks and blocks[-1].kind == "tool" and blocks[-1].closed:
        return blocks[-1]
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None if absent."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        # "\boxed 5" form: the argument runs to the next space or '$'.
        rest = text[start:].split(None, 1)
        return rest[1].split("$")[0].strip() if len(rest) > 1 else None
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : i]
    return None  # unbalanced: treat as no boxed answer rather than guess


def final_answer(text: str) -> str | None:
    """The answer a trajectory commits to: the last closed <answer> block, with \\boxed{}
    unwrapped. None when there is no closed answer (a truncated run has not answered)."""
    answers = [s for s in parse(text).blocks if s.tag == "answer" and s.closed]
    if not answers:
        return None
    content = answers[-1].content.strip()
    boxed = last_boxed(content)
    return boxed.strip() if boxed is not None else content


# ----------------------------------------------------------------------------- grammar

_START = "<start>"
_TOOL = "<tool>"
# Which block may follow which, per agent profile: the grammar the paper's prompts impose (arXiv
# 2508.13167). Tool blocks are folded into _TOOL; the profile's tool list says which tools.
GRAMMAR: dict[str, dict[str, set[str]]] = {
    "mhqa": {
        _START: {"think", "plan"},
        "plan": {"think", _TOOL},
        "think": {_TOOL, "plan", "reflection", "suggested_answer", "answer"},
        _TOOL: {OBSERVATION},
        OBSERVATION: {"think", "reflection"},
        "reflection": {"think", "plan"},
        "suggested_answer": {"double_check"},
        "double_check": {"think", "plan", "answer"},
    },
    "math": {
        # Code may come first (tool-integrated reasoning in the style of ToRA); the paper's
        # own order is plan, (think, code, observation, reflection)*, think, answer.
        _START: {"plan", "think", _TOOL},
        "plan": {"think"},
        "think": {_TOOL, "answer", "reflection"},
        _TOOL: {OBSERVATION},
        OBSERVATION: {"reflection", "think"},
        "reflection": {"think", "plan"},
    },
    "web": {
        _START: {"think"},
        "think": {"plan", _TOOL, "reflection", "suggested_answer", "double_check", "answer"},
        "plan": {_TOOL, "suggested_answer"},
        _TOOL: {OBSERVATION},
        OBSERVATION: {"think"},
        "reflection": {"think"},
        "suggested_answer": {"double_check"},
        "double_check": {"think", "plan", "answer"},
    },
}
GRAMMAR["code"] = GRAMMAR["math"]

_SCORE_RE = re.compile(r"\b([1-4])\b")


def validate(trajectory: Trajectory | str, profile: str, tools: Iterable[str] | None = None) -> list[str]:
    """Grammar violations of a complete trajectory for an agent profile ([] = valid)."""
    if profile not in GRAMMAR:
        raise ValueError(f"unknown profile {profile!r}; known: {sorted(GRAMMAR)}")
    allowed_tools = set(tools) if tools is not None else set(PROFILE_TOOLS[profile])
    traj = parse(trajectory, allowed_tools | set(DEFAULT_TOOLS)) if isinstance(trajectory, str) else trajectory
    rules = GRAMMAR[profile]
    violations = [p for p in traj.problems if not p.startswith("non-canonical")]
    prev = _START
    blocks = traj.blocks
    for n, step in enumerate(blocks):
        sym = _TOOL if step.kind == "tool" else step.tag
        if step.kind == "tool" and step.tag not in allowed_tools:
            violations.append(f"block {n}: tool <{step.tag}> not available to the {profile} agent")
        if sym not in rules.get(prev, set()):
            violations.append(f"block {n}: <{step.tag}> may not follow <{prev.strip('<>')}>")
        if step.kind == "tool" and not step.content.strip():
            violations.append(f"block {n}: empty <{step.tag}> call")
        if prev == "double_check":
            score = _SCORE_RE.search(blocks[n - 1].content)
            if score is None:
                violations.append(f"block {n - 1}: double_check without a 1-4 score")
            elif int(score.group(1)) >= 3 and sym == "plan":
                violations.append(f"block {n}: double_check scored {score.group(1)} but re-planned")
            elif int(score.group(1)) <= 2 and sym == "answer":
                violations.append(f"block {n}: double_check scored {score.group(1)} but answered")
        prev = sym
    answers = [b for b in blocks if b.tag == "answer"]
    if not answers:
        violations.append("no <answer> block")
    elif len(answers) > 1:
        violations.append(f"{len(answers)} <answer> blocks")
    elif blocks[-1].tag != "answer":
        violations.append("<answer> is not the last block")
    return violations
