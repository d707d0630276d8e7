"""Agent tools: the ``Tool``/``Observation`` contract, a registry, and the built-ins.

Built-in tools (construct by name with ``build_tools``):

* ``code``        -- Python in a bubblewrap sandbox (``code_tool.CodeTool``; ``E2BCodeTool`` remote)
* ``wiki_search`` -- BM25 / dense / hybrid search over the shipped Wikipedia passages
                    (``wiki_search.WikiSearch``; dense needs the ``[dense]`` extra)
* ``web_search``  -- ddgs metasearch (``web.WebSearch``)
* ``crawl_page``  -- fetch + readable text (+ optional goal-directed summary), offline page
                    store first (``web.CrawlPage``)

See docs/tools.md.

Heavy dependencies (bm25s, ddgs, httpx, e2b, sentence-transformers) are imported only when a tool needs them.
"""

from coa_lab.tools.base import Observation, Tool, error_observation, truncate_text
from coa_lab.tools.code_tool import CodeTool, E2BCodeTool, exec_main, extract_code, make_code_tool
from coa_lab.tools.dense_search import DenseExtraMissingError
from coa_lab.tools.registry import BUILTIN_TOOLS, FunctionTool, ToolRegistry, build_tools
from coa_lab.tools.sandbox import ExecResult, SandboxUnavailableError, run_python, sandbox_available
from coa_lab.tools.web import CrawlPage, PageStore, WebSearch, html_to_text
from coa_lab.tools.wiki_search import DenseSearch, HybridSearch, WikiSearch, load_passages

__all__ = [
    "BUILTIN_TOOLS",
    "CodeTool",
    "CrawlPage",
    "DenseExtraMissingError",
    "DenseSearch",
    "E2BCodeTool",
    "ExecResult",
    "FunctionTool",
    "HybridSearch",
    "Observation",
    "PageStore",
    "SandboxUnavailableError",
    "Tool",
    "ToolRegistry",
    "WebSearch",
    "WikiSearch",
    "build_tools",
    "error_observation",
    "exec_main",
    "extract_code",
    "html_to_text",
    "load_passages",
    "make_code_tool",
    "run_python",
    "sandbox_available",
    "truncate_text",
]
