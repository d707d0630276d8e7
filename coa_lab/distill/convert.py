"""Stage 2a, distill: turn one recorded multi-agent run into ONE linear CoA trajectory.

Every agent activation becomes the block of the role it played; tool results become
observations. The agents' inter-agent chatter (each re-reading the whole context) is what
disappears: the CoA model keeps one growing context instead.

    planner  -> <plan>         thinker -> <think>      searcher/coder -> <wiki_search>/<code>
    (tool result) -> <observation>   reflector -> <reflection>   answerer -> <answer>
"""

from __future__ import annotations

import re

from coa_lab.capture.teacher import TeacherRun, first_line
from coa_lab.protocol import block, escape_tags, wrap_observation

ROLE_OF_AGENT = {"planner": "plan", "thinker": "think", "reflector": "reflection", "answerer": "answer"}


def _clean(text: str) -> str:
    # What the orchestrator passed on (the first line); agents sometimes echo tags, and a
    # stray CoA tag would corrupt the block structure.
    return " ".join(escape_tags(first_line(text)).split())


def run_to_coa(run: TeacherRun) -> str:
    """Linearise a teacher run into CoA text (the assistant turn the single model learns)."""
    parts: list[str] = []
    for act in run.activations:
        if act.tool:
            call = escape_tags(act.tool_input or "")
            parts.append(block(act.tool, f"\n{call}\n" if act.tool == "code" else call))
            parts.append(wrap_observation(escape_tags(act.observation or "")).strip("\n"))
        elif act.agent == "answerer":
            # an answerer echoing the tag means the answer inside it
            answer = _clean(re.sub(r"</?\s*answer\s*>", " ", act.output, flags=re.I))
            parts.append(block("answer", f"\\boxed{{{answer}}}" if run.profile == "math" else answer))
        elif act.agent in ROLE_OF_AGENT:
            parts.append(block(ROLE_OF_AGENT[act.agent], _clean(act.output)))
    return "\n".join(parts)
