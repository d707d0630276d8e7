"""Look tools up by name, describe them for prompts, and build the built-in ones.

A notebook adds its own tool in two lines::

    reg = build_tools(["code", "wiki_search"])
    reg.register(FunctionTool("calc", "evaluate an arithmetic expression", my_fn))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from coa_lab.tools.base import DEFAULT_MAX_OUTPUT_CHARS, Observation, Tool, error_observation
from coa_lab.tools.code_tool import make_code_tool
from coa_lab.tools.web import CrawlPage, WebSearch
from coa_lab.tools.wiki_search import WikiSearch

BUILTIN_TOOLS = ("code", "wiki_search", "web_search", "crawl_page")


class FunctionTool(Tool):
    """Wrap a plain ``fn(arg: str) -> str | Observation`` as a tool."""

    def __init__(
        self,
        name: str,
        description: str,
        fn: Callable[[str], str | Observation],
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    ) -> None:
        if not name or not name.replace("_", "").isalnum():
            raise ValueError(f"tool name must be a non-empty identifier, got {name!r}")
        if "\n" in description:
            raise ValueError("tool description must be one line (it goes into prompts)")
        self.name = name
        self.description = description
        self.fn = fn
        self.max_output_chars = max_output_chars

    def run(self, arg: str) -> Observation:
        result = self.fn(arg)
        if isinstance(result, Observation):
            return result
        return Observation(text=str(result), ok=True, latency_s=0.0)


class ToolRegistry:
    """An ordered name -> tool map (order is the order tools appear in prompts)."""

    def __init__(self, tools: list[Tool] | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools or []:
            self.register(tool)

    def register(self, tool: Tool, replace: bool = False) -> Tool:
        if not isinstance(tool, Tool):
            raise TypeError(f"expected a Tool, got {type(tool).__name__}; wrap functions in FunctionTool")
        if not tool.name:
            raise ValueError(f"{type(tool).__name__} has an empty name")
        if tool.name in self._tools and not replace:
            raise ValueError(f"a tool named {tool.name!r} is already registered (pass replace=True)")
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            known = ", ".join(self._tools) or "(none)"
            raise KeyError(f"unknown tool {name!r}; known tools: {known}") from None

    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def describe(self) -> str:
        """Bullet list for system prompts: ``- <name>: <description>`` per line."""
        return "\n".join(f"- {t.name}: {t.description}" for t in self._tools.values())

    def __call__(self, name: str, arg: str) -> Observation:
        """Call a tool by name; an unknown name becomes an error observation, not a raise."""
        if name not in self._tools:
            return error_observation(f"unknown tool {name!r}; known tools: {', '.join(self._tools)}")
        return self._tools[name](arg)


def _build_one(name: str, opts: dict[str, Any]) -> Tool:
    # bm25s, ddgs and httpx are imported inside the tools that use them: building only "code" needs none
    if name == "code":
        return make_code_tool(**opts)
    if name == "wiki_search":
        return WikiSearch(**opts)
    if name == "web_search":
        return WebSearch(**opts)
    if name == "crawl_page":
        return CrawlPage(**opts)
    raise ValueError(f"unknown built-in tool {name!r}; choose from {', '.join(BUILTIN_TOOLS)}")


def build_tools(names: list[str], **options: dict[str, Any]) -> ToolRegistry:
    """Construct built-in tools by name.

    ``options`` are keyed by tool name, each a dict of constructor keyword arguments,
    e.g. ``build_tools(["code", "wiki_search"], code={"timeout_s": 5}, wiki_search={"k": 5})``.
    """
    if isinstance(names, str):
        raise TypeError("names must be a list of tool names, e.g. ['code'], not a string")
    unknown = [n for n in names if n not in BUILTIN_TOOLS]
    if unknown:
        raise ValueError(f"unknown tool name(s) {unknown}; built-in tools are: {', '.join(BUILTIN_TOOLS)}")
    stray = [k for k in options if k not in names]
    if stray:
        raise ValueError(f"options given for tool(s) {stray} that are not in names={list(names)}")
    registry = ToolRegistry()
    for name in names:
        opts = options.get(name) or {}
        if not isinstance(opts, dict):
            raise TypeError(f"options for {name!r} must be a dict of keyword arguments")
        registry.register(_build_one(name, opts))
    return registry
