"""The SFT policy kept beside the RL policy, for the optional KL term (`rl.kl_coef`).

RL trains the SFT LoRA adapter further, so the reference is just the adapter's starting
weights: a copy of the trainable tensors (a few MB for a LoRA), swapped into the model for one
no-grad pass per update. No second model is loaded. The copy goes into the RL checkpoint, so a
resumed run keeps measuring the KL to the same SFT policy.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class ReferenceWeights:
    """The trainable parameters' values at the start of RL (the SFT adapter)."""

    def __init__(self, model, saved: dict | None = None):
        self.params = {name: p for name, p in model.named_parameters() if p.requires_grad}
        if not self.params:
            raise ValueError("rl.kl_coef needs a trainable adapter: the model has no trainable parameters")
        if saved is None:
            self.weights = {name: p.detach().clone() for name, p in self.params.items()}
        else:
            missing = sorted(set(self.params) - set(saved))
            if missing:
                raise ValueError(f"the checkpoint's reference weights lack {len(missing)} parameter(s) "
                                 f"(first: {missing[0]}); resume with the settings the run started with")
            self.weights = {name: saved[name].to(p.device, p.dtype) for name, p in self.params.items()}

    def state(self) -> dict:
        """What the RL checkpoint stores: the reference tensors, on the CPU."""
        return {name: w.detach().cpu() for name, w in self.weights.items()}

    @contextmanager
    def active(self):
        """Inside: the model computes with the reference weights; after: its own again."""
        current = {name: p.detach().clone() for name, p in self.params.items()}
        try:
            with torch.no_grad():
                for name, p in self.params.items():
                    p.copy_(self.weights[name])
            yield
        finally:
            with torch.no_grad():
                for name, p in self.params.items():
                    p.copy_(current[name])
