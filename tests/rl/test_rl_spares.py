"""rl/rollouts.collect_batch's spares (rl.spare_groups): the next round's questions sampled in the first
round's pass are the same draws a second round makes, so a run with spares keeps the same groups, counts
and pool stream as one without, in fewer passes; rl/checkpoint.TaskCycle takes unused ones back."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from coa_lab.config import get_preset
from coa_lab.generation.models import load_tokenizer, resolve_model
from coa_lab.generation.result import Generation
from coa_lab.rl.checkpoint import TaskCycle
from coa_lab.rl.rollouts import collect_batch
from coa_lab.tasks.records import Task
from coa_lab.tools.registry import build_tools

TASKS = [Task(f"t{i}", f"What is {i} + {i}?", [str(2 * i)], "test", "math", {}) for i in range(1, 13)]
RIGHT, WRONG = "<think>t</think><answer>\\boxed{%d}</answer>", "<think>t</think><answer>\\boxed{0}</answer>"


class ByQuestion:
    """Answers each question by its own pattern, whatever else shares the pass: sample k of question i
    (its k-th row in a call) is right where pattern(i)[k % 2] is."""

    def __init__(self, tokenizer, pattern):
        self.tokenizer, self.pattern, self.passes = tokenizer, pattern, 0

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()):
        self.passes += 1
        seen, out = Counter(), []
        for p in prompts:
            text = self.tokenizer.decode(p)
            i = next(t for t in range(1, 13) if f"What is {t} + {t}?" in text)
            k, seen[i] = seen[i], seen[i] + 1
            answer = RIGHT % (2 * i) if self.pattern(i)[k % 2] else WRONG
            ids = self.tokenizer(answer, add_special_tokens=False)["input_ids"]
            out.append(Generation(ids, self.tokenizer.decode(ids), "stop", len(p)))
        return out


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model(get_preset("cpu-smoke").model.name))


def _pattern(i: int) -> tuple[bool, bool]:
    # mixed (informative) for most, all right or all wrong for some: rounds come up short
    return {0: (True, False), 1: (True, True), 2: (True, False), 3: (False, False)}[i % 4]


def _run(tok, spares: int, steps: int = 5):
    preset = get_preset("cpu-smoke", rl={"prompts_per_step": 3, "group_size": 2, "max_sampling_rounds": 2,
                                         "anchors_per_step": 1, "spare_groups": spares})
    pool, anchors = TaskCycle(TASKS[:10], rng=random.Random(3)), iter(TASKS[10:] * 10)
    policy, out = ByQuestion(tok, _pattern), []
    for _ in range(steps):
        groups, rewards, stats = collect_batch(policy, pool, build_tools(["code"]), preset, anchor_iter=anchors)
        out.append(([[r.task.id for r in g] for g in groups], rewards,
                    {k: v for k, v in stats.items() if k not in ("samples", "passes", "spare_groups_unused")},
                    [r.task.id for r, _, _ in stats["samples"]], stats["passes"]))
    return out, [next(pool).id for _ in range(6)], policy.passes


@pytest.mark.parametrize("spares", [1, 2, 5])
def test_spares_keep_the_rounds_groups_and_pool_stream_in_fewer_passes(tok, spares):
    plain, plain_next, plain_passes = _run(tok, 0)
    got, got_next, got_passes = _run(tok, spares)
    for (groups, rewards, stats, samples, _), (g2, r2, s2, samples2, _) in zip(plain, got):
        assert (g2, r2, s2, samples2) == (groups, rewards, stats, samples)
    assert got_next == plain_next  # the pool goes on where it would have: unused spares came back
    assert any(stats["rounds"] > 1 for _, _, stats, _, _ in plain)  # the case spares are for did occur
    assert got_passes < plain_passes


def test_task_cycle_hands_unread_tasks_out_first_and_checkpoints_them():
    cycle = TaskCycle(TASKS[:4], rng=random.Random(0))
    drawn = [next(cycle) for _ in range(6)]  # past the end of a pass: a reshuffle in between
    cycle.unread(drawn[-3:])
    state = cycle.state()
    resumed = TaskCycle(TASKS[:4], rng=random.Random(99))
    resumed.restore(state)
    want = [next(cycle).id for _ in range(7)]
    assert want[:3] == [t.id for t in drawn[-3:]]
    assert [next(resumed).id for _ in range(7)] == want


def test_a_plain_iterator_gets_no_spares(tok):
    """A pool that cannot take questions back (a test's list iterator) is sampled round by round."""
    preset = get_preset("cpu-smoke", rl={"prompts_per_step": 2, "group_size": 2, "max_sampling_rounds": 1,
                                         "spare_groups": 2})
    policy = ByQuestion(tok, _pattern)
    groups, _, stats = collect_batch(policy, iter(TASKS), build_tools(["code"]), preset)
    assert stats["spare_groups_unused"] == 0 and stats["passes"] == stats["rounds"] == policy.passes
