"""Ablations (notebook 07): switch one part of the recipe off, keep everything else equal.

1. Observation masking: the same kept trajectories, the same SFT steps and seed, with the
   mask on (the recipe) and off (observation tokens keep their labels). Both students are
   evaluated greedily on the same held-out tasks: accuracy, format validity, how often the
   model writes an observation block itself (`protocol.written_observations`) and how often
   it answers without calling a tool at all.
2. DAPO's techniques that can act at one optimizer step per batch, off one at a time: RL from
   the same SFT adapter, same pool, same seed and steps. Each arm's per-step metrics (reward
   curve, kept groups, rollouts that carried a gradient) come from `train_rl`'s own log.
3. Where rollouts come from: the policy's own weights (exact), an int8 copy with
   truncated importance sampling, and the int8 copy without the correction. Same start, pool,
   seed and steps; per step the probability gap between sampler and trainer, the share of
   tokens whose weight hit the cap and the sampling time; then every arm's final policy,
   unquantized, on the same held-out tasks.

Every arm writes its outputs under `out_dir/<arm>/`, and the summary goes to
`out_dir/<name>.json`, so a notebook can plot a finished run without rerunning it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from coa_lab import protocol
from coa_lab.config import Preset
from coa_lab.evaluate import evaluate, save_eval
from coa_lab.generation.llm import make_generator
from coa_lab.rl.trainer import train_rl
from coa_lab.training.sft import train_sft
from coa_lab.trajectories import load_records

# arm name -> RLConfig overrides. "DAPO" is the recipe; each other arm switches one technique off.
# No "no clip-higher" arm: at the recipe's one optimizer step per sampled batch (rl.mini_batches = 1)
# every ratio is exactly 1, so a symmetric clip's run is the recipe's by construction. Notebook 04
# shows the clip where it binds (several optimizer steps on one batch, a cheaper sampler).
DAPO_ARMS: dict[str, dict] = {
    "DAPO": {},
    "no dynamic sampling": {"dynamic_sampling": False},  # all-right / all-wrong groups stay in the batch
    "sequence-level loss": {"loss_agg": "sequence"},  # GRPO's per-sample mean
    "no overlong shaping": {"overlong_buffer": 0, "overlong_filter": False},
}

MASKING_ARMS: dict[str, bool] = {"masked": True, "unmasked": False}

# arm name -> RLConfig overrides: who samples the rollouts. The first arm is the recipe.
ROLLOUT_ARMS: dict[str, dict] = {
    "exact": {},  # the trained policy samples: sampler and trainer agree to float precision
    "int8 + TIS": {"rollout_int8": True},  # an int8 copy samples; each token's loss x min(ratio, tis_cap)
    # only the attention projections in int8: a sampler close enough that its groups carry a gradient
    "int8 attention + TIS": {"rollout_int8": "attention"},
    "int8 attention, no correction": {"rollout_int8": "attention", "tis_cap": None},  # taken as on-policy
}


def _slug(name: str) -> str:
    return name.lower().replace(" ", "_").replace("-", "_")


def rollout_behaviour(records) -> dict:
    """Format validity, accuracy and model-written observations over evaluation records."""
    n = max(1, len(records))
    fake = [protocol.written_observations(r.text) for r in records]
    return {
        "samples": len(records),
        "accuracy": sum(r.reward for r in records) / n,
        "format_valid": sum(bool(r.metadata.get("valid")) for r in records) / n,
        "fake_observation_rate": sum(f > 0 for f in fake) / n,  # rollouts with >= 1 self-written observation
        "fake_observations": sum(fake),
        # answered without calling any tool: facts the model wrote itself instead of looking up
        "no_tool_rate": sum(r.n_tool_calls == 0 for r in records) / n,
    }


def masking_ablation(preset: Preset, records: list, eval_tasks: dict[str, list], tools, out_dir: str | Path) -> dict:
    """Train one SFT student per arm of MASKING_ARMS on `records` and evaluate each on `eval_tasks`."""
    out_dir = Path(out_dir)
    arms = {}
    for arm, mask in MASKING_ARMS.items():
        arm_preset = dataclasses.replace(preset, sft=dataclasses.replace(preset.sft, mask_observations=mask))
        t0 = time.time()
        sft = train_sft(arm_preset, records, out_dir / arm)
        t1 = time.time()
        result = evaluate(make_generator(arm_preset, sft.adapter_dir), eval_tasks, tools, arm_preset, label=arm)
        save_eval(result, out_dir / arm / "eval")
        arms[arm] = {
            "mask_observations": mask,
            "losses": sft.losses,
            "trained_tokens": sft.trained_tokens,
            "optimizer_steps": len(sft.losses),
            **rollout_behaviour(result.records),
            "by_suite": {k: {"accuracy": s.accuracy, "format_valid": s.format_valid} for k, s in result.suites.items()},
            "sft_seconds": round(t1 - t0, 1),
            "eval_seconds": round(time.time() - t1, 1),
        }
    summary = {"examples": len(records), "eval_tasks": {k: len(v) for k, v in eval_tasks.items()}, "arms": arms}
    _write(out_dir / "masking.json", summary)
    return summary


def signal_rollouts(row: dict) -> int:
    return int(row.get("signal_rollouts", 0))


def arm_summary(preset: Preset, overrides: dict, metrics: list[dict], arm_dir: Path, seconds: float) -> dict:
    """One RL arm's story from `train_rl`'s own log (metrics rows) and its rollouts file."""
    rl = preset.rl
    sampled = sum(r["sampled_groups"] for r in metrics) * rl.group_size
    signal = sum(signal_rollouts(r) for r in metrics)
    in_update = sum(r["kept_groups"] for r in metrics) * rl.group_size
    # where the recipe's overlong shaping acts: the policy's tokens in the last `overlong_buffer`
    # before the limit (rollouts recorded before policy_tokens was kept: all their tokens)
    overlong_from = preset.gen.max_response_tokens - rl.overlong_buffer
    rollouts = load_records(arm_dir / "rollouts.jsonl")
    return {
        "overrides": overrides,
        "accuracy": [r["accuracy"] for r in metrics],  # the reward curve (binary task reward)
        "kept_groups": [r["kept_groups"] for r in metrics],
        "signal_rollouts": [signal_rollouts(r) for r in metrics],
        "sampled_rollouts": sampled,
        # rollouts that were generated but moved no weight: dropped groups, and groups in the
        # batch whose advantages are all zero
        "wasted_fraction": 1 - signal / max(1, sampled),
        # the share of the update batch that carried a gradient: what dynamic sampling guarantees
        "update_signal_fraction": signal / max(1, in_update),
        "updates": sum("loss" in r for r in metrics),
        "clip_frac": [r.get("clip_frac") for r in metrics],
        # how often each technique's condition occurred at all (an arm that never meets it
        # cannot differ from the recipe)
        "high_ratio_frac": [r.get("high_ratio_frac") for r in metrics],
        "overlong_rollouts": sum(r.metadata.get("policy_tokens", r.n_tokens) > overlong_from
                                 or bool(r.metadata.get("truncated")) for r in rollouts),
        "response_len": [r["response_len_sampled"] for r in metrics],
        # mean |p_train - p_sampler| per policy token (None: a step without an update)
        "logprob_gap": [r.get("logprob_gap") for r in metrics],
        # every arm with rl.tis_cap whose sampler reports log-probs (None: no correction, or no update)
        "tis_capped_frac": [r.get("tis_capped_frac") for r in metrics],
        "tis_weight_mean": [r.get("tis_weight_mean") for r in metrics],
        "sample_seconds": [r.get("sample_seconds") for r in metrics],
        "seconds": round(seconds, 1),
    }


def dapo_ablation(preset: Preset, pool: list, tools, out_dir: str | Path, adapter: str | Path | None,
                  arms: dict[str, dict] | None = None, sft_records: list | None = None, name: str = "dapo") -> dict:
    """One RL run per arm (default DAPO_ARMS), all from `adapter` on the same pool and seed;
    sft_records: the SFT set, for a preset that mixes its loss in (rl.sft_coef). The summary
    goes to out_dir/<name>.json."""
    out_dir = Path(out_dir)
    results = {}
    for arm, overrides in (arms or DAPO_ARMS).items():
        arm_preset = dataclasses.replace(preset, rl=dataclasses.replace(preset.rl, **overrides))
        t0 = time.time()
        run = train_rl(arm_preset, list(pool), tools, out_dir / _slug(arm), adapter=adapter, sft_records=sft_records)
        results[arm] = arm_summary(arm_preset, overrides, run.metrics, out_dir / _slug(arm), time.time() - t0)
    summary = {"pool": len(pool), "steps": preset.rl.steps, "prompts_per_step": preset.rl.prompts_per_step,
               "group_size": preset.rl.group_size, "arms": results}
    _write(out_dir / f"{name}.json", summary)
    return summary


def rollout_ablation(preset: Preset, pool: list, tools, out_dir: str | Path, adapter: str | Path | None,
                     eval_tasks: dict[str, list], sft_records: list | None = None,
                     arms: dict[str, dict] | None = None) -> dict:
    """RL with rollouts from each arm's sampler (default ROLLOUT_ARMS), then every arm's final
    policy evaluated greedily with its trained, unquantized weights on `eval_tasks`: what a
    cheaper sampler costs in what the policy learns, not only in the training curve."""
    out_dir = Path(out_dir)
    summary = dapo_ablation(preset, pool, tools, out_dir, adapter, arms=arms or ROLLOUT_ARMS,
                            sft_records=sft_records, name="rollouts")
    for arm, result in summary["arms"].items():
        t0 = time.time()
        # evaluation never samples from the int8 copy: the generator loads the saved adapter, unquantized
        final = evaluate(make_generator(preset, out_dir / _slug(arm) / "adapter"), eval_tasks, tools, preset,
                         label=_slug(arm))
        save_eval(final, out_dir / _slug(arm) / "eval")
        result["final"] = rollout_behaviour(final.records)
        result["eval_seconds"] = round(time.time() - t0, 1)
    summary["eval_tasks"] = {k: len(v) for k, v in eval_tasks.items()}
    _write(out_dir / "rollouts.json", summary)
    return summary


def _write(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")
