"""benchmarks/probe_teacher_reach.py: per kind of question, the attempt that solved it."""

from __future__ import annotations

import pytest
from conftest import import_benchmark

from coa_lab.config import get_preset
from coa_lab.generation.result import Generation
from coa_lab.tasks import arithmetic
from coa_lab.tasks.suites import load_suite


@pytest.fixture(scope="module")
def probe():
    return import_benchmark("probe_teacher_reach")


class WrongThenRight:
    """A teacher whose answer agent is wrong greedily and right when sampled: the probe must
    credit the second attempt, and must pass the temperature through to the backend."""

    def __init__(self, answer: str):
        self.answer, self.temperatures = answer, []

    def chat(self, conversations, max_new_tokens, temperature=0.0):
        self.temperatures.append(temperature)
        text = self.answer if temperature > 0 else "0"
        return [Generation([], text, "eos", prompt_tokens=1, completion_tokens=1) for _ in conversations]


def test_relations_drawn_per_kind_and_level4_kept_apart(probe):
    tasks = probe.by_relation(load_suite("mhqa", "train", benchmark="lookup"), 2, seed=0)
    kinds = [probe.kind_of(t) for t in tasks]
    assert sorted(set(kinds)) == sorted(f"lookup:{r}" for r in probe.RELATIONS)
    assert all(kinds.count(k) == 2 for k in set(kinds))
    assert probe.kind_of(arithmetic.generate("train", 1, levels=arithmetic.HARD_LEVELS)[0]) == "arith:level4"


def test_a_sampled_retry_is_credited_to_its_attempt(probe, monkeypatch):
    task = arithmetic.generate("train", 1, levels=arithmetic.HARD_LEVELS)[0]
    backend = WrongThenRight(task.answers[0])
    monkeypatch.setattr(probe, "make_teacher", lambda preset: backend)
    reach = probe.teacher_reach(get_preset("cpu-tiny"), [task], attempts=3, temperature=0.7)
    assert reach == {task.id: "1"}  # greedy failed, the first sampled try solved it, no third try
    assert set(backend.temperatures) == {0.0, 0.7}
    assert probe.teacher_reach(get_preset("cpu-tiny"), [task], attempts=1, temperature=0.7) == {task.id: "never"}
