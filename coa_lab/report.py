"""One small report per run: a stage x key-figures table and three plots, all read back from
the files the stages wrote (nothing here computes a result of its own)."""

from __future__ import annotations

import json
from pathlib import Path

from coa_lab.published import publish
from coa_lab.rl_against_control import against_control, control_lines


def _load(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def _fmt(x, digits: int = 3) -> str:
    if x is None:
        return "–"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _pooled(results: dict, keys) -> dict | None:
    """Headline figures of one model pooled over benchmark keys (weighted by samples)."""
    rows = [results[k] for k in keys if k in results]
    n = sum(r["tasks"] * r["samples"] for r in rows)
    if not n:
        return None
    wins = sum(r["accuracy"] * r["tasks"] * r["samples"] for r in rows)
    win_tokens = sum((r["tokens_per_success"] or 0) * r["accuracy"] * r["tasks"] * r["samples"] for r in rows)
    return {"tasks": sum(r["tasks"] for r in rows), "accuracy": wins / n,
            "format_valid": sum(r["format_valid"] * r["tasks"] * r["samples"] for r in rows) / n,
            "tokens_per_success": win_tokens / wins if wins else None}


def revisited_questions(rollouts_path: Path, exclude: frozenset[str] | set[str] = frozenset()) -> dict | None:
    """RL pool questions sampled at two or more steps: mean accuracy at their first step and at
    their last. A paired comparison -- the same questions before and after the updates in
    between -- so it does not move with which questions a step happened to draw, as the
    per-step curve does. `exclude`: task ids left out (the anchors, which start solved)."""
    if not rollouts_path.exists():
        return None
    by_task: dict[str, dict[int, list[float]]] = {}
    for line in rollouts_path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            if rec["task_id"] in exclude:
                continue
            by_task.setdefault(rec["task_id"], {}).setdefault(rec["metadata"]["step"], []).append(rec["reward"])
    pairs = []
    for steps in by_task.values():
        if len(steps) >= 2:
            first, last = steps[min(steps)], steps[max(steps)]
            pairs.append((sum(first) / len(first), sum(last) / len(last)))
    if not pairs:
        return None
    return {"questions": len(pairs), "first": sum(a for a, _ in pairs) / len(pairs),
            "last": sum(b for _, b in pairs) / len(pairs)}


def paired_gain(eval_dir: Path, headline, a: str = "sft", b: str = "rl") -> dict | None:
    """b − a over the same headline test tasks, with its paired standard error: each task's
    score under b minus under a (averaged over its samples), then the mean and SE of those
    differences. Paired, because both models answer the same questions: the SE is of the
    difference itself, not two accuracies' noise added. A gain within about 2 SE of 0 is
    what a re-run with another seed could reverse (benchmarks/bench_rl_seeds.py measures that)."""
    scores = {}
    for label in (a, b):
        path = eval_dir / f"{label}_trajectories.jsonl"
        if not path.exists():
            return None
        per_task: dict[str, list[float]] = {}
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                if rec.get("metadata", {}).get("suite") in headline:  # older runs did not record it
                    per_task.setdefault(rec["task_id"], []).append(rec["reward"] or 0.0)
        scores[label] = {t: sum(v) / len(v) for t, v in per_task.items()}
    common = sorted(set(scores[a]) & set(scores[b]))
    n = len(common)
    if n < 2:
        return None
    diffs = [scores[b][t] - scores[a][t] for t in common]
    mean = sum(diffs) / n
    se = (sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) ** 0.5
    return {"tasks": n, "gain": mean, "se": se,
            f"{b}_only": sum(1 for d in diffs if d > 0), f"{a}_only": sum(1 for d in diffs if d < 0)}


# What the demo's RL − SFT figure is, and what it is not: one seed, against the SFT adapter, and
# any further training of a student more SFT still improves gains something, so part of it may be that
RL_FIGURE_CAVEAT = (
    "What the RL figure can and cannot show: it is one seed's RL adapter against the SFT adapter it "
    "started from. Any further training gains something while more SFT still improves the student (and a "
    "preset with rl.sft_coef > 0 mixes the SFT loss into every RL update), so a gain here may be more SFT, "
    "and one seed's paired standard error is as large as RL's effect. RL against its control (below) "
    "takes more SFT out; across seeds, with intervals: `coa-lab arms` (docs/rl-effect.md).")


def summarize(run: str | Path, headline=None) -> dict:
    """The demo's headline figures (what a learner should see learned), read from the files the
    stages wrote; measured on the held-out tasks of the learnable families."""
    run = Path(run)
    preset = _load(run / "preset.json") or {}
    headline = tuple(headline or preset.get("eval", {}).get("headline", ()))
    cap, dis = _load(run / "capture" / "summary.json"), _load(run / "distill" / "summary.json")
    rl, ev, timing = _load(run / "rl" / "summary.json"), _load(run / "eval" / "summary.json") or {}, _load(run / "timing.json")
    pooled = {label: _pooled(ev.get(label, {}), headline) for label in ("base", "sft", "rl")}
    teacher = (ev.get("teacher") or {}).get("all")
    single = pooled["rl"] or pooled["sft"]
    metrics = (rl or {}).get("metrics", [])

    def get(d, key):
        return None if d is None else d.get(key)

    return {
        "headline_benchmarks": list(headline),
        "teacher_success": get(((cap or {}).get("success") or {}).get("all"), "accuracy"),
        # the teacher's own runs, one-hop and multi-hop ("teacher", "teacher-2hop")
        "kept_from_teacher_fraction": (sum(n for s, n in dis["kept_by_source"].items() if s.startswith("teacher"))
                                       / dis["kept"]) if dis and dis["kept"] else None,
        "base_accuracy": get(pooled["base"], "accuracy"),
        "sft_accuracy": get(pooled["sft"], "accuracy"),
        "sft_format_valid": get(pooled["sft"], "format_valid"),
        "rl_accuracy": get(pooled["rl"], "accuracy"),
        "rl_steps": len(metrics),
        "rl_updates": sum(1 for m in metrics if "loss" in m),
        "rl_train_accuracy_by_step": [m["accuracy"] for m in metrics],
        "rl_revisited_questions": revisited_questions(
            run / "rl" / "rollouts.jsonl", exclude=set((_load(run / "rl" / "pool.json") or {}).get("anchors", []))),
        "teacher_accuracy": get(teacher, "accuracy"),
        "tokens_per_success_ratio": (single["tokens_per_success"] / teacher["tokens_per_success"])
        if single and teacher and single["tokens_per_success"] and teacher.get("tokens_per_success") else None,
        "single_tokens_per_success": get(single, "tokens_per_success"),
        "teacher_tokens_per_success": get(teacher, "tokens_per_success"),
        "eval_tasks": get(pooled["base"] or single, "tasks"),
        # the reported split is TEST, the selection split: settings were chosen on validation, but
        # the RL seed benchmarks read these tasks before two preset decisions (docs/design.md)
        "test_tasks": get(pooled["base"] or single, "tasks"),
        "rl_test_gain": (pooled["rl"]["accuracy"] - pooled["sft"]["accuracy"]) if pooled["rl"] and pooled["sft"] else None,
        # the same gain task by task, with the paired standard error that says whether it is noise
        "rl_test_gain_paired": paired_gain(run / "eval", headline),
        # RL against the RL stage with its policy gradient off, greedy and sampled (eval.control)
        "rl_against_control": against_control(run / "eval", headline),
        "val_accuracy": {label: get(_pooled(res, headline), "accuracy") for label, res in (ev.get("val") or {}).items()},
        "rl_entropy_by_step": [m.get("entropy") for m in metrics],
        "rl_logprob_gap_by_step": [m.get("logprob_gap") for m in metrics],
        "seconds": get(timing, "total_seconds"),
        # the RL stage's share of the demo's time (screening included): RL should not dominate a lesson run
        "rl_time_share": (timing["rl"] / timing["total_seconds"])
        if timing and timing.get("rl") and timing.get("total_seconds") else None,
        "stage_seconds": {k: v for k, v in (timing or {}).items()
                          if k != "total_seconds" and isinstance(v, (int, float))},  # not the machine's peaks
        # a demo resumed after an interruption (`coa-lab demo --resume`): which stages it kept, which it continued
        "resumed": get(timing, "resumed"),
    }


def write_summary(run: str | Path, preset=None) -> Path:
    out = Path(run) / "summary.json"
    out.write_text(json.dumps(summarize(run, preset.eval.headline if preset else None), indent=2) + "\n")
    return out


def publish_run(run: str | Path, name: str, source: str, directory: Path | None = None) -> Path:
    """docs/results/<name>.json from a finished run, for figures the README quotes by link
    (tests/repo/test_published_figures.py): summary.json's headline figures, the distillation funnel,
    the evaluation per benchmark and system, and the stage times with the machine probes they
    were measured beside. Everything is read back from the files the stages wrote."""
    run = Path(run)
    timing = _load(run / "timing.json") or {}
    summary = _load(run / "summary.json")
    if summary is None:
        raise FileNotFoundError(f"{run / 'summary.json'}: no finished run to publish (run `coa-lab demo` first)")
    dis, ev, preset = _load(run / "distill" / "summary.json"), _load(run / "eval" / "summary.json"), _load(run / "preset.json")
    doc = {"preset": (preset or {}).get("name"), "summary": summary, "funnel": dis, "eval": ev,
           "machine_start": timing.get("machine_start"), "machine": timing.get("machine")}
    return publish(name, doc, source, timing.get("machine") or {}, directory)


def _thirds(xs: list[float]) -> tuple[float, float] | None:
    """Mean of the first and of the last third of a curve (None when too short)."""
    k = len(xs) // 3
    if k == 0:
        return None
    return sum(xs[:k]) / k, sum(xs[-k:]) / k


def write_report(run: str | Path) -> Path:
    """run/report.md and its plots, read back from the files the stages wrote."""
    run = Path(run)
    cap = _load(run / "capture" / "summary.json")
    dis = _load(run / "distill" / "summary.json")
    sft = _load(run / "sft" / "summary.json")
    rl = _load(run / "rl" / "summary.json")
    ev = _load(run / "eval" / "summary.json")
    preset = _load(run / "preset.json") or {}
    timing = _load(run / "timing.json") or {}
    summary = summarize(run)
    lines = [f"# coa-lab run report: {run.name}", "",
             f"Preset `{preset.get('name', '?')}`, model `{preset.get('model', {}).get('name', '?')}`. "
             "Every figure below was read from the files this run wrote.", ""]
    lines += _machine_lines(timing, summary)
    lines += _headline_lines(summary)
    lines += control_lines(summary["rl_against_control"])
    lines += _stage_lines(cap, dis, sft, rl, ev, _load(run / "control" / "rl" / "summary.json"))
    if rl and rl["metrics"]:
        lines += _rl_step_lines(rl["metrics"])
    if ev:
        lines += _eval_lines(ev)
    if dis:
        lines += _filter_lines(run, dis)
    lines += ["", "Plots: " + ", ".join(f"![{p.stem}]({p.name})" for p in _plots(run, sft, rl, ev))]
    out = run / "report.md"
    out.write_text("\n".join(lines) + "\n")
    return out


def _machine_lines(timing: dict, summary: dict) -> list[str]:
    """The machine the run measured under (its matmul peaks, start -> end) and the run's time."""
    machine = timing.get("machine") or {}
    if not machine:
        return []
    start = timing.get("machine_start") or {}
    fp32 = _fmt(machine.get('fp32_gflops'), 0)
    if start.get("fp32_gflops"):  # the run's start -> end: how much the machine drifted under it
        fp32 = f"{_fmt(start.get('fp32_gflops'), 0)} (start) → {fp32} (end)"
    return [f"Machine: {machine.get('cores', '?')} cores, measured matmul peak fp32 "
            f"{fp32} GFLOP/s, bf16 {_fmt(machine.get('bf16_gflops'), 0)} GFLOP/s "
            f"(bf16 autocast {'on' if machine.get('bf16_autocast') else 'off'}); "
            f"total {_fmt(timing.get('total_seconds'), 0)} s"
            + (f", RL {summary['rl_time_share']:.0%} of it." if summary.get("rl_time_share") else ".")
            + _resumed_line(timing.get("resumed")), ""]


def _resumed_line(resumed: dict | None) -> str:
    """A resumed demo's times are its stages' own seconds, not one wall-clock span: say so."""
    if not resumed:
        return ""
    kept = ", ".join(resumed.get("kept") or []) or "none"
    go_on = resumed.get("continued")
    # evaluation keeps each finished system's seconds; capture, SFT and RL count only this start's part
    caveat = "" if go_on == "eval" else " (its time counts only the part after the resume)"
    return (f" Resumed (`coa-lab demo --resume`): stages kept from before: {kept}"
            + (f"; {go_on} continued from its partial work{caveat}" if go_on else "")
            + "; the total is the sum of the stages' own times.")


# What read the headline's tasks before this run: they are the selection split (docs/design.md),
# so the report must not call them untouched by tuning
HEADLINE_SPLIT = (
    "Settings were chosen on the validation split; the RL seed benchmarks also read these families' "
    "192 test tasks, and two preset decisions followed them, so the test split is the selection split, "
    "not one no choice has seen. The confirmation split, the rest of the test files, is read only for "
    "a final recipe (docs/design.md).")


def _headline_lines(summary: dict) -> list[str]:
    """The headline table: each stage's figure on the test split, validation beside it."""
    n = summary["eval_tasks"]
    head = ", ".join(summary["headline_benchmarks"]) or "–"
    first_last = _thirds(summary["rl_train_accuracy_by_step"])
    rv = summary["rl_revisited_questions"]
    val = summary["val_accuracy"]
    return ["## Headline (TEST split of the learnable families, also the selection split: " + head + ")", "",
            HEADLINE_SPLIT, "",
            "| figure | value |", "|---|---|",
            f"| teacher success on its capture tasks | {_fmt(summary['teacher_success'], 2)} |",
            f"| kept SFT trajectories that are the teacher's own runs | {_fmt(summary['kept_from_teacher_fraction'], 2)} |",
            f"| accuracy: base → SFT → RL ({n} tasks) | {_fmt(summary['base_accuracy'], 2)} → "
            f"{_fmt(summary['sft_accuracy'], 2)} → {_fmt(summary['rl_accuracy'], 2)} |",
            _rl_gain_row(summary["rl_test_gain"], summary["rl_test_gain_paired"]),
            f"| validation split (where settings are chosen): base → SFT → RL | "
            + (" → ".join(_fmt(val.get(k), 2) for k in ("base", "sft", "rl")) if val else "–") + " |",
            f"| SFT format validity | {_fmt(summary['sft_format_valid'], 2)} |",
            f"| RL steps with an update | {summary['rl_updates']} of {summary['rl_steps']} |",
            f"| RL training accuracy, first third → last third of steps | "
            + (f"{first_last[0]:.2f} → {first_last[1]:.2f}" if first_last else "–") + " |",
            f"| RL pool questions sampled at 2+ steps: accuracy at their first → last step | "
            + (f"{rv['first']:.2f} → {rv['last']:.2f} ({rv['questions']} questions)" if rv else "–") + " |",
            f"| multi-agent teacher accuracy on the same held-out tasks | {_fmt(summary['teacher_accuracy'], 2)} |",
            f"| tokens per success: single model / teacher | {_fmt(summary['single_tokens_per_success'], 0)} / "
            f"{_fmt(summary['teacher_tokens_per_success'], 0)} = {_fmt(summary['tokens_per_success_ratio'], 2)} |", "",
            RL_FIGURE_CAVEAT, ""]


def _rl_gain_row(gain: float | None, pg: dict | None) -> str:
    """RL − SFT on the test split, with its paired standard error and whether it is within noise."""
    return (f"| RL − SFT on the test split | " + (f"{gain * 100:+.1f} points" if gain is not None else "–")
            + (f" (paired standard error ±{pg['se'] * 100:.1f} over {pg['tasks']} tasks; right only after RL: "
               f"{pg['rl_only']}, only before: {pg['sft_only']}"
               + ("; within 2 SE of 0: a re-run could reverse it" if abs(pg["gain"]) < 2 * pg["se"] else "") + ")"
               if pg else "") + " |")


def _stage_lines(cap, dis, sft, rl, ev, ctl=None) -> list[str]:
    """One row per stage that ran: its key figures, its seconds and its throughput (rollouts/s, tokens/s; the
    machine's matmul probe is the line above the table)."""
    rows = []
    if cap:
        rows.append(("capture", f"{cap['runs']} teacher runs, {cap['activations']} agent activations, "
                     f"{cap['tool_calls']} tool calls (teacher: {cap['teacher']}); success "
                     + ", ".join(f"{k} {_fmt(v['accuracy'], 2)}" for k, v in cap.get("success", {}).items()), cap["seconds"],
                     *_rates(cap.get("generated"))))
    if dis:
        kept = ", ".join(f"{k}: {v}" for k, v in sorted(dis["kept_by_source"].items())) or "none"
        rows.append(("distill", f"{dis['input']} trajectories in, {dis['kept']} kept ({kept})", dis["seconds"], "–", "–"))
    if sft:
        rows.append(("sft", f"{sft['examples']} examples, loss {_fmt(sft['first_loss'])} → {_fmt(sft['last_loss'])}, "
                     f"{sft['trained_tokens']} trained tokens, {sft['masked_observation_tokens']} observation tokens masked",
                     sft["seconds"], "–", _fmt(sft["trained_tokens"] / sft["seconds"], 0) + " trained"
                     if sft.get("seconds") else "–"))
    if rl and rl["metrics"]:
        m = rl["metrics"]
        kept = sum(x["kept_groups"] for x in m)
        sampled = sum(x["sampled_groups"] for x in m)
        pool = (f" on a pool of {rl['pool']} of {rl.get('pool_candidates', '?')} candidates screened by pass rate "
                f"{rl.get('pool_histogram', {})}" + (" (too few mixed: all candidates used)" if rl.get("pool_fallback") else ""))
        anchors = f", {rl['anchors']} always-solved anchors" if rl.get("anchors") else ""
        rows.append(("rl", f"{len(m)} DAPO steps{pool}{anchors}; {kept}/{sampled} groups kept by dynamic sampling "
                     f"(screening took {_fmt(rl.get('pool_seconds'), 0)} s)", rl["seconds"], *_rates(rl.get("generated"))))
    if ctl and ctl["metrics"]:
        rows.append(("control", f"the RL stage with the policy gradient off: {len(ctl['metrics'])} steps of the SFT "
                     "mix alone, nothing sampled", ctl["seconds"], "–", "–"))
    if ev:
        rows.append(("eval", f"base, SFT, RL (and control) single models on {sum(v['tasks'] for v in ev.get('base', {}).values())} "
                     "held-out tasks; the teacher on the headline ones"
                     + (" (seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in ev["seconds_by_system"].items()) + ")"
                        if ev.get("seconds_by_system") else ""), ev["seconds"], *_rates(ev.get("generated"))))
    return (["## Stages", "", "| stage | key figures | seconds | rollouts/s | tokens/s |", "|---|---|---|---|---|"]
            + ["| " + " | ".join(str(x) for x in row) + " |" for row in rows])


