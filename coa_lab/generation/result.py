"""What every generation backend returns for one prompt: a `Generation`.

Rollouts work on token ids, not text: RL must train on exactly the tokens the policy
sampled, and re-tokenizing decoded text can produce different ids at block boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Generation:
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (hit a stop string), "eos", or "length"
    prompt_tokens: int = 0
    completion_tokens: int = -1  # remote backends report a count but no ids
    # per sampled token: its log-probability under the distribution it was drawn from (logits
    # / temperature, after top-p) and that distribution's entropy (nats). The lab's own decoder
    # fills them when it samples (temperature > 0); RL compares them with the trainer's log-probs
    # (the consistency check) and logs the entropy. None where a backend does not report them.
    logprobs: list[float] | None = None
    entropies: list[float] | None = None

    def __post_init__(self) -> None:
        if self.completion_tokens < 0:
            self.completion_tokens = len(self.token_ids)
