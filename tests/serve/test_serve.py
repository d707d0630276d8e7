"""`coa-lab serve`: the OpenAI-compatible API (schema, errors, batching) on a fake generator,
then the real command with the embedded model as a teacher for a capture over HTTP."""

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient

from coa_lab.generation.models import load_tokenizer
from coa_lab.generation.result import Generation
from coa_lab.serve.app import create_app, resolve_served
from coa_lab.serve.batching import BatchingEngine, Job
from coa_lab.serve.stub_teacher import free_port


class FakeGenerator:
    """Echoes the last prompt tokens back; records each batched call."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.calls = []

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()):
        self.calls.append((len(prompts), max_new_tokens, temperature, stop))
        ids = self.tokenizer("Paris. Then 3 more words", add_special_tokens=False)["input_ids"]
        ids = ids[:max_new_tokens]
        finish = "length" if len(ids) == max_new_tokens else "eos"
        return [Generation(list(ids), self.tokenizer.decode(ids), finish, len(p)) for p in prompts]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("embedded")


@pytest.fixture()
def client(tok):
    gen = FakeGenerator(tok)
    app = create_app(BatchingEngine(gen, max_batch=8), "lab-model", context_length=256)
    with TestClient(app) as c:
        c.gen = gen
        yield c


def ask(client, **kw):
    body = {"model": "lab-model", "messages": [{"role": "user", "content": "Capital of France?"}], **kw}
    return client.post("/v1/chat/completions", json=body)


def test_models_lists_the_served_id(client):
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["lab-model"]


def test_chat_completion_has_the_openai_shape(client):
    body = ask(client, max_tokens=20, temperature=0).json()
    assert body["object"] == "chat.completion" and body["model"] == "lab-model"
    [choice] = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Paris. Then 3 more words"}
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["prompt_tokens"] > 5 and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_stop_strings_are_cut_and_length_is_reported(client):
    cut = ask(client, max_tokens=20, stop=["3"]).json()["choices"][0]
    assert cut["message"]["content"] == "Paris. Then " and cut["finish_reason"] == "stop"
    short = ask(client, max_tokens=2).json()["choices"][0]
    assert short["finish_reason"] == "length"


def test_n_samples_are_decoded_in_one_batch(client):
    body = ask(client, n=3, max_tokens=5, temperature=0.7).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert client.gen.calls[-1] == (3, 5, 0.7, ())


def test_errors_are_openai_shaped(client):
    wrong = ask(client, model="gpt-4")
    assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found"
    bad = client.post("/v1/chat/completions", json={"model": "lab-model", "messages": []})
    assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]
    assert ask(client, temperature=5).status_code == 400
    long = ask(client, max_tokens=10_000)
    assert long.status_code == 400 and long.json()["error"]["code"] == "context_length_exceeded"


def test_stream_returns_server_sent_events(client):
    r = ask(client, max_tokens=20, stream=True)
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["content"].startswith("Paris")
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_api_key_is_required_when_configured(tok, monkeypatch):
    monkeypatch.setenv("SERVE_KEY", "k-1")
    app = create_app(BatchingEngine(FakeGenerator(tok)), "lab-model", 256, api_key_env="SERVE_KEY")
    with TestClient(app) as c:
        assert c.get("/v1/models").status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer k-1"}).status_code == 200
        assert c.get("/health").status_code == 200


def test_engine_batches_requests_that_arrive_together_and_splits_by_settings(tok):
    gen = FakeGenerator(tok)
    engine = BatchingEngine(gen, max_batch=8, wait_s=0.2)
    jobs = [Job([1, 2, 3], 4, 0.0, 1.0, ()) for _ in range(5)] + [Job([1, 2], 4, 0.9, 1.0, ())]
    futures = [engine.submit(j) for j in jobs]
    assert all(len(f.result(timeout=30).token_ids) == 4 for f in futures)
    assert sorted(c[0] for c in gen.calls) == [1, 5]  # one batch per sampling setting


def test_resolve_served_reads_an_adapters_base(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/models/base"}))
    assert resolve_served(str(tmp_path), None) == ("/models/base", str(tmp_path))
    assert resolve_served("embedded:smollm2-135m-instruct", None) == ("embedded:smollm2-135m-instruct", None)
    with pytest.raises(ValueError, match="not a LoRA adapter"):
        resolve_served("embedded:smollm2-135m-instruct", str(tmp_path / "nope"))


@pytest.mark.model
def test_coa_lab_serve_is_a_teacher_for_a_capture_over_http(tmp_path):
    """The real command on a free loopback port with the embedded model; the lab's own
    capture uses it as a remote teacher; the traces show each agent's own context."""
    from coa_lab import pipeline
    from coa_lab.config import get_preset

    port = free_port()
    env = {**os.environ, "TQDM_DISABLE": "1"}
    server = subprocess.Popen([sys.executable, "-m", "coa_lab.cli", "serve", "embedded:smollm2-135m-instruct",
                               "--port", str(port), "--name", "smol"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, server.stdout.read()[-2000:]
            assert time.monotonic() < deadline, "coa-lab serve did not come up in 180 s"
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        # concurrent requests decode as one batch on the server
        def one(q):
            return httpx.post(f"{url}/chat/completions", timeout=120, json={
                "model": "smol", "messages": [{"role": "user", "content": q}], "max_tokens": 8, "temperature": 0})
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(one, ["Hi", "What is 2+2?", "Name a color.", "Say yes."]))
        assert all(r.status_code == 200 and r.json()["choices"][0]["message"]["content"] for r in replies)
        # one-hop tasks only: this test counts the agent calls of a one-hop run (6); the two-hop
        # share's own tests are in test_capture.py and test_pipeline_smoke.py
        preset = get_preset("cpu-smoke", capture={"tasks": {"math/arith": 2, "mhqa/lookup": 1}, "multi_hop_tasks": {},
                                                  "teacher_url": url, "teacher_model": "smol", "concurrency": 3})
        summary = pipeline.capture(preset, tmp_path)
        batches = httpx.get(f"http://127.0.0.1:{port}/health").json()["batches"]
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert summary["runs"] == 3 and summary["failed"] == 0 and summary["requests"] == 3 * 6
    assert batches < 4 + 3 * 6  # concurrent requests shared batches
    runs = [json.loads(line) for line in (tmp_path / "capture" / "traces.jsonl").read_text().splitlines()]
    for run in runs:
        systems = [a["messages"][0]["content"] for a in run["activations"]]
        assert len(set(systems)) == 5  # planner, thinker, tool agent, reflector, answerer: each its own prompt
        assert all(a["prompt_tokens"] > 0 and a["completion_tokens"] > 0 for a in run["activations"])
        assert any(a["tool"] and a["observation"] is not None for a in run["activations"])
