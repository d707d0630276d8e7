"""Fixtures for tests/arms: `coa-lab arms` without a model: the model's two touch points (training one arm, sampling its
answers) stood in by fakes whose outcomes depend on the adapter, the task, the sample and the
temperature, so the command's bookkeeping (what is trained, read, resumed, paired) is tested in
seconds. tests/arms/test_arms_model.py runs the real thing at cpu-smoke size."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from coa_lab.config import get_preset

SETTINGS = {"rl": {"sft_coef": 1.0, "steps": 2, "temperature": 0.7},
            "eval": {"val_tasks": {"math/arith": 6, "mhqa/lookup": 3}}}


class Fakes:
    def __init__(self):
        self.trained: list[tuple[str, bool, bool]] = []  # (run folder, resume, reuse_pool)
        self.evaluated: list[tuple[str, int, float]] = []  # (adapter, samples, temperature)
        self.fail_training_at: int | None = None  # the n-th pipeline.rl call dies half-way
        self.checkpoint_before_failing = False

    def rl(self, preset, run, resume=False, reuse_pool=False):
        self.trained.append((str(run), resume, reuse_pool))
        pool = run / "rl" / "pool.json"
        assert pool.exists() == reuse_pool
        if not pool.exists():
            pool.parent.mkdir(parents=True, exist_ok=True)
            pool.write_text(json.dumps({"candidates": 4, "samples": 2, "kept": 2, "pass_rates": {"a": 0.5, "b": 1.0},
                                        "histogram": {}, "rollouts": 8, "pool": ["a"], "anchors": ["b"]}))
        if len(self.trained) == self.fail_training_at:
            if self.checkpoint_before_failing:
                (run / "rl" / "checkpoint" / "adapter").mkdir(parents=True)
                (run / "rl" / "checkpoint" / "state.pt").write_text("x")
                (run / "rl" / "checkpoint" / "adapter" / "adapter_config.json").write_text("{}")
            raise KeyboardInterrupt("killed")
        (run / "rl" / "adapter").mkdir(parents=True, exist_ok=True)
        (run / "rl" / "adapter" / "adapter_config.json").write_text("{}")
        summary = {"metrics": [{"accuracy": 0.5}] * preset.rl.steps, "seconds": 1.0}
        (run / "rl" / "summary.json").write_text(json.dumps(summary))
        return summary

    def evaluate(self, generator, groups, tools, preset, label="model", samples=None, temperature=None):
        k = samples or preset.eval.samples
        temp = temperature if temperature is not None else preset.eval.temperature
        self.evaluated.append((generator, k, temp))
        records = []
        for suite, tasks in groups.items():
            for t in tasks:
                for i in range(k):
                    r = random.Random(f"{generator}|{t.id}|{i}|{temp}").random() < 0.5
                    records.append(SimpleNamespace(task_id=t.id, reward=float(r),
                                                   metadata={"suite": suite, "valid": True}))
        return SimpleNamespace(records=records)


@pytest.fixture
def fakes(monkeypatch):
    from coa_lab import pipeline
    from coa_lab.rl_arms import readout

    f = Fakes()
    monkeypatch.setattr(pipeline, "rl", f.rl)
    monkeypatch.setattr(pipeline, "make_tools", lambda preset: None)
    monkeypatch.setattr(readout, "evaluate", f.evaluate)
    monkeypatch.setattr(readout, "make_generator", lambda preset, adapter: str(adapter))
    return f


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A run folder as `coa-lab sft` leaves it: preset.json, distill/kept.jsonl, sft/adapter/."""
    from coa_lab.rl_arms import runner

    monkeypatch.setattr(runner, "READINGS", tmp_path / "confirm_readings.jsonl")
    folder = tmp_path / "run"
    (folder / "sft" / "adapter").mkdir(parents=True)
    (folder / "sft" / "adapter" / "adapter_config.json").write_text("{}")
    (folder / "distill").mkdir()
    (folder / "distill" / "kept.jsonl").write_text("{}\n")
    (folder / "preset.json").write_text(json.dumps(get_preset("cpu-smoke", **SETTINGS).to_dict()))
    return folder
