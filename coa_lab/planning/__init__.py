"""Planning a run before it starts: per-GPU memory (memory_plan.py), time per step
(step_time.py), and both as the report `coa-lab plan` prints beside measured runs
(plan_report.py)."""
