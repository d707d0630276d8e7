"""The official `openai` client reading an OpenAI-compatible server: the same reader runs against
real `vllm serve` (test_vllm_cpu_serve.py) and the lab's `coa-lab serve` (test_vllm_server.py),
so "reads it like coa-lab serve" is one function checked on both."""

from __future__ import annotations

import pytest


def read_with_openai(base_url: str, api_key: str, model: str) -> dict:
    """The served model ids, and one greedy completion and one chat answer through the client."""
    openai = pytest.importorskip("openai", reason="the openai client comes with the [vllm-cpu] extra")
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=300)
    models = [m.id for m in client.models.list().data]
    done = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}],
                                          max_tokens=8, temperature=0)
    try:
        client.completions.create(model=model, prompt="x", max_tokens=1)  # a wrong key must be refused
        wrong = openai.OpenAI(base_url=base_url, api_key="sk-wrong", max_retries=0)
        wrong.models.list()
        refused = False
    except openai.AuthenticationError:
        refused = True
    return {"models": models, "text": done.choices[0].text, "finish_reason": done.choices[0].finish_reason,
            "chat": chat.choices[0].message.content, "wrong_key_refused": refused}
