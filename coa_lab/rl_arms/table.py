"""The paired table, computed from the stored per-task outcomes alone (scores/*.json): rerun it
(`coa-lab arms --table-only`) with no model and no training. Every figure is a
coa_lab/comparison.py function of those outcomes."""

from __future__ import annotations

import json
import re
from pathlib import Path

from coa_lab.comparison import paired_block
from coa_lab.rl_arms.readout import metric_scores


def metrics(samples: int) -> list[str]:
    return ["greedy"] + ([f"avg_at_{samples}", f"pass_at_{samples}"] if samples > 0 else [])


def load_scores(out: Path) -> tuple[dict, dict[str, dict[int, dict]]]:
    """The SFT start's readout and every (arm, seed) readout stored under out/scores."""
    scores = out / "scores"
    sft = json.loads((scores / "sft.json").read_text())
    runs: dict[str, dict[int, dict]] = {}
    for f in sorted(scores.glob("*_seed*.json")):
        d = json.loads(f.read_text())
        runs.setdefault(d["arm"], {})[d["seed"]] = d
    return sft, runs


def key(name: str) -> str:
    """"rl+ptx" -> "rl_ptx": an arm's name as a JSON key part (rl_ptx_minus_control)."""
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


def _by_family(entries: list[dict], names: list[str]) -> dict:
    """family -> metric -> one figure per entry (seed): where a gain is."""
    out: dict[str, dict[str, list[float]]] = {}
    for fam in sorted({f for f in entries[0]["family"].values()}):
        tasks = [t for t, f in entries[0]["family"].items() if f == fam]
        out[fam] = {m: [sum(metric_scores(e, m)[t] for t in tasks) / len(tasks) for e in entries] for m in names}
    return out


def _compare(before: list[dict], after: list[dict], names: list[str], resamples: int) -> dict:
    """One block per metric over the seeds, each seed's `after` against its `before`."""
    return {m: paired_block([(metric_scores(b, m), metric_scores(a, m)) for b, a in zip(before, after)], resamples)
            for m in names}


def _pairs(order: list[str], against: str | None) -> list[tuple[str, str]]:
    """(a, b) for a − b: every arm against `against`, then each other pair in the order given."""
    out = [(a, against) for a in order if against and a != against]
    rest = [a for a in order if a != against]
    return out + [(a, b) for i, a in enumerate(rest) for b in rest[i + 1:]]


def build(sft: dict, runs: dict[str, dict[int, dict]], order: list[str], against: str | None, samples: int,
          resamples: int = 10_000) -> dict:
    """arms.json's figures: per arm against SFT, per pair of arms seed by seed, per family."""
    names = metrics(samples)
    tasks = sorted(sft["greedy"])
    order = [a for a in order if a in runs] + sorted(a for a in runs if a not in order)
    result = {"tasks": len(tasks), "task_ids": tasks, "metrics": names, "against": against,
              "seeds": sorted({s for by in runs.values() for s in by}),
              "sft": {"by_family": _by_family([sft], names),
                      **{m: sum(metric_scores(sft, m).values()) / len(tasks) for m in names}},
              "arms": {}}
    for arm in order:
        seeds = sorted(runs[arm])
        entries = [runs[arm][s] for s in seeds]
        result["arms"][arm] = {"seeds": seeds, "overrides": entries[0].get("overrides"),
                               "adapters": [e["adapter"] for e in entries],
                               "by_family": _by_family(entries, names),
                               **_compare([sft] * len(entries), entries, names, resamples)}
    for a, b in _pairs(order, against if against in runs else None):
        seeds = sorted(set(runs[a]) & set(runs[b]))
        if seeds:
            result[f"{key(a)}_minus_{key(b)}"] = {
                "a": a, "b": b, "seeds": seeds,
                **_compare([runs[b][s] for s in seeds], [runs[a][s] for s in seeds], names, resamples)}
    return result


def _row(label: str, metric: str, block: dict, level: float | None) -> str:
    lo, hi = (100 * x for x in block["ci95"])
    seeds = "  ".join(f"{100 * g:+.1f}±{100 * se:.1f} ({w}/{lost})" for g, se, w, lost in
                      zip(block["gains"], block["paired_se"], block["won"], block["lost"]))
    score = "" if level is None else f"{100 * level:6.1f}"
    return f"{label:<22} {metric:<10} {score:>6}  {100 * block['mean']:+6.1f} [{lo:+.1f}, {hi:+.1f}]   {seeds}"


def render(result: dict) -> str:
    """The printed table: points (x100); per seed: gain ± paired SE (tasks won/lost)."""
    names = result["metrics"]
    lines = [f"{result['tasks']} tasks, seeds {result['seeds']}; points: score, mean gain [95% interval over "
             f"seeds and tasks], per seed gain ± paired SE (won/lost)",
             f"{'sft':<22} " + "  ".join(f"{m} {100 * result['sft'][m]:.1f}" for m in names)]
    for arm, row in result["arms"].items():
        for m in names:
            level = sum(row[m]["after"]) / len(row[m]["after"])
            lines.append(_row(f"{arm} - sft", m, row[m], level))
        fams = "; ".join(f"{fam} " + "/".join(f"{100 * sum(v) / len(v):.1f}" for v in by.values())
                         for fam, by in row["by_family"].items())
        lines.append(f"{'':<22} by family ({'/'.join(names)}): {fams}")
    for name, diff in result.items():
        if isinstance(diff, dict) and "_minus_" in name and "a" in diff:
            for m in names:
                lines.append(_row(f"{diff['a']} - {diff['b']}", m, diff[m], None))
    return "\n".join(lines)
