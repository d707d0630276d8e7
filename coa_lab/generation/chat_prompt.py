"""Chat messages as the token ids a backend is prompted with, and `.chat` on top of a
token-id backend's `.generate` (the teacher's agents and the judge talk in messages)."""

from __future__ import annotations

from coa_lab.generation.result import Generation


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a chat prompt ending where the assistant's turn starts."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_by_generate(generator, conversations: list[list[dict]], max_new_tokens: int,
                     temperature: float = 0.0) -> list[Generation]:
    """`.chat` for a token-id backend: the chat template, one turn, the reply's text without EOS."""
    prompts = [chat_prompt_ids(generator.tokenizer, msgs) for msgs in conversations]
    gens = generator.generate(prompts, max_new_tokens, temperature)
    eos = generator.tokenizer.eos_token or ""
    for g in gens:
        g.text = g.text.removesuffix(eos).strip()
    return gens
