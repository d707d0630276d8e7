"""Collectives put their tensors on the device the process group's backend moves.

accelerate joins CUDA ranks over NCCL alone, and NCCL refuses a CPU tensor ("Tensors must be
CUDA and dense"); gloo (the CPU ranks of tests/e2e/test_distributed.py) takes CPU tensors, so
the two-rank CPU test cannot catch a collective that builds its tensor on the CPU. Here the
group is simulated on this CUDA-less machine: two ranks, the backend named by the test, and
fake collectives that enforce that backend's device rule. The rank's GPU is the "meta" device
(coa_lab.distributed._rank_gpu replaced): a tensor left on the CPU fails exactly as on NCCL.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from coa_lab import distributed

FAKE_GPU = torch.device("meta")  # not the CPU, and nothing here can create a CUDA tensor


class Delivered(Exception):
    """The collective got its tensor on the right device; a meta tensor holds no data to
    reduce, so the NCCL simulation stops there."""


def _group(monkeypatch, backend: str, all_reduce) -> None:
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "broadcast", all_reduce)  # same rule; the lab broadcasts no tensor today
    # raising=False: the seam is the fix's; without it the fakes still catch a CPU tensor
    monkeypatch.setattr(distributed, "_rank_gpu", lambda: FAKE_GPU, raising=False)


def _fake_nccl(seen: list):
    def collective(tensor, *args, **kwargs):
        seen.append(tensor.device)
        if tensor.device != FAKE_GPU:
            raise RuntimeError("Tensors must be CUDA and dense")  # NCCL's refusal of a CPU tensor
        raise Delivered
    return collective


def _params() -> list[torch.nn.Parameter]:
    ps = [torch.nn.Parameter(torch.ones(2, 3)), torch.nn.Parameter(torch.ones(4))]
    ps[0].grad = torch.full((2, 3), 0.5)  # ps[1] has no gradient: this rank had no micro-batch for it
    return ps


def test_collectives_hand_nccl_a_tensor_on_the_ranks_gpu(monkeypatch):
    seen: list = []
    _group(monkeypatch, "nccl", _fake_nccl(seen))
    with pytest.raises(Delivered):
        distributed.all_reduce_sum([1.0, 2.0])  # the RL update's logged statistics
    with pytest.raises(Delivered):
        distributed.all_reduce_gradients(_params())  # CPU gradients: still sent from the GPU
    assert seen == [FAKE_GPU, FAKE_GPU]
    assert distributed.collective_device() == FAKE_GPU


def test_collectives_on_gloo_stay_on_the_cpu_and_return_python_and_the_grads_device(monkeypatch):
    seen: list = []

    def gloo(tensor, *args, **kwargs):  # two ranks holding the same values: the sum doubles them
        seen.append(tensor.device)
        assert tensor.device == torch.device("cpu")
        tensor.mul_(2)

    _group(monkeypatch, "gloo", gloo)
    assert distributed.all_reduce_sum([1.5, 2.0]) == [3.0, 4.0]
    ps = _params()
    distributed.all_reduce_gradients(ps)
    assert torch.equal(ps[0].grad, torch.full((2, 3), 1.0)) and torch.equal(ps[1].grad, torch.zeros(4))
    assert all(p.grad.device == p.device for p in ps)
    assert seen == [torch.device("cpu")] * 2
    assert distributed.collective_device() == torch.device("cpu")


def test_tensor_collectives_live_only_in_distributed_py():
    # so the device rule above covers every one the package makes (object collectives pickle onto
    # the current CUDA device themselves, which init() pins per rank)
    pattern = re.compile(r"\b(dist|torch\.distributed)\.(all_reduce|broadcast|reduce|all_gather|"
                         r"all_gather_into_tensor|reduce_scatter\w*|all_to_all\w*|send|recv|isend|irecv)\(")
    package = Path(distributed.__file__).parent
    found = [f"{p.relative_to(package)}:{m.group(0)}" for p in sorted(package.rglob("*.py"))
             if p.name != "distributed.py" or p.parent != package for m in pattern.finditer(p.read_text())]
    assert found == []
