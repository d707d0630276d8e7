"""`coa-lab arms` on the real embedded model at cpu-smoke size: an SFT adapter trained on a few
rows, two arms x two seeds of one RL step each, every adapter read greedy and at rl.temperature;
a second call with one more seed trains only that seed (12 min on a 2-core CPU: marked slow)."""

from __future__ import annotations

import json

import pytest

from coa_lab.config import get_preset

# minutes on a 2-core CPU (each greedy read of 2 tasks ~25 s, each RL step ~30-60 s): `make test-slow`
pytestmark = [pytest.mark.model, pytest.mark.slow]

SETTINGS = {"model": {"cpu_autocast_bf16": False}, "sft": {"epochs": 1, "batch_size": 2},
            "rl": {"sft_coef": 1.0, "sft_rows": 2, "temperature": 0.9, "steps": 1}}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from coa_lab.training.sft import train_sft
    from coa_lab.trajectories import TrajectoryRecord, save_records

    folder = tmp_path_factory.mktemp("arms") / "run"
    preset = get_preset("cpu-smoke", **SETTINGS)
    records = [TrajectoryRecord(id=f"sft-{i}", task_id=f"t{i}", source="test", profile="math",
                                question=f"What is {i} + 1?", answers=[str(i + 1)],
                                text=f"<think>{i} plus one.</think><answer>\\boxed{{{i + 1}}}</answer>")
               for i in range(4)]
    (folder / "distill").mkdir(parents=True)
    save_records(records, folder / "distill" / "kept.jsonl")
    train_sft(preset, records, folder / "sft")
    (folder / "preset.json").write_text(json.dumps(preset.to_dict()))
    return folder


def test_two_arms_two_seeds_on_the_real_model(run, monkeypatch, capsys):
    from coa_lab import pipeline
    from coa_lab.cli import main

    trained = []
    real = pipeline.rl

    def spy(preset, folder, **kw):
        trained.append((folder.parent.name, folder.name, preset.rl.seed, preset.rl.pg_coef))
        return real(preset, folder, **kw)

    monkeypatch.setattr(pipeline, "rl", spy)
    args = ["arms", "--run", str(run), "--arm", "control", "rl+ptx", "--samples", "2", "--resamples", "200"]
    assert main([*args, "--seeds", "0"]) == 0
    assert main([*args, "--seeds", "0", "1"]) == 0  # seed 0 is on disk: only seed 1 trains
    assert trained == [("control", "seed0", 0, 0.0), ("rl+ptx", "seed0", 0, 1.0),
                       ("control", "seed1", 1, 0.0), ("rl+ptx", "seed1", 1, 1.0)]
    out = run / "arms"
    result = json.loads((out / "arms.json").read_text())
    assert result["seeds"] == [0, 1] and result["tasks"] == 2 and result["temperature"] == 0.9
    for arm in ("control", "rl+ptx"):
        for m in ("greedy", "avg_at_2", "pass_at_2"):
            assert len(result["arms"][arm][m]["gains"]) == 2 and len(result["arms"][arm][m]["ci95"]) == 2
    stored = json.loads((out / "scores" / "rl+ptx_seed1.json").read_text())
    assert stored["temperature"] == 0.9 and all(len(v) == 2 for v in stored["sampled"].values())
    pools = [json.loads((out / "runs" / a / f"seed{s}" / "rl" / "pool.json").read_text()) for a in ("control", "rl+ptx")
             for s in (0, 1)]
    assert len({json.dumps((p["pool"], p["anchors"])) for p in pools}) == 1  # one screening, trained on by every arm and seed
    assert "rl+ptx - control" in capsys.readouterr().out