def _rates(generated: dict | None) -> tuple[str, str]:
    """A stage's rollouts/s and generated tokens/s (coa_lab/throughput.py), "–" where it has none."""
    if not generated or "rollouts_per_s" not in generated:
        return "–", "–"
    return _fmt(generated["rollouts_per_s"], 2), _fmt(generated["tokens_per_s"], 0)


def _rl_step_lines(metrics: list[dict]) -> list[str]:
    """The RL stage step by step: accuracy, groups kept, drift, lengths, time."""
    lines = ["", "## RL, step by step", "",
             "| step | train accuracy (pool) | anchor accuracy (kept groups) | kept / sampled groups | clip fraction "
             "| entropy | prob. gap | turn-cut rollouts | response tokens | tool calls / rollout | seconds (sampling) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in metrics:
        anchor = (f"{_fmt(x['anchor_accuracy'], 2)} ({x['anchor_groups_kept']})" if x.get("anchor_groups") else "–")
        lines.append(f"| {x['step']} | {_fmt(x['accuracy'], 2)} | {anchor} | {x['kept_groups']} / {x['sampled_groups']} | "
                     f"{_fmt(x.get('clip_frac'), 3)} | {_fmt(x.get('entropy'), 3)} | {_fmt(x.get('logprob_gap'), 4)} | "
                     f"{x.get('turn_cut_rollouts', '–')} | {_fmt(x.get('response_len_sampled'), 0)} | "
                     f"{_fmt(x['tool_calls_per_rollout'], 2)} | {x['seconds']} ({_fmt(x.get('sample_seconds'), 0)}) |")
    return lines


def _eval_lines(ev: dict) -> list[str]:
    """Every model on every benchmark (test split, then validation), and the teacher."""
    lines = ["", "## Evaluation (test split; val_* rows: the validation split)", "",
             "| model | benchmark | tasks | accuracy | answered | format valid | tokens/sample | tokens/success | tool calls/success |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, res in [(k, ev.get(k, {})) for k in ("base", "sft", "rl")] + \
            [(f"val_{k}", v) for k, v in (ev.get("val") or {}).items()]:
        for b, v in res.items():
            lines.append(f"| {label} | {b} | {v['tasks']} | {_fmt(v['accuracy'], 2)} | {_fmt(v['answered'], 2)} | "
                         f"{_fmt(v['format_valid'], 2)} | {_fmt(v['tokens_per_sample'], 0)} | "
                         f"{_fmt(v['tokens_per_success'], 0)} | {_fmt(v['tool_calls_per_success'], 2)} |")
    for b, v in (ev.get("teacher") or {}).items():
        lines.append(f"| teacher (multi-agent) | {b} | {v['runs']} | {_fmt(v['accuracy'], 2)} | – | – | "
                     f"{_fmt(v['tokens_per_task'], 0)} | {_fmt(v['tokens_per_success'], 0)} | {_fmt(v['tool_calls_per_success'], 2)} |")
    notes = ["", "Teacher tokens count every agent's whole prompt (each agent re-reads its own context "
             "and worked examples); the single model's count its prompt and its whole trajectory."]
    if ev.get("val") and "base" not in ev["val"]:
        notes.append("The base model is read on the test split only: without SFT it scores 0.00, so a "
                     "validation reading would choose nothing.")
    if ev.get("cached"):
        notes.append(f"The teacher's readout was read back from the cache (key {ev['cached']}; computed in "
                     f"{ev.get('first_seconds')} s by the run that kept it).")
    return lines + notes


def _filter_lines(run: Path, dis: dict) -> list[str]:
    """The distillation funnel: survivors after each filter, and what each removed, by reason."""
    lines = []
    table = run / "distill" / "filter_table.md"
    if table.exists():
        lines += ["", "## Progressive filtering (survivors after each stage)", "", table.read_text().strip()]
    if dis.get("dropped_by_reason"):
        lines += ["", "Removed at each filter, by reason (every drop's full reason: distill/dropped.json):", "",
                  "| filter | removed | reasons |", "|---|---|---|"]
        for stage, kinds in dis["dropped_by_reason"].items():
            why = ", ".join(f"{k} {n}" for k, n in kinds.items() if n) or "–"
            lines.append(f"| {stage} | {sum(kinds.values())} | {why} |")
    return lines


def _plots(run: Path, sft, rl, ev) -> list[Path]:
    import matplotlib  # late: it costs ~0.5 s to import, and summarize() and publish_run() draw nothing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use(): the backend is set before pyplot loads

    made = []
    if sft and sft["losses"]:
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.plot(range(1, len(sft["losses"]) + 1), sft["losses"], marker="o")
        ax.set(xlabel="optimizer step", ylabel="masked SFT loss", title="SFT loss")
        made.append(_save(fig, run / "sft_loss.png"))
    if rl and rl["metrics"]:
        m = rl["metrics"]
        fig, ax = plt.subplots(figsize=(5, 3))
        # the shaped reward the advantages used; a run written before it was named logged it as "reward_mean"
        shaped = [x.get("reward_shaped_mean", x.get("reward_mean")) for x in m]
        ax.plot([x["step"] for x in m], shaped, marker="o", label="reward (shaped)")
        ax.plot([x["step"] for x in m], [x["accuracy"] for x in m], marker="s", label="accuracy")
        ax.set(xlabel="DAPO step", ylabel="mean over sampled rollouts", title="RL training curve")
        ax.legend()
        made.append(_save(fig, run / "rl_reward.png"))
    if ev:
        labels = [k for k in ("base", "sft", "rl") if k in ev]
        suites = list(dict.fromkeys(s for k in labels for s in ev[k]))
        fig, ax = plt.subplots(figsize=(5, 3))
        width = 0.8 / max(1, len(labels))
        for i, label in enumerate(labels):
            xs = [j + i * width for j in range(len(suites))]
            ax.bar(xs, [ev[label].get(s, {}).get("accuracy", 0) for s in suites], width, label=f"{label} acc")
            ax.scatter(xs, [ev[label].get(s, {}).get("format_valid", 0) for s in suites], marker="x", color="k")
        ax.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(len(suites))], suites, fontsize=7)
        ax.set(ylabel="accuracy (bars), format validity (x)", ylim=(0, 1.05), title="Evaluation")
        ax.legend(fontsize=7)
        made.append(_save(fig, run / "eval.png"))
    return made


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt  # late, as in _plots (which has loaded it already)

    plt.close(fig)
    return path
