"""Choosing the RL pool by the policy's own pass rate (the paper keeps queries the SFT model
solves sometimes but not always)."""

import itertools
import re

import pytest

from coa_lab.config import get_preset
from coa_lab.generation.result import Generation
from coa_lab.rl.pool import anchor_stream, decided_early, headroom, keep_by_pass_rate, select_pool, template_of
from coa_lab.tasks.records import Task
from coa_lab.tools.registry import build_tools

TASKS = [Task(f"t{i}", f"What is {i} + {i}?", [str(2 * i)], "test", "math", {}) for i in range(1, 5)]


def _arith(i, expression):
    return Task(f"a{i}", f"q{i}", ["1"], "arith", "math", {"family": "arith", "level": 2, "expression": expression})


def test_template_of_names_the_question_kind_not_its_numbers():
    assert template_of(_arith(1, "5551 - 254 + 856")) == template_of(_arith(2, "6985 - 555 + 556")) == "arith:n - n + n"
    assert template_of(_arith(3, "57 * 42 + 76 * 9")) == "arith:n * n + n * n"
    lookup = Task("l1", "When did X die?", ["1960"], "lookup", "mhqa", {"family": "lookup", "relation": "date of death"})
    assert template_of(lookup) == "lookup:date of death"
    assert template_of(TASKS[0]) == "test"  # no metadata: its source


def test_anchor_stream_visits_every_template_before_repeating_one():
    anchors = [_arith(i, "1 + 2") for i in range(5)] + [_arith(10, "3 - 1 + 2"), _arith(11, "4 * 5 - 6")]
    by_id = {a.id: a for a in anchors}
    stream = anchor_stream(anchors, seed=3)
    first = [template_of(next(stream)) for _ in range(3)]
    assert sorted(first) == ["arith:n * n - n", "arith:n + n", "arith:n - n + n"]  # one of each kind first
    rest = [next(stream).id for _ in range(4)]  # then the four "n + n" anchors not yet drawn
    assert len(set(rest)) == 4 and {template_of(by_id[r]) for r in rest} == {"arith:n + n"}
    again = [next(stream).id for _ in range(7)]  # the next pass holds every anchor once more
    assert sorted(again) == sorted(by_id)
    assert [a.id for a in _take(anchor_stream(anchors, seed=3), 14)] == \
        [a.id for a in _take(anchor_stream(anchors, seed=3), 14)]  # seeded: reproducible
    with pytest.raises(ValueError):
        next(anchor_stream([], seed=0))


def _take(stream, n):
    return [next(stream) for _ in range(n)]


def test_keep_by_pass_rate_drops_never_and_always_solved():
    rates = [0.0, 0.25, 0.5, 1.0]
    assert [t.id for t in keep_by_pass_rate(TASKS, rates, 0.2, 0.8)] == ["t2", "t3"]
    # even a window that includes the ends never keeps 0 or 1: such groups carry no signal
    assert [t.id for t in keep_by_pass_rate(TASKS, rates, 0.0, 1.0)] == ["t2", "t3"]
    assert keep_by_pass_rate(TASKS, rates, 0.3, 0.4) == []
    with pytest.raises(ValueError):
        keep_by_pass_rate(TASKS, rates[:2], 0.2, 0.8)


class KnownSkill:
    """Answers task t{k} correctly in its first `k - 1` samples of every 4 (counted per task, in
    the order they are asked for): pass rates 0, 1/4, 2/4, 3/4."""

    def __init__(self, tokenizer):
        self.tokenizer, self.asked = tokenizer, {}

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()):
        out = []
        for prompt in prompts:
            task_no = int(re.search(r"What is (\d+) \+", self.tokenizer.decode(prompt)).group(1))
            sample = self.asked.get(task_no, 0)
            self.asked[task_no] = sample + 1
            value = 2 * task_no if sample % 4 < task_no - 1 else -1
            text = f"<think>t</think><answer>\\boxed{{{value}}}</answer>"
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Generation(ids, text, "stop", 1))
        return out


def _screen(adaptive: bool):
    from coa_lab.generation.models import load_tokenizer

    preset = get_preset("cpu-smoke", rl={"pool_samples": 4, "pool_min_pass": 0.2, "pool_max_pass": 0.8,
                                         "temperature": 1.0, "pool_adaptive": adaptive, "format_reward": True})
    policy = KnownSkill(load_tokenizer(preset.model.name))
    kept, report = select_pool(policy, TASKS, build_tools(["code"]), preset)
    return policy, kept, report


