"""Choosing the RL pool by the policy's own pass rate (the paper keeps queries the SFT model
solves sometimes but not always)."""

import pytest

from coa_lab.config import get_preset
from coa_lab.llm import Generation
from coa_lab.rl.pool import keep_by_pass_rate, select_pool
from coa_lab.tasks.records import Task
from coa_lab.tools.registry import build_tools

TASKS = [Task(f"t{i}", f"What is {i} + {i}?", [str(2 * i)], "test", "math", {}) for i in range(1, 5)]


def test_keep_by_pass_rate_drops_never_and_always_solved():
    rates = [0.0, 0.25, 0.5, 1.0]
    assert [t.id for t in keep_by_pass_rate(TASKS, rates, 0.2, 0.8)] == ["t2", "t3"]
    # even a window that includes the ends never keeps 0 or 1: such groups carry no signal
    assert [t.id for t in keep_by_pass_rate(TASKS, rates, 0.0, 1.0)] == ["t2", "t3"]
    assert keep_by_pass_rate(TASKS, rates, 0.3, 0.4) == []
    with pytest.raises(ValueError):
        keep_by_pass_rate(TASKS, rates[:2], 0.2, 0.8)


class KnownSkill:
    """Answers task t{k} correctly in the first `k - 1` of every 4 samples: pass rates 0, 1/4, 2/4, 3/4."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, 0

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()):
        out = []
        for i, _ in enumerate(prompts):
            task_no, sample = i // 4 + 1, i % 4
            value = 2 * task_no if sample < task_no - 1 else -1
            text = f"<answer>\\boxed{{{value}}}</answer>"
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Generation(ids, text, "stop", 1))
        return out


@pytest.mark.model
def test_select_pool_samples_each_candidate_and_keeps_mixed_ones():
    from coa_lab.models import load_tokenizer

    preset = get_preset("cpu-smoke")
    tok = load_tokenizer(preset.model.name)
    kept, report = select_pool(KnownSkill(tok), TASKS, build_tools(["code"]), preset.gen, samples=4,
                               min_pass=0.2, max_pass=0.8, temperature=1.0)
    assert [t.id for t in kept] == ["t2", "t3", "t4"]
    assert report.pass_rates == {"t1": 0.0, "t2": 0.25, "t3": 0.5, "t4": 0.75}
    assert report.histogram == {"0/4": 1, "1/4": 1, "2/4": 1, "3/4": 1, "4/4": 0}
    assert report.kept == 3 and report.candidates == 4
