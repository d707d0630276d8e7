"""Put this folder on PYTHONPATH with COA_LAB_TEST_CPU_ENGINE=1 and every rank a launcher starts
(LOCAL_RANK set) applies a config's FSDP / DeepSpeed on its CPU (tests/e2e/cpu_engines.py says why
that needs a lift), so the shipped `python -m coa_lab.cli sft` and `configs/slurm/multinode_32b.sbatch`
run them as they are (tests/e2e/test_multinode_sbatch.py). Anything else starts untouched."""

import os
import sys

if os.environ.get("COA_LAB_TEST_CPU_ENGINE") == "1" and "LOCAL_RANK" in os.environ:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import cpu_engines

    cpu_engines.lift_cpu_engine_gate()
