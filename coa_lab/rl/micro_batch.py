"""The RL update's micro-batch, alone in a torch-free module so that `coa-lab plan` can price RL's
update as it runs (planning/preset_check.rl_update_preset) without importing torch."""

MICRO_BATCH = 4  # rollouts per forward: bounds the logits of a step ([rollouts x response, V])
