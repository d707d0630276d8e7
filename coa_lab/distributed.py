"""Many processes, one run: what SFT and RL need to work unchanged under `accelerate launch`.

    accelerate launch --config_file configs/ddp.yaml -m coa_lab.cli rl --run runs/x   # N ranks
    python -m coa_lab.cli rl --run runs/x                                             # 1 rank

Outside a launcher every function here is a no-op on one rank, so the single-process path
is the same code. Under a launcher (WORLD_SIZE > 1) `init()` joins the process group that
accelerate sets up: NCCL on GPUs, gloo on CPU (how tests/e2e/test_distributed.py runs two ranks
on a laptop).

SFT needs nothing more: transformers' Trainer shards the data and reduces the gradient
(DDP), or hands the model to FSDP / DeepSpeed, from the launcher's config. RL's loop is the
lab's own, and its data parallelism is three collective calls, in plain sight in
rl/trainer.py and rl/update.py:

1. the step's prompts are drawn identically on every rank (same seed, same task stream);
   each rank rolls out its share of the rows and `gather_rows` hands everyone the whole
   batch, so dynamic sampling, advantages and logging see exactly what one process would;
2. each rank back-propagates its share of every mini-batch's micro-batches, and
   `all_reduce_gradients` sums the trainable gradients: the same gradient one process
   would have summed over all micro-batches (the loss is already normalised by the whole
   mini-batch's token count);
3. every rank then takes the same optimizer step from the same gradient, so the replicas
   stay identical (the test checks it bit for bit after every step).

That is data parallelism over a replicated policy, right for LoRA (a few MB of gradients
per step). Sharded engines (FSDP, DeepSpeed ZeRO-3) own the parameters and their gradients;
RL refuses them with a clear error rather than silently training a shard (docs/scaling.md).
"""

from __future__ import annotations

import os
import socket
import sys

from coa_lab.paths import CONFIGS_DIR

# torch and accelerate are imported inside the functions: `coa-lab --help` imports this module (cli.py)


def launch_argv(config: str, processes: int, stage_args: list[str], port: int | None = None) -> list[str]:
    """The command line that runs `coa-lab STAGE_ARGS...` on `processes` ranks of this machine
    with configs/CONFIG.yaml (what notebook 06 and tests/e2e/test_distributed.py start):

        accelerate launch --config_file configs/ddp.yaml --num_processes 2 -m coa_lab.cli sft --run R

    port: the rendezvous port (default: a free one, so two launches can run side by side)."""
    if port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    path = CONFIGS_DIR / f"{config}.yaml" if "/" not in config and not config.endswith(".yaml") else config
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(path),
            "--num_processes", str(processes), "--main_process_port", str(port), "-m", "coa_lab.cli", *stage_args]


def world_size() -> int:
    """Processes in this run (1 outside a launcher)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    """Rank 0 writes the run folder's shared files (summaries, metrics, checkpoints)."""
    return rank() == 0


def launcher_engine() -> str:
    """The engine named by the launcher's config: "fsdp", "deepspeed" or "ddp" (plain data
    parallel, also the single-process case). accelerate exports it to every rank."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true"):
        return "fsdp"
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("1", "true"):
        return "deepspeed"
    return "ddp"


def init() -> None:
    """Join the launcher's process group (once; no-op on one process). Each rank is pinned to
    its own GPU before any model is loaded, so `.to("cuda")` and 4-bit device maps land there;
    without CUDA the group runs over gloo on the CPU."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    import torch

    require_engine_on_this_hardware(torch.cuda.is_available())
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    from accelerate import PartialState

    PartialState(cpu=not torch.cuda.is_available())  # initialises torch.distributed (a singleton)


def require_engine_on_this_hardware(has_cuda: bool) -> None:
    """accelerate applies FSDP and DeepSpeed only on accelerators: launched on CPU ranks with
    configs/fsdp.yaml it silently trains plain data parallel (measured: the same losses and
    replicated parameters as configs/ddp.yaml). Say so instead of letting a course believe it
    watched sharding. (A missing DeepSpeed package the launcher itself reports.)"""
    engine = launcher_engine()
    if engine != "ddp" and not has_cuda:
        raise RuntimeError(f"the launcher's config asks for {engine}, which accelerate applies only on GPUs; "
                           "these ranks have none, so nothing would be sharded. On CPU launch with "
                           "configs/ddp.yaml (docs/scaling.md)")


def gather_rows(local: list) -> list:
    """Every rank's list, concatenated in rank order, on every rank (picklable objects: the
    rollouts' token ids, masks and texts; their tasks)."""
    if world_size() <= 1:
        return list(local)
    import torch.distributed as dist

    parts: list = [None] * dist.get_world_size()
    # builds no tensor of ours: under NCCL it pickles onto the current CUDA device, which init() pins
    dist.all_gather_object(parts, local)
    return [row for part in parts for row in part]


def shard(n: int) -> range:
    """The contiguous slice of `n` rows this rank works on (the first ranks take one more)."""
    size, r = world_size(), rank()
    per, extra = divmod(n, size)
    start = r * per + min(r, extra)
    return range(start, start + per + (r < extra))


def collective_device():
    """Where a tensor handed to a collective must live: the backend moves only its own kind.
    accelerate joins CUDA ranks over NCCL alone, which refuses CPU tensors ("Tensors must be
    CUDA and dense"); gloo (CPU ranks) takes CPU tensors. Every collective here that builds
    its own tensor builds it here (tests/core/test_distributed_device.py)."""
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return _rank_gpu()
    return torch.device("cpu")


def _rank_gpu():
    """This rank's GPU: init() pinned it with torch.cuda.set_device (accelerate's PartialState
    does too). A function of its own so that the CPU-only tests can stand in for CUDA."""
    import torch

    return torch.device("cuda", torch.cuda.current_device())


def all_reduce_gradients(params) -> None:
    """Sum the gradients of `params` over ranks (a rank with no micro-batch contributes zeros)."""
    if world_size() <= 1:
        return
    import torch
    import torch.distributed as dist

    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    # one collective instead of one per tensor; .to() copies nothing when the grads are already
    # on the backend's device (a CUDA model under NCCL, a CPU one under gloo)
    flat = torch.cat([g.reshape(-1) for g in grads]).to(collective_device())
    dist.all_reduce(flat)
    at = 0
    for p, g in zip(params, grads):
        p.grad = flat[at : at + g.numel()].view_as(g).to(g.device, copy=True)  # back beside its parameter
        at += g.numel()


def all_reduce_sum(values: list[float]) -> list[float]:
    """Element-wise sums of small per-rank statistics (losses, counts) for logging."""
    if world_size() <= 1:
        return list(values)
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=collective_device())  # NCCL reduces float64 too
    dist.all_reduce(t)
    return t.tolist()  # back to Python floats (from the GPU under NCCL)


def barrier() -> None:
    if world_size() > 1:
        import torch.distributed as dist

        dist.barrier()


def require_replicated_policy(stage: str) -> None:
    """RL's data parallelism keeps a full replica per rank; a sharded engine would hand it a
    shard. Refuse clearly instead of training something else than the user asked for."""
    engine = launcher_engine()
    if world_size() > 1 and engine != "ddp":
        raise RuntimeError(f"{stage} runs data-parallel over full policy replicas (DDP); the launcher's config "
                           f"asks for {engine}, which shards the parameters. Launch it with "
                           "configs/ddp.yaml (SFT runs under every config in configs/; docs/scaling.md)")
