"""The one-GPU recipe as the planner sizes it: `coa-lab plan --preset gpu-3b-qlora
--gpu L4` as a result file, so the README's memory and time figures for that recipe are links
into what the planner computes (coa_lab/planning), not typed by hand. An estimate, not a
measurement: docs/gpu-validation.md and `coa-lab plan --calibration` hold how it compares with
the GPU runs. tests/repo/test_published_figures.py recomputes it, so a planner change that moves
these figures fails until this is run again.

Run:  python -m benchmarks.bench_plan
Writes runs/bench/plan_gpu_3b_l4.json (COA_LAB_PUBLISH=1: docs/results/plan_gpu_3b_l4.json). Seconds.
"""

from __future__ import annotations



from benchmarks.results import save  # noqa: E402

from coa_lab.config import get_preset  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402
from coa_lab.planning.plan_report import planner_report  # noqa: E402

PRESET, GPU, GPUS = "gpu-3b-qlora", "L4", 1


def plan() -> dict:
    return planner_report(get_preset(PRESET), GPUS, GPU)


def main() -> int:
    report = plan()
    print(f"{PRESET} on {GPUS} x {GPU}: training {report['memory_gib']['train_total_gib']:.1f} GiB, rollouts "
          f"{report['memory_gib']['rollout_total_gib']:.1f} GiB ({report['fits']}), {report['time']['total_hours']:.1f} h")
    save("plan_gpu_3b_l4", {**report, "machine": machine_peak(get_preset("cpu-tiny"))})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