@pytest.mark.model
def test_select_pool_samples_each_candidate_and_keeps_mixed_ones():
    policy, kept, report = _screen(adaptive=False)
    assert [t.id for t in kept] == ["t2", "t3", "t4"]
    assert report.pass_rates == {"t1": 0.0, "t2": 0.25, "t3": 0.5, "t4": 0.75}
    assert report.histogram == {"0/4": 1, "1/4": 1, "2/4": 1, "3/4": 1, "4/4": 0}
    assert report.kept == 3 and report.candidates == 4 and report.rollouts == 16 == sum(policy.asked.values())


@pytest.mark.model
def test_adaptive_screening_keeps_the_same_pool_from_fewer_rollouts():
    policy, kept, report = _screen(adaptive=True)
    assert [t.id for t in kept] == ["t2", "t3", "t4"]  # as with every sample drawn
    # t2's first two samples disagree (right, wrong): mixed whatever follows, so it stops at 2;
    # t1 (wrong, wrong) and t3, t4 (right, right) could still end at 0/4 or 4/4: all 4 drawn
    assert policy.asked == {1: 4, 2: 2, 3: 4, 4: 4} and report.rollouts == 14
    assert report.pass_rates == {"t1": 0.0, "t2": 0.5, "t3": 0.5, "t4": 0.75}
    assert report.histogram == {"0/4": 1, "1/4": 0, "2/4": 1, "3/4": 1, "4/4": 0, "1/2": 1}


@pytest.mark.parametrize("samples", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("window", [(0.2, 0.8), (0.0, 1.0), (0.3, 0.6), (0.5, 0.5)])
def test_an_early_decision_never_differs_from_drawing_every_sample(samples, window):
    """Every outcome sequence: stopping where decided_early says so keeps the candidate (and
    makes it an anchor) exactly when drawing all samples would."""
    lo, hi = window
    first = max(2, -(-samples // 2))
    for outcomes in itertools.product([0, 1], repeat=samples):
        full_rate = sum(outcomes) / samples
        full_kept = bool(keep_by_pass_rate(TASKS[:1], [full_rate], lo, hi))
        head = sum(outcomes[:first])
        if first < samples and decided_early(head, first, samples, lo, hi):
            assert bool(keep_by_pass_rate(TASKS[:1], [head / first], lo, hi)) == full_kept, (outcomes, window)
            assert full_rate != 1.0  # an anchor-to-be is never cut short
    assert decided_early(1, 2, 4, 0.2, 0.8) and not decided_early(2, 2, 4, 0.2, 0.8)
    assert not decided_early(0, 2, 4, 0.2, 0.8) and decided_early(0, 4, 4, 0.2, 0.8)


def test_a_reused_screening_is_rewritten_with_its_rollout_count(tmp_path, monkeypatch):
    """bench_rl_seeds hands seed 0's screening to the later seeds (pipeline.rl reuse_pool): the
    pool.json each seed rewrites must still say how many rollouts that screening drew."""
    import json
    from types import SimpleNamespace

    from coa_lab import pipeline

    preset = get_preset("cpu-smoke")
    ids = [t.id for t in pipeline.draw_tasks(preset, preset.rl.pool, "train", skip=preset.capture.tasks)]
    screened = {"candidates": len(ids), "samples": 2, "kept": len(ids), "rollouts": 6, "histogram": {"1/2": len(ids)},
                "pass_rates": {i: 0.5 for i in ids}, "fallback_to_all_candidates": False, "anchors": [], "pool": ids}
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "pool.json").write_text(json.dumps(screened))
    monkeypatch.setattr(pipeline, "make_tools", lambda preset: None)
    trained = []
    monkeypatch.setattr(pipeline, "train_rl", lambda preset, pool, *a, **k: trained.append(pool) or SimpleNamespace(metrics=[]))
    summary = pipeline.rl(preset, tmp_path, reuse_pool=True)
    assert [t.id for t in trained[0]] == ids  # trained on the screening it was handed, none drawn again
    assert json.loads((tmp_path / "rl" / "pool.json").read_text()) == screened
    assert summary["pool_rollouts"] == 6


def test_headroom_is_pass_at_k_beside_the_mean_pass_rate():
    screening = {"candidates": 4, "samples": 4, "rollouts": 14, "kept": 2, "histogram": {},
                 "pass_rates": {"a": 0.0, "b": 0.25, "c": 0.5, "d": 1.0}}
    h = headroom(screening)
    assert h["mean_pass_at_1"] == 0.4375 and h["pass_at_k"] == 0.75  # 3 of 4 solved at least once
    assert headroom({**screening, "pass_rates": {}})["pass_at_k"] is None
