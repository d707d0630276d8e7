"""Only LoRA moves: one RL optimizer step (the DAPO loss, with the PPO-ptx SFT loss mixed in, under
the preset's compute context, AdamW over the trainable parameters as train_rl builds it) leaves
EVERY other tensor of the model bit-identical: each base projection, the embedding and the lm_head
tied to it, every norm, and the buffers (rotary inv_freq). tests/rl/test_rl_trainer.py compares only
the embedding.

Scope: the update. Sampling merges the adapter into the base weights and takes it out again
(generation/lora_merge.lora_merged); that the base comes back bit for bit is
tests/generation/test_lora_merge_exact.py's."""

import pytest
import torch

from coa_lab.student_rollout import Rollout
from coa_lab.config import get_preset
from coa_lab.generation.models import compute_context, load_model
from coa_lab.rl.update import policy_update
from coa_lab.training.sft import encode_example
from coa_lab.tasks.records import Task

pytestmark = pytest.mark.model

TASK = Task("lora1", "What is 2 + 3?", ["5"], "test", "math", {})


def _non_lora(model) -> dict[str, torch.Tensor]:
    """Every parameter and buffer whose name has no "lora_", under every name it has (a tied
    lm_head is listed beside the embedding; non-persistent buffers such as inv_freq included)."""
    out = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        if "lora_" not in name:
            out[name] = t.detach().clone()
    return out


def test_one_rl_update_moves_lora_and_nothing_else():
    preset = get_preset("cpu-smoke", rl={"mini_batches": 1, "sft_coef": 0.5})
    torch.manual_seed(0)
    model, tok = load_model(preset.model, trainable=True)
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    frozen = _non_lora(model)
    names = " ".join(frozen)
    # the snapshot covers what it claims to: projections, embedding, head, norms, rotary buffers
    for part in ("base_layer.weight", "embed_tokens.weight", "lm_head.weight", "input_layernorm.weight",
                 "post_attention_layernorm.weight", "model.norm.weight", "rotary_emb.inv_freq"):
        assert part in names, part
    assert frozen and lora

    encode = lambda text: tok(text, add_special_tokens=False).input_ids  # noqa: E731
    prompt = encode("Question: What is 2 + 3?\nAnswer:")
    code, obs = encode(" <code>print(2 + 3)</code>"), encode("<observation>\n5\n</observation>")
    answer = encode(" <answer>\\boxed{5}</answer>")
    wrong = encode(" <answer>\\boxed{6}</answer>")
    group = [Rollout(task=TASK, prompt_ids=prompt, response_ids=code + obs + answer,
                     response_mask=[1] * len(code) + [0] * len(obs) + [1] * len(answer), finish="answer"),
             Rollout(task=TASK, prompt_ids=prompt, response_ids=wrong, response_mask=[1] * len(wrong),
                     finish="answer")]
    trajectory = "<code>print(2 + 3)</code>\n<observation>\n5\n</observation>\n<answer>\\boxed{5}</answer>"
    sft_rows = [encode_example(tok, [{"role": "user", "content": TASK.question}], trajectory)]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0)  # large: any leak would show
    stats = policy_update(model, optimizer, [group], [[1.0, 0.0]], preset, tok.pad_token_id,
                          compute=lambda: compute_context(model, preset.model), sft_batches=[sft_rows])
    assert stats["sft_loss"] > 0 and stats["train_tokens"] == sum(r.policy_tokens for r in group)

    changed = [n for n, p in model.named_parameters() if "lora_" in n and not torch.equal(p, lora[n])]
    assert changed, "the update moved no LoRA weight"
    after = _non_lora(model)
    assert after.keys() == frozen.keys()
    moved = [n for n in frozen if after[n].dtype != frozen[n].dtype or not torch.equal(after[n], frozen[n])]
    assert not moved, f"non-LoRA tensors changed in an RL update: {moved[:10]}"
    head = model.get_output_embeddings().weight  # the head the loss runs through, tied or not
    assert torch.equal(head, frozen["base_model.model.lm_head.weight"])
