"""One DAPO update on a hand-built group moves the policy the way the advantages say: every
positive-advantage response becomes more likely and every negative-advantage one less likely
(summed log-prob over its policy tokens), and observation tokens (mask 0) never enter the loss.

No sampling: one prompt, four short responses written by hand (one with a tool observation
between two policy turns), rewards [1, 0, 1, 0]. The sampler log-probs are set to the trainer's,
so the importance ratio is exactly 1 and the step is the plain policy gradient. Real embedded
model, fp32, a fresh LoRA, AdamW over the trainable parameters as train_rl builds it.
"""

import pytest
import torch

from coa_lab.student_rollout import Rollout
from coa_lab.config import get_preset
from coa_lab.generation.models import load_model
from coa_lab.training import logprobs
from coa_lab.rl.update import policy_update
from coa_lab.tasks.records import Task

pytestmark = pytest.mark.model

TASK = Task("dir1", "What is 2 + 3?", ["5"], "test", "math", {})
PROMPT = "Question: What is 2 + 3?\nAnswer:"
# (text, mask) pieces of each response, and its reward; mask 0 = observation (tool output)
RESPONSES = [
    ([(" <think>2 + 3 = 5</think><answer>\\boxed{5}</answer>", 1)], 1.0),
    ([(" <answer>\\boxed{6}</answer>", 1)], 0.0),
    ([(" <code>print(2 + 3)</code>", 1), ("<observation>\n5\n</observation>", 0),
      (" <answer>\\boxed{5}</answer>", 1)], 1.0),
    ([(" <think>a guess</think><answer>\\boxed{7}</answer>", 1)], 0.0),
]
LR = 3e-5  # one AdamW step moves every LoRA weight by ~LR: 0.3-1.2 nats per response here, still ~linear in LR


def _preset(lr: float = LR):
    # fp32 (no bf16 autocast): the before/after log-probs must differ by the update only;
    # mini_batches=1: one optimizer step, its ratio exactly 1
    return get_preset("cpu-smoke", model={"cpu_autocast_bf16": False},
                      rl={"mini_batches": 1, "temperature": 1.0, "learning_rate": lr})


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    model, tok = load_model(_preset().model, trainable=True)
    with torch.no_grad():  # an adapter that already changes the outputs (B != 0): A and B both get gradient
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return model, tok, start


@pytest.fixture
def fresh(policy):
    """The module's model with its LoRA back at the starting point (each test updates it)."""
    model, tok, start = policy
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in start:
                p.copy_(start[n])
                p.grad = None
    model.eval()
    return model, tok


def _encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False).input_ids


def _rollouts(tok, responses=RESPONSES) -> list[Rollout]:
    prompt = _encode(tok, PROMPT)
    out = []
    for pieces, _ in responses:
        ids, mask = [], []
        for text, m in pieces:
            piece = _encode(tok, text)
            ids += piece
            mask += [m] * len(piece)
        out.append(Rollout(task=TASK, prompt_ids=list(prompt), response_ids=ids, response_mask=mask, finish="answer"))
    return out


def _response_logprobs(model, rollouts, temperature: float) -> list[torch.Tensor]:
    """Per response token, log p(token | prompt, response so far): one right-padded forward
    (logprobs.token_logprobs, not the packed path the update takes), in eval mode, no gradient."""
    model.eval()
    seqs = [r.prompt_ids + r.response_ids for r in rollouts]
    width = max(len(s) for s in seqs)
    ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    attention = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    with torch.no_grad():
        lp = logprobs.token_logprobs(model, ids, attention, len(rollouts[0].prompt_ids), temperature=temperature)
    return [lp[k, len(r.prompt_ids):len(s)].float() for k, (r, s) in enumerate(zip(rollouts, seqs))]


def _policy_sum(lp: torch.Tensor, r: Rollout) -> float:
    return float((lp * torch.tensor(r.response_mask, dtype=lp.dtype)).sum())


