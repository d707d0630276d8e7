"""System prompts, in our own words: the single CoA model's (per profile) and the teacher's agents.

Prompts stay short on purpose: at CPU scale every prompt token is paid for in every turn
of every rollout, and a 135M model follows a short example better than long rules.
"""

from __future__ import annotations

from coa_lab.protocol import PROFILE_TOOLS

TOOL_HELP = {
    "wiki_search": "<wiki_search>search query</wiki_search> searches a Wikipedia passage index",
    "code": "<code>\n```python\nprint(...)\n```\n</code> runs Python; print what you need to see",
    "web_search": "<web_search>query</web_search> searches the web",
    "crawl_page": "<crawl_page>url1 | url2</crawl_page> reads web pages",
}

EXAMPLES = {
    "mhqa": (
        "<think>I need the birthplace of the director.</think>\n"
        "<wiki_search>director of Titanic 1997</wiki_search>\n"
        "<observation>\n(1) Titanic (1997 film): directed by James Cameron ...\n</observation>\n"
        "<think>James Cameron was born in Kapuskasing.</think>\n"
        "<answer>Kapuskasing</answer>"
    ),
    "math": (
        "<plan>Compute the total cost.</plan>\n"
        "<think>3 pens at $2 each.</think>\n"
        "<code>\n```python\nprint(3 * 2)\n```\n</code>\n"
        "<observation>\n6\n</observation>\n"
        "<think>The total is 6.</think>\n"
        "<answer>\\boxed{6}</answer>"
    ),
}
EXAMPLES["code"] = EXAMPLES["math"]


def coa_system_prompt(profile: str, tools: list[str] | None = None) -> str:
    """The single model plays every agent: roles and tools are tagged blocks in one answer."""
    if profile not in PROFILE_TOOLS:
        raise ValueError(f"unknown profile {profile!r}; known: {sorted(PROFILE_TOOLS)}")
    tools = list(tools) if tools is not None else list(PROFILE_TOOLS[profile])
    tool_lines = "\n".join(f"- {TOOL_HELP.get(t, f'<{t}>input</{t}>')}" for t in tools)
    example = EXAMPLES.get(profile, EXAMPLES["mhqa"])
    return (
        "You solve tasks step by step with tagged blocks: <plan> to plan, <think> to reason, "
        "a tool block to act, <reflection> to check your progress, <answer> for the final answer. "
        "After a tool block, stop: its result comes back in <observation>.\n"
        f"Tools:\n{tool_lines}\nExample:\n{example}"
    )


# ---------------------------------------------------------------- the teacher's agents
# Each agent of the multi-agent teacher sees only its own instructions and the context the
# orchestrator hands it: that separation is what the CoA model later has to internalise.

PLANNER = "You are the planner. Write a short numbered plan (at most 3 steps) to solve the task. Do not solve it."

THINKER = (
    "You are the orchestrator. Given a question, a plan and the results so far, say in one short "
    "sentence what the next step must find out (or, if asked, what the answer is)."
)

SEARCHER = (
    "You are the search agent. Given a question, a plan and earlier results, reply with ONE short "
    "search query for a Wikipedia passage index, and nothing else."
)

CODER = (
    "You are the code agent. Given a math problem, a plan and earlier results, reply with a short "
    "Python program in a ```python block that prints the quantity needed next."
)

ANSWERER = (
    "You are the answer agent. Given a question and the tool results gathered so far, reply with the "
    "final answer only: a number for math problems, a short phrase for questions."
)

REFLECTOR = (
    "You are the reflector. Given a question and the latest tool result, say in one sentence whether "
    "the result helps and what to do next."
)
