"""Rollouts from int8 weights, corrected by truncated importance sampling (`rl.rollout_int8`).

Sampling is most of an RL step on a CPU, and a decode step is bound by reading weights: int8
dynamic quantization (fbgemm: int8 weights, activations quantized per batch) reads a quarter of
the bytes. RL frameworks sample from such cheaper copies (vLLM in fp8, quantized rollout
engines) and train the full-precision policy. The samples then come from a slightly different
policy π_rollout than the one trained, π_train, and the update corrects for it token by token
(truncated importance sampling, "TIS"):

    weight_t = min(π_train(y_t | ·) / π_rollout(y_t | ·), C)        C = rl.tis_cap (2)

multiplied into each token's DAPO loss (rl/dapo.dapo_token_loss, `token_weights`), no gradient
through it. The per-step probability gap |π_train − π_rollout| (already logged for exact
rollouts) and the fraction of tokens whose weight hit the cap (`tis_capped_frac`) say how far
apart the two policies are. Evaluation always uses the trained, unquantized weights.

CPU only (torch's dynamic quantization); the copy is rebuilt after every update.
"""

from __future__ import annotations

import copy
import warnings

import torch

from coa_lab.generation.hf_generator import HFGenerator


ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def int8_copy(model, which: bool | str = True):
    """An inference-only copy of `model` (LoRA merged in) with its Linears in int8: every one
    (`which` True or "all"), or only the attention projections ("attention"). Why the second:
    with every Linear in int8 the 135M policy's next-token distribution moved by a total variation
    of 0.58 and every sampled group came back all-wrong (no gradient); the attention projections
    alone moved it by 0.12 (docs/design.md), a sampler close enough for its groups to carry signal."""
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("rl.rollout_int8 is a CPU path (torch dynamic int8 quantization); on a GPU sample with "
                         "vLLM (gen.backend='vllm') or leave it off")
    twin = copy.deepcopy(model)
    if hasattr(twin, "merge_and_unload"):  # PEFT: fold the adapter in, so each layer is one int8 matmul
        twin = twin.merge_and_unload()
    # fbgemm's int8 matmuls take fp32 activations: a 16-bit policy (a GPU preset's dtype on a CPU)
    # gets an fp32 twin, whose embeddings and norms then run in fp32 too
    twin = twin.float().eval()
    for p in twin.parameters():
        p.requires_grad_(False)
    with warnings.catch_warnings():  # torch.ao.quantization is deprecated for torchao, still the CPU kernel here
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic  # late: importing it warns of the deprecation

        if which in (True, "all"):
            return quantize_dynamic(twin, {torch.nn.Linear}, dtype=torch.qint8)
        if which != "attention":
            raise ValueError(f"rl.rollout_int8 must be true, 'all' or 'attention', got {which!r}")
        names = {n for n, m in twin.named_modules() if isinstance(m, torch.nn.Linear) and n.endswith(ATTENTION)}
        if not names:
            raise ValueError(f"rl.rollout_int8='attention': the model has no Linear named {', '.join(ATTENTION)}")
        return quantize_dynamic(twin, names, dtype=torch.qint8)


class Int8Rollouts(HFGenerator):
    """The lab's decoder on an int8 copy of the policy. `refresh()` after each update marks the
    copy stale; the next rollout rebuilds it from the current weights (about a second for 135M)."""

    def __init__(self, policy, tokenizer, batch_size: int = 16, which: bool | str = True):
        # fp32 activations: the quantized matmuls take no autocast
        super().__init__(None, tokenizer, batch_size, compute=None)
        self.policy, self.which = policy, which

    def refresh(self) -> None:
        self.model = None

    def multi_turn(self, prompts, on_turn_end, **kwargs) -> None:
        if self.model is None:
            self.model = int8_copy(self.policy, self.which)
        super().multi_turn(prompts, on_turn_end, **kwargs)
