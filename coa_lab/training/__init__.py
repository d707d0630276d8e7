"""Training math shared by SFT and RL: the masked SFT stage (sft.py), the chunked LM head
(lm_head.py), per-token log-probs (logprobs.py) and sequence packing (packing.py)."""
