"""Sampling merges LoRA into the base weights on CPU and takes it out again: the base weights
must come back bit for bit, or RL's many sampling rounds drift the "frozen" base by rounding."""

import pytest


@pytest.mark.model
def test_merge_and_unmerge_leave_every_base_weight_bit_identical():
    import torch

    from coa_lab.config import get_preset
    from coa_lab.generation.lora_merge import lora_merged as _lora_merged
    from coa_lab.generation.models import load_model

    model, _ = load_model(get_preset("cpu-smoke").model, trainable=True)
    torch.manual_seed(0)
    with torch.no_grad():  # a trained adapter: B != 0, so the merge really changes the weights
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    before = {n: t.detach().clone() for n, t in model.state_dict().items() if "lora_" not in n}
    probe = next(m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer"))
    with _lora_merged(model):
        merged = probe.base_layer.weight.detach().clone()
    after = model.state_dict()
    changed = [n for n, t in before.items() if not torch.equal(t, after[n])]
    assert not changed, changed[:5]
    assert not torch.equal(merged, probe.base_layer.weight)  # the merge did change them in between
