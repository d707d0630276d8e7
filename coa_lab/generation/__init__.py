"""Everything that turns prompts into tokens: loading a model, the backends that sample from it
and the lab's own decoder underneath.

- backends.py: gen.backend "auto" (vLLM if installed with a GPU, else the lab's decoder) and the
  rollout batch from gen.kv_budget_gib.
- llm.py: `make_generator` / `rl_sampler`, the backend a preset asks for; the backends are
  hf_generator.py (any HF model, this process), vllm_engine.py (vLLM in this process),
  vllm_server.py (a separate `vllm serve`) and openai_backend.py (any OpenAI-compatible chat
  endpoint; http_client.py is their shared retrying client). All return result.Generation;
  chat_prompt.py turns messages into prompt ids.
- decoding.py: the batched decoder that keeps each row's KV cache across tool turns, with its
  own cache (kv_cache.py), prefixes kept across calls (prefix_cache.py) and CPU attention
  (cpu_attention.py).
- models.py: locating and loading model weights (the embedded model, HF models, LoRA);
  model_shape.py: a model's shape and parameter count from its config, without loading it.
- engine_share.py: an in-process vLLM engine's share of the GPU (gen.vllm_memory_fraction None),
  beside RL's trainer or alone on the card; the stages and the planner both size it here.

Serving a model over HTTP (`coa-lab serve`) is coa_lab/serve/.
"""
