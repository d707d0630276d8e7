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

# Templates, not worked examples: a small model copies a concrete example's answer into
# every reply (the demo's first SFT model answered "Kapuskasing" to everything).
EXAMPLES = {
    "mhqa": (
        "<think>what I need to find</think>\n"
        "<wiki_search>a search query</wiki_search>\n"
        "<observation>\nsearch results\n</observation>\n"
        "<think>what the results show</think>\n"
        "<answer>short answer</answer>"
    ),
    "math": (
        "<plan>the steps</plan>\n"
        "<think>what to compute</think>\n"
        "<code>\n```python\nprint(...)\n```\n</code>\n"
        "<observation>\nprinted output\n</observation>\n"
        "<think>what the output means</think>\n"
        "<answer>\\boxed{number}</answer>"
    ),
    # The web agent's verification loop (arXiv 2508.13167): a suggested answer is always
    # double-checked before it becomes the answer.
    "web": (
        "<think>what I need to find</think>\n"
        "<plan>the steps</plan>\n"
        "<web_search>a search query</web_search>\n"
        "<observation>\nsearch results\n</observation>\n"
        "<think>which page to read</think>\n"
        "<crawl_page>a url</crawl_page>\n"
        "<observation>\npage summary\n</observation>\n"
        "<think>what the page shows</think>\n"
        "<suggested_answer>short answer</suggested_answer>\n"
        "<double_check>how the suggested answer was checked; score: 4</double_check>\n"
        "<answer>short answer</answer>"
    ),
}
EXAMPLES["code"] = EXAMPLES["math"]

# The last block of each profile's trajectory (the scorers read it).
ANSWER_FORMAT = {
    "math": "<answer>\\boxed{number}</answer>",
    "code": "<answer>```python\nprogram\n```</answer>",
    "mhqa": "<answer>short answer</answer>",
    "web": "<answer>short answer</answer>",
}

# Only the web agent verifies (GRAMMAR["web"] in coa_lab.protocol enforces the same rule).
VERIFY_RULE = (
    "Before answering, give a <suggested_answer>, then a <double_check> that grades it with a score "
    "from 1 (surely wrong) to 4 (surely right). With 3 or 4, write the <answer>; with 1 or 2, "
    "<think> and <plan> again."
)


def coa_system_prompt(profile: str, tools: list[str] | None = None) -> str:
    """The single model plays every agent: roles and tools are tagged blocks in one answer.

    Short and zero-shot on purpose: every prompt token is paid for in every turn of every
    rollout, and the distilled model learns the format from its trajectories, not from here.
    """
    if profile not in PROFILE_TOOLS:
        raise ValueError(f"unknown profile {profile!r}; known: {sorted(PROFILE_TOOLS)}")
    tools = list(tools) if tools is not None else list(PROFILE_TOOLS[profile])
    tool_lines = "\n".join(f"- {TOOL_HELP.get(t, f'<{t}>input</{t}>')}" for t in tools)
    rules = VERIFY_RULE + "\n" if profile == "web" else ""
    return (
        "You are a whole team in one model: plan, think, call a tool, reflect and answer, each in its own "
        "tagged block such as <think>...</think>. After a tool block, stop: its result comes back in <observation>.\n"
        f"{rules}Tools:\n{tool_lines}\nAnswer format: {ANSWER_FORMAT.get(profile, ANSWER_FORMAT['mhqa'])}"
    )


# ---------------------------------------------------------------- the teacher's agents
# Each agent of the multi-agent teacher sees only its own instructions, the context the
# orchestrator hands it, and (capture/worked_examples.py) two worked examples as earlier chat
# turns: that separation and that prompt engineering are what the CoA model internalises.

PLANNER = "You are the planner. Write a one-line plan to solve the task. Do not solve it."

THINKER = (
    "You are the orchestrator. Given a question and what is known so far, say in one short "
    "sentence what the next step must find out, or what the answer is."
)

SEARCHER = (
    "You are the search agent. Given a question and the next step, reply with ONE short "
    "search query for a Wikipedia passage index, and nothing else."
)

CODER = (
    "You are the code agent. Write one line of Python that prints the number the question asks "
    "for, in a ```python block. Use only the numbers the question needs."
)

ANSWERER = (
    "You are the answer agent. Given a question and the tool result, reply with the final "
    "answer only: a number for math problems, a short phrase for questions."
)

REFLECTOR = (
    "You are the reflector. Given a question and the latest tool result, say in one sentence whether "
    "the result answers the question."
)


def task_messages(profile: str, question: str, tools: list[str]) -> list[dict]:
    """The CoA prompt: the whole trajectory is the assistant's reply to this."""
    return [
        {"role": "system", "content": coa_system_prompt(profile, tools)},
        {"role": "user", "content": question},
    ]
