"""One small report per run: a stage x key-figures table and three plots, all read back from
the files the stages wrote (nothing here computes a result of its own)."""

from __future__ import annotations

import json
from pathlib import Path


def _load(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def _fmt(x, digits: int = 3) -> str:
    if x is None:
        return "–"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def write_report(run: str | Path) -> Path:
    run = Path(run)
    cap = _load(run / "capture" / "summary.json")
    dis = _load(run / "distill" / "summary.json")
    sft = _load(run / "sft" / "summary.json")
    rl = _load(run / "rl" / "summary.json")
    ev = _load(run / "eval" / "summary.json")
    preset = _load(run / "preset.json") or {}
    rows = []
    if cap:
        rows.append(("capture", f"{cap['runs']} teacher runs, {cap['activations']} agent activations, "
                     f"{cap['tool_calls']} tool calls (teacher: {cap['teacher']})", cap["seconds"]))
    if dis:
        kept = ", ".join(f"{k}: {v}" for k, v in sorted(dis["kept_by_source"].items())) or "none"
        rows.append(("distill", f"{dis['input']} trajectories in, {dis['kept']} kept ({kept})", dis["seconds"]))
    if sft:
        rows.append(("sft", f"{sft['examples']} examples, loss {_fmt(sft['first_loss'])} → {_fmt(sft['last_loss'])}, "
                     f"{sft['trained_tokens']} trained tokens, {sft['masked_observation_tokens']} observation tokens masked",
                     sft["seconds"]))
    if rl and rl["metrics"]:
        m = rl["metrics"]
        kept = sum(x["kept_groups"] for x in m)
        sampled = sum(x["sampled_groups"] for x in m)
        pool = f" (pool: {rl['pool']} questions, {rl['pool_from_sft']} of them from the SFT set)" if "pool" in rl else ""
        updates = sum(1 for x in m if "loss" in x)
        rows.append(("rl", f"{len(m)} DAPO steps{pool}, {updates} with an update, "
                     f"reward {_fmt(m[0]['reward_mean'])} → {_fmt(m[-1]['reward_mean'])}, "
                     f"{kept}/{sampled} groups kept by dynamic sampling, "
                     f"clip fraction {_fmt(sum(x.get('clip_frac', 0) for x in m) / len(m))}", rl["seconds"]))
    if ev:
        parts = []
        for label in ("base", "sft", "rl"):
            if label in ev:
                acc = ", ".join(f"{s} acc {_fmt(v['accuracy'], 2)} valid {_fmt(v['format_valid'], 2)}" for s, v in ev[label].items())
                parts.append(f"{label}: {acc}")
        rows.append(("eval", "; ".join(parts), ev["seconds"]))
    lines = [f"# coa-lab run report: {run.name}", "",
             f"Preset `{preset.get('name', '?')}`, model `{preset.get('model', {}).get('name', '?')}`. "
             "Every figure below was read from the files this run wrote.", "",
             "| stage | key figures | seconds |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    if ev:
        lines += ["", "## Evaluation (held-out tasks)", "",
                  "| model | suite | accuracy | pass@k | answered | format valid | tokens/sample | tool calls/sample |",
                  "|---|---|---|---|---|---|---|---|"]
        for label in ("base", "sft", "rl"):
            for s, v in ev.get(label, {}).items():
                lines.append(f"| {label} | {s} | {_fmt(v['accuracy'], 2)} | {_fmt(v['pass_at_k'], 2)} | {_fmt(v['answered'], 2)} | "
                             f"{_fmt(v['format_valid'], 2)} | {_fmt(v['tokens_per_sample'], 0)} | {_fmt(v['tool_calls_per_sample'], 2)} |")
        tc = ev.get("teacher_cost", {})
        if tc.get("runs"):
            lines += ["", f"Teacher (multi-agent) cost: {_fmt(tc['tokens_per_task'], 0)} tokens and "
                      f"{_fmt(tc['agent_calls_per_task'], 1)} agent calls per task (each agent re-reads its context)."]
    if dis:
        table = run / "distill" / "filter_table.md"
        if table.exists():
            lines += ["", "## Progressive filtering (survivors after each stage)", "", table.read_text().strip()]
    lines += ["", "Plots: " + ", ".join(f"![{p.stem}]({p.name})" for p in _plots(run, sft, rl, ev))]
    out = run / "report.md"
    out.write_text("\n".join(lines) + "\n")
    return out


def _plots(run: Path, sft, rl, ev) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    if sft and sft["losses"]:
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.plot(range(1, len(sft["losses"]) + 1), sft["losses"], marker="o")
        ax.set(xlabel="optimizer step", ylabel="masked SFT loss", title="SFT loss")
        made.append(_save(fig, run / "sft_loss.png"))
    if rl and rl["metrics"]:
        m = rl["metrics"]
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.plot([x["step"] for x in m], [x["reward_mean"] for x in m], marker="o", label="reward")
        ax.plot([x["step"] for x in m], [x["accuracy"] for x in m], marker="s", label="accuracy")
        ax.set(xlabel="DAPO step", ylabel="mean over rollouts", title="RL")
        ax.legend()
        made.append(_save(fig, run / "rl_reward.png"))
    if ev:
        labels = [k for k in ("base", "sft", "rl") if k in ev]
        suites = sorted({s for k in labels for s in ev[k]})
        fig, ax = plt.subplots(figsize=(5, 3))
        width = 0.8 / max(1, len(labels))
        for i, label in enumerate(labels):
            xs = [j + i * width for j in range(len(suites))]
            ax.bar(xs, [ev[label].get(s, {}).get("accuracy", 0) for s in suites], width, label=f"{label} acc")
            ax.scatter(xs, [ev[label].get(s, {}).get("format_valid", 0) for s in suites], marker="x", color="k")
        ax.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(len(suites))], suites)
        ax.set(ylabel="accuracy (bars), format validity (x)", ylim=(0, 1.05), title="Evaluation")
        ax.legend(fontsize=7)
        made.append(_save(fig, run / "eval.png"))
    return made


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
