"""Lesson 00's exercises: the grammar's first complaint, a new tool's stop string, a scripted policy's mask."""

from __future__ import annotations

import itertools
import re

from coa_lab import protocol
from coa_lab.generation.result import Generation
from coa_lab.lessons.exercises.registry import Exercise, register
from coa_lab.student_rollout import run_coa
from coa_lab.tasks.records import Task


def _without_first_observation(text: str) -> str:
    start, end = protocol.observation_spans(text)[0]
    return text[:start] + text[end:]


def _first_flagged_block(text: str, profile: str = "mhqa"):
    """The index of the block `validate` names first once the first observation is gone (its
    message, should the first complaint name no block)."""
    first = protocol.validate(_without_first_observation(text), profile)[0]
    m = re.match(r"block (\d+):", first)
    return int(m.group(1)) if m else first


register(Exercise(
    id="00.first_violation",
    question="Delete the first <observation> block from the lesson's example trajectory. Which block (its index in "
             "protocol.parse(broken).blocks) does protocol.validate(broken, 'mhqa') flag first?",
    truth=_first_flagged_block,
    hint="after a tool call the grammar allows only the environment's <observation>; count the blocks from 0, "
         "without the one you deleted.",
    wrong=lambda right: right + 1 if isinstance(right, int) else f"not {right}",
))


def _stop_strings_with(names, new_tool: str = "calc") -> list[str]:
    # the same answer before and after the learner registers the tool: it is added last either way
    return protocol.stop_strings([n for n in names if n != new_tool] + [new_tool])


register(Exercise(
    id="00.stop_strings",
    question="Register a tool named 'calc' on the lesson's registry. What does protocol.stop_strings(tools.names()) "
             "return then?",
    truth=_stop_strings_with,
    hint="generation pauses after every closing tool tag (to run the tool) and after </answer>; a registered tool "
         "brings its own closing tag.",
    wrong=lambda right: [s for s in right if s != "</calc>"],
    same=lambda a, b: sorted(a) == sorted(b),  # the order is the registry's; any order will do
))

SCRIPTED_REPLY = "<code>print(6 * 7)</code>"


class _SameCallEveryTurn:
    """A policy without a model: each turn it writes SCRIPTED_REPLY and stops, as at a stop string."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()):
        ids = self.tokenizer(SCRIPTED_REPLY, add_special_tokens=False)["input_ids"]
        return [Generation(ids, SCRIPTED_REPLY, "stop", len(p)) for p in prompts]


def _scripted_rollout(tokenizer, tools, gen) -> list[int]:
    # the question does not matter to a policy that ignores it; a math task announces the code tool
    task = Task("scripted", "What is 6 * 7?", ["42"], "exercise", "math", {})
    [r] = run_coa(_SameCallEveryTurn(tokenizer), [task], tools, gen)
    zero_runs = sum(1 for m, _ in itertools.groupby(r.response_mask) if m == 0)
    return [zero_runs, r.tool_errors]


register(Exercise(
    id="00.scripted",
    question=f"A policy that writes {SCRIPTED_REPLY!r} every turn runs through run_coa with the lesson's preset.gen. "
             "How many 0-runs does its response mask have, and how many of its tool calls are errors? Answer "
             "[0-runs, tool_errors].",
    truth=_scripted_rollout,
    hint="one observation per tool call, one call per turn up to gen.max_turns; the environment answers a call "
         "identical to an earlier one with a canned reply (student_rollout.ALREADY_SEARCHED) that counts as an error.",
    wrong=lambda right: [right[0], 0 if right[1] else 1],
))
