"""FSDP2 and DeepSpeed ZeRO-3 on CPU ranks (gloo), for tests/e2e/test_multinode_*.py: a helper,
not a test module.

accelerate 1.15 applies a launcher config's sharded engine only on accelerator ranks, and on CPU
ranks it trains plain data parallel without a word (docs/scaling.md, "FSDP and DeepSpeed on CPU
ranks"). Where it decides: `AcceleratorState.__init__` promotes the ranks' distributed type to
FSDP only when that type is an accelerator kind (MULTI_GPU, MULTI_XPU, MULTI_NPU, ...), never
MULTI_CPU, and to DEEPSPEED only when `cpu` is False, which transformers'
`TrainingArguments(use_cpu=True)` makes True. The engines themselves run on CPU: torch's FSDP2
(`fully_shard`) on a CPU device mesh over gloo, DeepSpeed with its CPU accelerator (DS_ACCELERATOR
=cpu, picked on its own without CUDA), whose collectives fall back to gloo without oneCCL
(oneccl_bindings_for_pytorch, which is not installed here).

`lift_cpu_engine_gate()` makes the promotion accelerate makes on GPUs, for MULTI_CPU as well,
right after accelerate's own __init__ and with its own calls, and lifts the lab's refusal
(`coa_lab.distributed.require_engine_on_this_hardware`), which exists because of that gate.
"""

from __future__ import annotations

import os


def rank_env() -> dict:
    """The environment of a CPU rank the tests launch: no GPU may be picked up, no progress bars, one
    thread per rank (2 cores); the ranks meet on loopback."""
    return {**os.environ, "TQDM_DISABLE": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


def lift_cpu_engine_gate() -> None:
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    from coa_lab import distributed

    original = AcceleratorState.__init__
    if getattr(original, "_coa_lab_cpu_engine", False):
        return

    def __init__(self, *args, fsdp_plugin=None, deepspeed_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, deepspeed_plugin=deepspeed_plugin, **kwargs)
        if self.distributed_type != DistributedType.MULTI_CPU:
            return
        if fsdp_plugin is not None and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
            # what accelerate does for MULTI_GPU & co. (state.py, AcceleratorState.__init__)
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
        elif deepspeed_plugin is not None and os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
            # what accelerate does when cpu is False; DeepSpeed's own config decides precision (fp32 here)
            self.distributed_type = DistributedType.DEEPSPEED
            self._mixed_precision = "no"
            deepspeed_plugin.set_mixed_precision("no")
            deepspeed_plugin.select(_from_accelerator_state=True)
            self.deepspeed_plugins = deepspeed_plugin
        else:
            return
        PartialState._shared_state["distributed_type"] = self.distributed_type

    __init__._coa_lab_cpu_engine = True
    AcceleratorState.__init__ = __init__
    distributed.require_engine_on_this_hardware = lambda has_cuda: None
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    if deepspeed and os.environ.get("COA_LAB_DS_SHM") != "1":
        # DeepSpeed's CPU accelerator JIT-compiles a shared-memory all-reduce kernel the first time a
        # process group starts (measured: 75 CPU-seconds of g++ here; then cached under
        # ~/.cache/torch_extensions). Without it DeepSpeed's collectives are plain gloo, its own
        # fallback where the kernel cannot be built; COA_LAB_DS_SHM=1 keeps the kernel.
        import importlib

        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def holding(model) -> dict:
    """What this rank holds of `model`: the parameters' kinds, the model's parameter count, this
    rank's local elements (FSDP2: each DTensor's local shard; ZeRO-3: each parameter's `ds_tensor`
    partition, padded to a multiple of the world size, against its `ds_numel`) and how many
    elements sit on the meta device (not materialised on this rank)."""
    kinds, total, local, meta = set(), 0, 0, 0
    for p in model.parameters():
        if hasattr(p, "ds_numel"):  # ZeRO-3: p itself is an empty placeholder between gathers
            kinds.add("zero3")
            total += p.ds_numel
            local += p.ds_tensor.numel()
        elif type(p).__name__ == "DTensor":  # FSDP2
            kinds.add("DTensor")
            total += p.numel()
            local += p.to_local().numel()
        else:
            kinds.add(type(p).__name__)
            total += p.numel()
            local += p.numel()
        meta += p.numel() if p.device.type == "meta" else 0
    return {"kinds": sorted(kinds), "total": total, "local": local, "meta": meta}
