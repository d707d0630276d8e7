"""The Tool contract: never raise into the agent, bounded output, and the registry."""

from __future__ import annotations

import pytest

from coa_lab.tools import FunctionTool, Observation, Tool, ToolRegistry, build_tools
from coa_lab.tools.base import truncate_text


class Boom(Tool):
    name = "boom"
    description = "always fails"

    def run(self, arg: str) -> Observation:
        raise RuntimeError(f"exploded on {arg}")


class Echo(Tool):
    name = "echo"
    description = "echo the argument"

    def run(self, arg: str) -> Observation:
        return Observation(text=arg, ok=True, latency_s=0.0)


def test_exception_becomes_error_observation() -> None:
    obs = Boom()("x")
    assert obs.ok is False
    assert obs.text.startswith("[tool error]")
    assert "exploded on x" in obs.text and "RuntimeError" in obs.text
    assert obs.error and "exploded" in obs.error
    assert obs.latency_s >= 0


def test_system_exit_and_bad_arg_are_shielded() -> None:
    def quits(arg: str) -> str:
        raise SystemExit(3)

    assert FunctionTool("quits", "calls sys.exit", quits)("x").ok is False
    assert Echo()(None).ok is False  # type: ignore[arg-type]


def test_bad_return_type_is_an_error() -> None:
    assert FunctionTool("bad", "returns int", lambda a: 3)("x").text == "3"  # str() of results is fine

    class Wrong(Tool):
        name = "wrong"
        description = "returns a dict"

        def run(self, arg: str):  # type: ignore[override]
            return {"text": arg}

    obs = Wrong()("x")
    assert not obs.ok and "must return an Observation" in obs.text


def test_truncation_marks_and_bounds() -> None:
    tool = Echo()
    tool.max_output_chars = 100
    obs = tool("a" * 1000)
    assert obs.truncated is True
    assert obs.text.startswith("a" * 100)
    assert "[truncated 900 chars]" in obs.text
    assert len(obs.text) < 140
    short = tool("hello")
    assert short.text == "hello" and short.truncated is False
    assert truncate_text("abc", 3) == ("abc", False)


def test_default_max_output_chars_is_1500() -> None:
    obs = Echo()("b" * 5000)
    assert obs.truncated and obs.text.startswith("b" * 1500) and not obs.text.startswith("b" * 1501)


def test_latency_measured() -> None:
    import time

    obs = FunctionTool("slow", "sleeps", lambda a: (time.sleep(0.05), "done")[1])("x")
    assert obs.ok and obs.text == "done" and obs.latency_s >= 0.04


def test_registry_basics() -> None:
    reg = ToolRegistry()
    reg.register(Echo())
    reg.register(FunctionTool("upper", "uppercase the argument", str.upper))
    assert reg.names() == ["echo", "upper"]
    assert "echo" in reg and "nope" not in reg
    assert reg.get("upper")("abc").text == "ABC"
    assert reg.describe() == "- echo: echo the argument\n- upper: uppercase the argument"
    with pytest.raises(KeyError, match="known tools: echo, upper"):
        reg.get("nope")
    with pytest.raises(ValueError, match="already registered"):
        reg.register(Echo())
    obs = reg("nope", "x")  # calling by name never raises
    assert not obs.ok and "unknown tool" in obs.text


def test_function_tool_validation() -> None:
    with pytest.raises(ValueError):
        FunctionTool("", "x", str)
    with pytest.raises(ValueError, match="one line"):
        FunctionTool("t", "two\nlines", str)


def test_build_tools_errors() -> None:
    with pytest.raises(ValueError, match="unknown tool name.*built-in tools are: code, wiki_search"):
        build_tools(["code", "calculator"])
    with pytest.raises(ValueError, match="not in names"):
        build_tools(["crawl_page"], code={"timeout_s": 1})
    with pytest.raises(TypeError):
        build_tools("code")  # type: ignore[arg-type]


def test_build_tools_constructs_builtins(tmp_path) -> None:
    corpus = tmp_path / "p.jsonl"
    corpus.write_text('{"id": "1", "title": "Paris", "text": "Paris is the capital of France."}\n')
    reg = build_tools(["code", "wiki_search", "web_search", "crawl_page"],
                      code={"backend": "local", "timeout_s": 5},
                      wiki_search={"corpus_path": corpus, "use_cache": False},
                      crawl_page={"store": {"https://x.org/": "<p>hi</p>"}})
    assert reg.names() == ["code", "wiki_search", "web_search", "crawl_page"]
    assert reg.get("code").timeout_s == 5
    assert "Paris" in reg("wiki_search", "capital France").text
    assert reg("crawl_page", "https://x.org/").text.endswith("hi")


def test_code_backend_selection(monkeypatch) -> None:
    from coa_lab.tools.code_tool import CodeTool, E2BCodeTool, make_code_tool

    monkeypatch.delenv("E2B_API_KEY", raising=False)
    assert isinstance(make_code_tool(), CodeTool)
    with pytest.raises(RuntimeError, match="E2B_API_KEY"):
        E2BCodeTool()
    with pytest.raises(RuntimeError, match="E2B_API_KEY"):
        make_code_tool(backend="e2b")
    with pytest.raises(ValueError, match="unknown code backend"):
        make_code_tool(backend="docker")
    monkeypatch.setenv("E2B_API_KEY", "dummy-not-used")
    tool = make_code_tool()  # auto -> remote; nothing is contacted until the first call
    assert isinstance(tool, E2BCodeTool) and tool.name == "code"


def test_code_tool_holds_the_tools_and_the_cli() -> None:
    """code_tool.py holds the tools and the CLI; sandbox.py only runs code and imports nothing back."""
    from coa_lab.tools import code_tool, sandbox

    assert code_tool.extract_code("```python\nprint(1)\n```") == "print(1)" and callable(sandbox.run_python)
    for name in ("CodeTool", "E2BCodeTool", "exec_main", "extract_code", "make_code_tool"):
        assert hasattr(code_tool, name) and not hasattr(sandbox, name), name
