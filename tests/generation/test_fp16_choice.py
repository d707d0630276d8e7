"""Which dtype a GPU run uses: bf16 where the card has it, loss-scaled fp16 where it does not (T4).
Checked on the CPU by telling torch what card it is on."""

from __future__ import annotations

import pytest
import torch

from coa_lab.config import ModelConfig, get_preset
from coa_lab.generation import models


def _card(monkeypatch, cuda: bool, bf16: bool):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    seen = {}

    def supported(including_emulation: bool = True):
        seen["including_emulation"] = including_emulation
        return bf16

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", supported)
    return seen


@pytest.mark.parametrize("cuda,bf16,asked,used", [
    (True, True, "bfloat16", "bfloat16"),  # A100, L4, H100
    (True, False, "bfloat16", "float16"),  # T4, V100
    (False, False, "bfloat16", "bfloat16"),  # CPU: its own autocast rules (models.cpu_autocast_enabled)
    (True, False, "float32", "float32"),
    (True, False, "float16", "float16"),
])
def test_effective_dtype(monkeypatch, cuda, bf16, asked, used):
    seen = _card(monkeypatch, cuda, bf16)
    assert models.effective_dtype(ModelConfig(dtype=asked)) == used
    if cuda and asked == "bfloat16":
        # a T4 "supports" bf16 by emulation; that is not what the choice is about
        assert seen["including_emulation"] is False


def test_sft_trains_in_fp16_where_the_card_has_no_bf16(monkeypatch):
    from coa_lab.training.sft import precision

    preset = get_preset("gpu-smoke")
    _card(monkeypatch, cuda=True, bf16=False)
    assert precision(preset, cuda=True, cpu_bf16=False) == {"bf16": False, "fp16": True}
    _card(monkeypatch, cuda=True, bf16=True)
    assert precision(preset, cuda=True, cpu_bf16=False) == {"bf16": True, "fp16": False}
    _card(monkeypatch, cuda=False, bf16=False)
    assert precision(preset, cuda=False, cpu_bf16=True) == {"bf16": True, "fp16": False}


def test_the_rl_update_scales_its_loss_only_for_fp16_on_a_gpu(monkeypatch):
    model = torch.nn.Linear(2, 2)  # on the CPU: never a scaler, whatever the dtype
    assert not models.grad_scaler(model, ModelConfig(dtype="float16")).is_enabled()
    _card(monkeypatch, cuda=True, bf16=False)
    cfg = ModelConfig(dtype="bfloat16")
    assert models.effective_dtype(cfg) == "float16"
    # a model on the GPU is stood in for by its device: what grad_scaler reads
    fake = type("M", (), {"parameters": lambda self: iter([torch.nn.Parameter(torch.zeros(1, device="meta"))])})()
    assert not models.grad_scaler(fake, cfg).is_enabled()  # not a CUDA device: off
