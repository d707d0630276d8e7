"""Goal-directed page summaries for ``crawl_page``.

A fetched page is often thousands of words of which the agent needs one sentence.  With
a ``summarizer`` backend, ``crawl_page`` sends each page's readable text (truncated) and
the agent's goal to that model and returns its short report instead of the raw text.

The argument syntax (also in the tool description)::

    https://a.org/x | https://b.org/y || goal: when was the bridge opened

``||`` separates the URLs from the goal; the ``goal:`` prefix is optional.  A
``summarizer`` is any object with ``.chat(conversations, max_new_tokens, temperature)``
returning a list of objects with ``.text`` -- ``coa_lab.generation.hf_generator.HFGenerator``,
``VLLMGenerator`` and ``OpenAIChatBackend`` all qualify.

A summary must never cost the agent the page: if the backend raises, returns the wrong
number of replies or an empty reply, the raw extracted text is returned with a note.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

DEFAULT_GOAL = "the main facts the page states"
NOTHING = "NOTHING RELEVANT"
_GOAL_SPLIT = re.compile(r"\|\|\s*(?:goal\s*:)?|(?:^|\s)goal\s*:", re.IGNORECASE)
_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL | re.IGNORECASE)

SYSTEM_PROMPT = (
    "You read a single web page on behalf of a research agent. Report only what this page "
    "says that bears on the agent's goal: the relevant facts, numbers, names and dates, "
    "quoting short phrases exactly where precision matters. Use nothing you know from "
    "elsewhere. Be brief (at most about 150 words). If the page holds nothing relevant to "
    f"the goal, answer exactly: {NOTHING}."
)


def parse_crawl_arg(arg: str) -> tuple[list[str], str | None]:
    """Split ``'url1 | url2 || goal: ...'`` into ``([url1, url2], goal)``; goal None if absent."""
    match = _GOAL_SPLIT.search(arg)
    goal = None
    if match:
        goal = " ".join(arg[match.end():].split()) or None
        arg = arg[: match.start()]
    urls = [u.strip() for u in re.split(r"[|\s]+", arg) if u.strip()]
    return urls, goal


def summary_messages(goal: str | None, url: str, title: str, text: str, max_input_chars: int) -> list[dict]:
    """The chat for one page: our system prompt, then the goal and the (truncated) page."""
    if len(text) > max_input_chars:
        text = text[:max_input_chars].rsplit(" ", 1)[0] + " ...[page truncated]"
    user = (f"Goal: {goal or DEFAULT_GOAL}\n"
            f"Page: {url}" + (f" ({title})" if title else "") + "\n\n"
            f"<page>\n{text}\n</page>")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def clean_reply(text: str) -> str:
    """Drop ``<think>`` blocks some reasoning models emit and surrounding whitespace."""
    return _THINK.sub("", text or "").strip()


def summarize_pages(summarizer: Any, goal: str | None, pages: Sequence[tuple[str, str, str]], *,
                    max_input_chars: int = 6000, max_new_tokens: int = 256,
                    temperature: float = 0.0) -> list[str | None] | str:
    """Summaries for ``pages`` = ``[(url, title, text), ...]`` in one batched ``chat`` call.

    Returns one summary per page (None where a reply was empty), or an error message
    (a str) when the backend failed as a whole.  Never raises.
    """
    if not pages:
        return []
    conversations = [summary_messages(goal, url, title, text, max_input_chars) for url, title, text in pages]
    try:
        replies = summarizer.chat(conversations, max_new_tokens=max_new_tokens, temperature=temperature)
        replies = list(replies)
        if len(replies) != len(pages):
            return f"backend returned {len(replies)} replies for {len(pages)} pages"
        return [clean_reply(str(getattr(r, "text", ""))) or None for r in replies]
    except Exception as exc:  # noqa: BLE001 - a summary failure must not fail the tool
        return f"{type(exc).__name__}: {str(exc)[:200]}"