def test_one_update_raises_positive_and_lowers_negative_advantage_responses(fresh):
    model, tok = fresh
    preset = _preset()
    rollouts = _rollouts(tok)
    rewards = [[reward for _, reward in RESPONSES]]
    mean = sum(rewards[0]) / len(rewards[0])
    # the advantage's sign, from the rewards themselves (not from the code under test): GRPO's
    # (r - mean) / std is positive exactly where the reward beats the group's mean
    signs = [1 if r > mean else -1 for r in rewards[0]]
    assert 1 in signs and -1 in signs and mean not in rewards[0]
    before = _response_logprobs(model, rollouts, preset.rl.temperature)
    for r, lp in zip(rollouts, before):  # the sampler drew exactly what the trainer scores: ratio 1
        r.response_logprobs = [float(x) if m else 0.0 for x, m in zip(lp, r.response_mask)]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=preset.rl.learning_rate, weight_decay=0.0)
    stats = policy_update(model, optimizer, [rollouts], rewards, preset, tok.pad_token_id)

    assert stats["logprob_gap"] < 1e-4, stats  # the premise: trainer == sampler before the step
    assert abs(stats["ratio_mean"] - 1.0) < 1e-6 and stats["clip_frac"] == 0.0, stats
    assert stats["train_tokens"] == sum(sum(r.response_mask) for r in rollouts)
    assert stats["masked_observation_tokens"] == sum(r.response_mask.count(0) for r in rollouts) > 0

    after = _response_logprobs(model, rollouts, preset.rl.temperature)
    deltas = [_policy_sum(a, r) - _policy_sum(b, r) for a, b, r in zip(after, before, rollouts)]
    for k, (sign, d) in enumerate(zip(signs, deltas)):
        # a clear move, not float noise: the summed log-prob of a few tokens shifts by > 0.05 nats
        if sign > 0:
            assert d > 0.05, f"response {k} (advantage > 0) lost log-prob {d:+.4f}; all deltas {deltas}"
        else:
            assert d < -0.05, f"response {k} (advantage < 0) gained log-prob {d:+.4f}; all deltas {deltas}"


def _gradients(model, tok, obs_text: str, obs_mask: int) -> dict[str, torch.Tensor]:
    """The clipped gradient of one policy update (lr 0: no weight moves) on a group of two: a
    response that ENDS in an observation of text `obs_text` with mask `obs_mask` (max_turns: it
    stopped on a tool result), reward 1, and a wrong answer, reward 0."""
    responses = [([(" <code>print(2 + 3)</code>", 1), (obs_text, obs_mask)], 1.0), RESPONSES[1]]
    rollouts = _rollouts(tok, responses)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW(list(params.values()), lr=0.0, weight_decay=0.0)
    policy_update(model, optimizer, [rollouts], [[reward for _, reward in responses]], _preset(), tok.pad_token_id)
    return {n: p.grad.detach().clone() for n, p in params.items()}


def test_observation_tokens_do_not_enter_the_loss(fresh):
    # The observation is the LAST span of its response, so no token in the loss sees it (causal
    # attention). If mask-0 tokens were left out of the loss, what they say cannot change the
    # gradient; if they were in it, their own log-probs would, and the gradient would differ.
    model, tok = fresh
    a, b = "<observation>\n5\n</observation>", "<observation>\n9\n</observation>"
    assert len(_encode(tok, a)) == len(_encode(tok, b)) and _encode(tok, a) != _encode(tok, b)
    masked_a, masked_b = _gradients(model, tok, a, 0), _gradients(model, tok, b, 0)
    scale = max(float(g.abs().max()) for g in masked_a.values())
    assert scale > 0
    # identical up to float noise (bit-identical on CPU today: the columns that differ add exact zeros)
    assert _max_diff(masked_a, masked_b) <= 1e-6 * scale
    # the check has teeth: the same two groups with the observation in the loss differ clearly
    in_loss_a, in_loss_b = _gradients(model, tok, a, 1), _gradients(model, tok, b, 1)
    assert _max_diff(in_loss_a, in_loss_b) > 1e-2 * scale


def _max_diff(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor]) -> float:
    assert x.keys() == y.keys()
    return max(float((x[n] - y[n]).abs().max()) for n in x)


def test_a_loss_scaled_update_moves_the_weights_as_the_plain_one(fresh):
    """fp16's loss scaler (models.grad_scaler; enabled here on the CPU so the path runs) scales the
    loss by a power of two and unscales the gradients before clipping: the same step as without it."""
    model, tok = fresh
    preset = _preset()
    rollouts = _rollouts(tok)
    rewards = [[reward for _, reward in RESPONSES]]
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    start = {n: p.detach().clone() for n, p in params.items()}
    moved = []
    for scaler in (None, torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)):
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(start[n])
        optimizer = torch.optim.AdamW(list(params.values()), lr=preset.rl.learning_rate, weight_decay=0.0)
        policy_update(model, optimizer, [rollouts], rewards, preset, tok.pad_token_id, scaler=scaler)
        moved.append({n: p.detach().clone() - start[n] for n, p in params.items()})
    plain, scaled = moved
    assert max(float(d.abs().max()) for d in plain.values()) > 1e-6  # the step did move the weights
    # AdamW moves each weight by ~LR; the two paths' float rounding differs by < 1% of that
    for n in plain:
        torch.testing.assert_close(scaled[n], plain[n], rtol=1e-4, atol=LR * 1e-2)
