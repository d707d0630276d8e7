"""The tool contract every agent-facing tool follows: ``Tool`` and ``Observation``.

An agent loop calls ``tool(arg)`` and feeds ``observation.text`` back into the model's
context.  Two promises make that loop safe to write without try/except everywhere:

* a tool NEVER raises into the agent: ``Tool.__call__`` turns every exception into an
  ``Observation(ok=False, text="[tool error] ...")``;
* an observation is never longer than ``max_output_chars`` (plus a visible marker), so a
  chatty tool cannot blow up the context window or the RL rollout's token budget.

Subclasses only implement ``run(arg) -> Observation``; ``__call__`` adds the latency
measurement, the exception shield and the truncation.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

DEFAULT_MAX_OUTPUT_CHARS = 1500


@dataclass
class Observation:
    """What a tool hands back to the agent.

    ``text`` is what the model sees; ``ok`` lets the trainer/evaluator count tool
    failures without parsing text; ``latency_s`` feeds the cost accounting.
    """

    text: str
    ok: bool
    latency_s: float
    truncated: bool = False
    error: str | None = None


def truncation_marker(dropped_chars: int) -> str:
    """The visible note appended to cut text, so the model knows content is missing."""
    return f"\n...[truncated {dropped_chars} chars]"


def truncate_text(text: str, max_chars: int) -> tuple[str, bool]:
    """Cut ``text`` to ``max_chars`` characters and append a marker; returns (text, cut?)."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text, False
    return text[:max_chars] + truncation_marker(len(text) - max_chars), True


def error_observation(message: str, latency_s: float = 0.0) -> Observation:
    """An ``ok=False`` observation whose text starts with ``[tool error]``."""
    return Observation(text=f"[tool error] {message}", ok=False, latency_s=latency_s, error=message)


class Tool(ABC):
    """Base class for agent tools.

    Subclasses set the class attributes ``name`` (what the agent writes to call it) and
    ``description`` (ONE line; it goes verbatim into system prompts), and implement
    ``run``.  ``max_output_chars`` can be overridden per class or per instance.
    """

    name: str = ""
    description: str = ""
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS

    @abstractmethod
    def run(self, arg: str) -> Observation:
        """Do the work for one call; may raise (``__call__`` shields the agent)."""

    def __call__(self, arg: str) -> Observation:
        start = time.perf_counter()
        try:
            if not isinstance(arg, str):
                raise TypeError(f"tool argument must be a string, got {type(arg).__name__}")
            result = self.run(arg)
            if isinstance(result, str):  # be lenient with hand-written tools
                result = Observation(text=result, ok=True, latency_s=0.0)
            if not isinstance(result, Observation):
                raise TypeError(
                    f"{type(self).__name__}.run must return an Observation or str, "
                    f"got {type(result).__name__}"
                )
        # SystemExit too: a tool calling sys.exit() must not end the agent's process.
        # KeyboardInterrupt is deliberately NOT caught, so Ctrl-C still stops a notebook.
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - shielding the agent is the point
            message = f"{self.name or type(self).__name__}: {type(exc).__name__}: {exc}"
            result = error_observation(message)
        result.latency_s = time.perf_counter() - start
        text, cut = truncate_text(result.text, self.max_output_chars)
        if cut:
            result.text = text
            result.truncated = True
        return result

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
