"""What an RL checkpoint holds and how it is written and found: the adapter, the optimizer,
the next step, every RNG, and how far each task stream got (the resumable streams are here
too), so a resumed run samples exactly what the uninterrupted one would have."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import torch

from coa_lab import distributed
from coa_lab.trajectories import load_records


class CountedStream:
    """An endless task iterator that counts what it handed out: a checkpoint stores the count,
    and a resumed run replays the stream up to it (the anchor stream has its own seeded RNG)."""

    def __init__(self, it):
        self.it, self.n = it, 0

    def __iter__(self):
        return self

    def __next__(self):
        self.n += 1
        return next(self.it)

    def skip(self, n: int) -> None:
        for _ in range(n):
            next(self)


class TaskCycle:
    """Every pool task once per pass, each pass reshuffled with the global `random` (seeded by
    train_rl), or with `rng` when given: a stream with its own RNG draws the same items whatever
    else consumes randomness in between (the SFT mix: the SFT-only control, which samples no
    rollouts, sees exactly the rows the recipe does). Its order, position (and own RNG) go into
    a checkpoint, so a resumed run draws on exactly."""

    def __init__(self, items: list, rng: random.Random | None = None):
        self.items, self.pos, self.rng = list(items), len(items), rng  # the first draw shuffles
        self.pending: list = []  # handed back by `unread`: drawn next, before the pass goes on

    def __iter__(self):
        return self

    def unread(self, tasks: list) -> None:
        """Take back the last `tasks` drawn (in the order drawn): the next draws return them first, so
        questions drawn early and not used (rl/rollouts.py's spares) leave the stream as it was."""
        self.pending = list(tasks) + self.pending

    def __next__(self):
        if self.pending:
            return self.pending.pop(0)
        if self.pos >= len(self.items):
            (self.rng or random).shuffle(self.items)
            self.pos = 0
        self.pos += 1
        return self.items[self.pos - 1]

    def state(self) -> dict:
        out = {"order": [t.id for t in self.items], "pos": self.pos, "pending": [t.id for t in self.pending]}
        if self.rng is not None:
            out["rng"] = self.rng.getstate()
        return out

    def restore(self, state: dict) -> None:
        by_id = {t.id: t for t in self.items}
        if set(by_id) != set(state["order"]):
            raise ValueError("the checkpoint was trained on another pool: resume with the same tasks")
        self.items, self.pos = [by_id[i] for i in state["order"]], state["pos"]
        self.pending = [by_id[i] for i in state.get("pending", [])]  # absent in checkpoints from before spares
        if self.rng is not None and state.get("rng") is not None:
            self.rng.setstate(state["rng"])


CHECKPOINT = "checkpoint"


def save_checkpoint(out_dir: Path, model, optimizer, step: int, pool_iter: TaskCycle, anchor_iter, n_sampled: int,
                     reference=None, sft_iter: TaskCycle | None = None, scheduler=None, start=None) -> None:
    """out_dir/checkpoint: the adapter, the optimizer and its learning-rate schedule, the next step,
    every RNG, how far each task stream got, and the run's starting weights (`start`, rl/optim.py's
    StartWeights, for delta_norm; left out when the KL reference holds the same tensors). Written
    beside the old one and swapped in, so a kill mid-save leaves one."""

    # every rank samples with its own torch generator: all of them go into the one checkpoint
    torch_rngs = distributed.gather_rows([torch.get_rng_state()])
    cuda_rngs = distributed.gather_rows([torch.cuda.get_rng_state() if torch.cuda.is_available() else None])
    if not distributed.is_main():  # the replicas are identical: rank 0 writes for all
        return
    tmp, final, old = out_dir / f"{CHECKPOINT}.tmp", out_dir / CHECKPOINT, out_dir / f"{CHECKPOINT}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp / "adapter")
    torch.save({"next_step": step + 1, "optimizer": optimizer.state_dict(), "python_random": random.getstate(),
                "torch_rng": torch_rngs[0], "torch_rng_by_rank": torch_rngs, "cuda_rng_by_rank": cuda_rngs,
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "pool": pool_iter.state(), "anchors_drawn": anchor_iter.n if anchor_iter is not None else 0,
                "sampled_records": n_sampled,
                "reference": reference.state() if reference is not None else None,
                "sft_mix": sft_iter.state() if sft_iter is not None else None,
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "start": start.state() if start is not None and reference is None else None}, tmp / "state.pt")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def latest_rl_checkpoint(out_dir: str | Path) -> Path | None:
    """The RL checkpoint of a run folder (or the previous one, if a kill hit the swap)."""
    for name in (CHECKPOINT, f"{CHECKPOINT}.old"):
        path = Path(out_dir) / name
        if (path / "state.pt").exists() and (path / "adapter" / "adapter_config.json").exists():
            return path
    return None


def restore_run(state: dict, out_dir: Path, optimizer, pool_iter: TaskCycle, anchor_iter, sft_iter):
    """Put a resumed RL run back where its checkpoint (`state`, from state.pt) left off: the
    optimizer, the task, anchor and SFT-mix streams, every RNG (this rank's), and the metrics and
    sampled rollouts written before it. Returns (metrics, sampled records, the next step)."""
    optimizer.load_state_dict(state["optimizer"])
    pool_iter.restore(state["pool"])
    if sft_iter is not None:
        if state.get("sft_mix") is None:
            raise ValueError("rl.sft_coef > 0, but the checkpoint was written without the SFT mix; "
                             "resume with the settings the run started with (rl.sft_coef=0)")
        sft_iter.restore(state["sft_mix"])
    if anchor_iter is not None:
        anchor_iter.skip(state["anchors_drawn"])
    random.setstate(state["python_random"])
    me = distributed.rank()
    by_rank = state.get("torch_rng_by_rank") or [state["torch_rng"]]
    if len(by_rank) != distributed.world_size():
        raise ValueError(f"the checkpoint was written by {len(by_rank)} rank(s); resume it with the same number "
                         f"of processes (this run has {distributed.world_size()})")
    torch.set_rng_state(by_rank[me])
    if torch.cuda.is_available() and (state.get("cuda_rng_by_rank") or [None])[me] is not None:
        torch.cuda.set_rng_state(state["cuda_rng_by_rank"][me])
    elif state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    first_step = state["next_step"]
    metrics = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()][:first_step]
    sampled = load_records(out_dir / "rollouts.jsonl")[: state["sampled_records"]]
    return metrics, sampled, first_step
