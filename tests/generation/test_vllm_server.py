"""RL sampling from a separate vLLM server: coa_lab.generation.vllm_server.VLLMServerGenerator against `coa-lab
serve`, the lab's CPU stand-in for the part of vLLM's OpenAI server it uses (token-id
completions, LoRA hot loading). First the stand-in's endpoints and the client's parsing on fake
generators and a fake old vLLM; then the real command with the embedded model: greedy
completions equal HFGenerator's token for token, a pushed LoRA adapter samples like the local
PEFT model, the previous adapter is unloaded, and failures are clear errors without the key.

The same client against real vLLM (its CPU build, `vllm serve` with runtime LoRA loading) is
tests/generation/test_vllm_cpu_serve.py; docs/vllm-server.md says which of vLLM's fields the
client relies on and where they are documented."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient

from coa_lab.config import get_preset
from coa_lab.generation.chat_prompt import chat_prompt_ids
from coa_lab.generation.llm import rl_sampler
from coa_lab.generation.models import load_tokenizer
from coa_lab.generation.openai_backend import AuthError, BackendError
from coa_lab.generation.result import Generation
from coa_lab.serve.app import create_app
from coa_lab.serve.batching import BatchingEngine, Job
from coa_lab.serve.stub_teacher import free_port, serve_in_thread
from coa_lab.generation.vllm_server import VLLMServerGenerator

ANSWER = "Paris. Then 3 more words"


class FakeGenerator:
    """Answers ANSWER token by token with HFGenerator's rules: stops after the token that
    completes a stop string, at max_new_tokens, or with EOS; records each batched call."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.calls = []

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()):
        self.calls.append((len(prompts), max_new_tokens, temperature, stop))
        answer = self.tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
        ids, finish = [], "eos"
        for t in answer:
            ids.append(t)
            if any(s in self.tokenizer.decode(ids) for s in stop):
                finish = "stop"
                break
            if len(ids) == max_new_tokens:
                finish = "length"
                break
        else:
            ids.append(self.tokenizer.eos_token_id)
        return [Generation(list(ids), self.tokenizer.decode(ids), finish, len(p)) for p in prompts]


class FakeAdapters:
    """Stands in for LoraAdapters: records which adapter each batch ran with."""

    def __init__(self):
        self.paths, self.active_log = {}, []

    def load(self, name, path):
        self.paths[name] = path

    def unload(self, name):
        del self.paths[name]

    @contextlib.contextmanager
    def active(self, name):
        self.active_log.append(name)
        yield


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("embedded")


@pytest.fixture()
def client(tok):
    gen, adapters = FakeGenerator(tok), FakeAdapters()
    app = create_app(BatchingEngine(gen, max_batch=8, adapters=adapters), "lab-model", context_length=256,
                     runtime_lora=True)
    with TestClient(app) as c:
        c.gen, c.adapters = gen, adapters
        yield c


def complete(client, **kw):
    return client.post("/v1/completions", json={"model": "lab-model", "max_tokens": 20, "temperature": 0, **kw})


# -- the stand-in's endpoints ---------------------------------------------------------------


def test_completions_answer_with_vllms_fields(client, tok):
    ids = tok("Capital of France?", add_special_tokens=False)["input_ids"]
    body = complete(client, prompt=[ids, ids[:3]], n=2, stop=["3"], include_stop_str_in_output=True,
                    return_token_ids=True).json()
    assert body["object"] == "text_completion" and body["model"] == "lab-model"
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]  # prompt-major, n per prompt
    first = body["choices"][0]
    assert first["text"] == "Paris. Then 3" and first["finish_reason"] == "stop" and first["stop_reason"] == "3"
    assert tok.decode(first["token_ids"]) == "Paris. Then 3"
    assert [c["prompt_token_ids"] for c in body["choices"]] == [ids, ids, ids[:3], ids[:3]]
    assert body["usage"]["prompt_tokens"] == len(ids) + 3
    assert body["usage"]["completion_tokens"] == 4 * len(first["token_ids"])
    # vLLM's defaults: the stop string is cut off, no ids unless asked for; text prompts work
    cut = complete(client, prompt="Capital of France?", stop="3").json()["choices"][0]
    assert cut["text"] == "Paris. Then " and cut["token_ids"] is None and cut["stop_reason"] == "3"
    # EOS: finish "stop" with no stop_reason; the EOS id is in token_ids, its text only with include_stop
    eos = complete(client, prompt=ids, return_token_ids=True).json()["choices"][0]
    assert (eos["text"], eos["finish_reason"], eos["stop_reason"]) == (ANSWER, "stop", None)
    assert eos["token_ids"][-1] == tok.eos_token_id
    kept = complete(client, prompt=ids, include_stop_str_in_output=True, skip_special_tokens=False).json()
    assert kept["choices"][0]["text"] == ANSWER + tok.eos_token
    short = complete(client, prompt=ids, max_tokens=2).json()["choices"][0]
    assert short["finish_reason"] == "length" and short["stop_reason"] is None
    assert client.gen.calls[-1][:2] == (1, 2)


def test_completion_errors_are_vllm_shaped(client, tok):
    unknown = complete(client, model="gpt-4", prompt=[1, 2])
    assert unknown.status_code == 404
    assert unknown.json() == {"error": {"message": "The model `gpt-4` does not exist.", "type": "NotFoundError",
                                        "param": "model", "code": 404}}
    assert complete(client, prompt=[1, 2], logprobs=1).status_code == 400  # not honoured, so refused
    assert complete(client, prompt=[1, 2], repetition_penalty=1.05).status_code == 400
    assert complete(client, prompt=[1, 2], top_k=-1, min_p=0.0, repetition_penalty=1.0).status_code == 200
    assert complete(client, prompt=[]).status_code == 400
    assert complete(client, prompt=[len(tok) + 10]).status_code == 400
    long = complete(client, prompt=[1] * 250)
    assert long.status_code == 400 and "maximum context length is 256" in long.json()["error"]["message"]


def test_lora_endpoints_load_list_route_and_unload(client, tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    missing = client.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(tmp_path / "nope")})
    assert missing.status_code == 404 and "No adapter found" in missing.json()["error"]["message"]
    ok = client.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(tmp_path)})
    assert ok.status_code == 200 and ok.text == "Success: LoRA adapter 'a' added successfully."
    again = client.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(tmp_path)})
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    assert cards["a"]["parent"] == "lab-model" and cards["a"]["root"] == str(tmp_path)
    assert cards["lab-model"]["max_model_len"] == 256
    assert complete(client, model="a", prompt=[1, 2]).json()["model"] == "a"
    assert client.adapters.active_log[-1] == "a"  # that batch decoded with adapter "a"
    assert client.post("/v1/chat/completions", json={"model": "a", "messages": [{"role": "user", "content": "hi"}],
                                                     "max_tokens": 4}).status_code == 200
    gone = client.post("/v1/unload_lora_adapter", json={"lora_name": "a"})
    assert gone.status_code == 200 and gone.text == "Success: LoRA adapter 'a' removed successfully."
    assert client.post("/v1/unload_lora_adapter", json={"lora_name": "a"}).status_code == 404
    assert complete(client, model="a", prompt=[1, 2]).status_code == 404
    assert [c["id"] for c in client.get("/v1/models").json()["data"]] == ["lab-model"]


def test_lora_endpoints_exist_only_when_runtime_updating_is_allowed(tok, monkeypatch):
    for allowed, status in (("0", 404), ("True", 400)):  # 400: there, but the body names no adapter
        monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", allowed)
        with TestClient(create_app(BatchingEngine(FakeGenerator(tok)), "m", 256)) as c:
            assert c.post("/v1/load_lora_adapter", json={}).status_code == status


def test_engine_decodes_one_adapter_per_batch_and_runs_calls_in_order(tok):
    gen, adapters = FakeGenerator(tok), FakeAdapters()
    engine = BatchingEngine(gen, max_batch=16, wait_s=0.2, adapters=adapters)
    names = ["a", None, "a", "b", None, "a"]
    futures = [engine.submit(Job([1, 2], 4, 0.0, 1.0, (), name)) for name in names]
    done = engine.call(lambda: [f.done() for f in futures])  # queued after the jobs: runs after them
    assert done.result(timeout=30) == [True] * len(names)
    batches = dict(zip(adapters.active_log, (c[0] for c in gen.calls)))
    assert batches == {"a": 3, None: 2, "b": 1} and len(gen.calls) == 3


# -- the client's parsing, on a fake vLLM from before `return_token_ids` ---------------------


class OldVLLM(BaseHTTPRequestHandler):
    """Answers like a vLLM without `return_token_ids`: ids only as 'token_id:N' logprob tokens."""

    bodies: list = []

    def _send(self, payload):
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({"object": "list", "data": [{"id": "base-m", "max_model_len": 100, "parent": None},
                                               {"id": "old-lora", "parent": "base-m"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        OldVLLM.bodies.append(body)
        ends = [("stop", "</code>", " x</code>"), ("stop", 151643, " y"), ("length", None, " z z"), ("stop", None, "")]
        choices = []
        for i, prompt in enumerate(body["prompt"]):
            finish, reason, text = ends[prompt[0] % 4]
            ids = [100 + i, 200 + len(prompt)]
            logprobs = ({"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-0.5, -0.1],
                         "top_logprobs": None, "text_offset": [0, 1]} if body.get("return_tokens_as_token_ids")
                        else None)
            choices.append({"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish,
                            "stop_reason": reason})
        self._send({"object": "text_completion", "model": body["model"], "choices": choices,
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    def log_message(self, *a):
        pass


def test_client_reads_ids_from_logprobs_on_an_older_vllm_and_maps_finish_reasons():
    server = HTTPServer(("127.0.0.1", 0), OldVLLM)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    OldVLLM.bodies.clear()
    try:
        gen = VLLMServerGenerator(f"http://127.0.0.1:{server.server_port}/v1", concurrency=1)
        prompts = [[0, 1], [1, 1], [2, 1], [3, 1], [0] * 95, [1] * 100]
        out = gen.generate(prompts, 10, temperature=0.7, top_p=0.9, stop=["</code>"])
    finally:
        server.shutdown()
    assert gen.model == "base-m" and gen.max_model_len == 100  # the base card, not the LoRA's
    assert [g.finish_reason for g in out] == ["stop", "eos", "length", "eos", "stop", "length"]
    assert [g.token_ids for g in out[:4]] == [[100, 202], [101, 202], [102, 202], [103, 202]]
    assert out[4].token_ids == [100, 295] and out[5].token_ids == [] and out[5].prompt_tokens == 100
    first, *rest = OldVLLM.bodies  # asked for return_token_ids, got none, asked again via logprobs
    # sampling: the sampled tokens' log-probs are asked for from the start (RL's correction)
    assert first["return_token_ids"] is True and first["logprobs"] == 0 and "return_tokens_as_token_ids" not in first
    assert all(b["logprobs"] == 0 and b["return_tokens_as_token_ids"] for b in rest)
    assert sorted(b["max_tokens"] for b in rest) == [5, 10]  # 95 prompt tokens leave 5 of the 100
    sent = rest[0]
    assert sent["model"] == "base-m" and sent["include_stop_str_in_output"] and not sent["skip_special_tokens"]
    assert (sent["temperature"], sent["top_p"], sent["top_k"], sent["repetition_penalty"]) == (0.7, 0.9, -1, 1.0)
    assert sent["stop"] == ["</code>"] and sent["n"] == 1


# -- the client's errors ----------------------------------------------------------------------


def test_client_errors_are_clear_and_never_show_the_key(tok, monkeypatch, tmp_path):
    key = f"sk-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("VS_TEST_KEY", key)
    monkeypatch.setenv("VS_WRONG_KEY", f"sk-wrong-{uuid.uuid4().hex}")
    quick = {"api_key_env": "VS_TEST_KEY", "max_retries": 1, "backoff_s": 0.01}
    errors = []
    down = VLLMServerGenerator(f"http://127.0.0.1:{free_port()}/v1", tok, **quick)
    with pytest.raises(BackendError, match="could not reach it") as e:
        down.generate([[1, 2]], 4)
    errors.append(e.value)
    engine = BatchingEngine(FakeGenerator(tok), adapters=FakeAdapters())
    with serve_in_thread(create_app(engine, "lab-model", 256, api_key_env="VS_TEST_KEY", runtime_lora=True)) as url:
        gen = VLLMServerGenerator(url, tok, **quick)
        assert gen.generate([[1, 2]], 30)[0].text == ANSWER + tok.eos_token  # the key works
        assert key not in repr(gen) and key not in str(vars(gen))
        with pytest.raises(BackendError, match="The model `gpt-4` does not exist") as e:
            VLLMServerGenerator(url, tok, model="gpt-4", **quick).generate([[1, 2]], 4)
        errors.append(e.value)
        # the server quotes the path it could not find; the key in that path is scrubbed
        with pytest.raises(BackendError, match="No adapter found.*shared filesystem") as e:
            gen.set_adapter(tmp_path / f"missing-{key}")
        assert "***" in str(e.value) and gen.lora_name is None
        errors.append(e.value)
        full_model = tmp_path / "full"  # a full fine-tune's output is no LoRA: said before asking the server
        full_model.mkdir()
        (full_model / "config.json").write_text("{}")
        with pytest.raises(ValueError, match="not a LoRA adapter folder.*serve it as the vLLM server's base model"):
            gen.set_adapter(full_model)
        with pytest.raises(AuthError, match="rejected the key") as e:
            VLLMServerGenerator(url, tok, api_key_env="VS_WRONG_KEY").generate([[1, 2]], 4)
        errors.append(e.value)
    with serve_in_thread(create_app(BatchingEngine(FakeGenerator(tok)), "lab-model", 256, runtime_lora=False)) as url:
        lora = tmp_path / "lora"
        lora.mkdir()
        (lora / "adapter_config.json").write_text("{}")
        with pytest.raises(BackendError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING") as e:
            VLLMServerGenerator(url, tok, **quick).set_adapter(lora)
        errors.append(e.value)
    assert all(key not in str(err) and os.environ["VS_WRONG_KEY"] not in str(err) for err in errors)


def test_data_parallel_ranks_share_one_adapter_on_the_server(tok, tmp_path):
    """Each rank has its own sampler and pushes the same step folder: one adapter is loaded
    (vLLM batches at most --max-loras adapters), whoever comes second finds it done."""
    steps = []
    for i in range(2):
        step = tmp_path / f"step{i}"
        step.mkdir()
        (step / "adapter_config.json").write_text("{}")
        (step / "adapter_model.safetensors").write_bytes(b"weights")
        steps.append(step)
    adapters = FakeAdapters()
    with serve_in_thread(create_app(BatchingEngine(FakeGenerator(tok), adapters=adapters), "lab-model", 256,
                                    runtime_lora=True)) as url:
        ranks = [VLLMServerGenerator(url, tok) for _ in range(2)]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no failed unloads either
            for step in steps:
                for rank in ranks:
                    rank.set_adapter(step)
                assert ranks[0].lora_name == ranks[1].lora_name and list(adapters.paths) == [ranks[0].lora_name]
                assert adapters.paths[ranks[0].lora_name] == str(step.resolve())
            ranks[0].generate([[1, 2]], 4)
        assert adapters.active_log[-1] == ranks[0].lora_name
        (steps[1] / "adapter_model.safetensors").write_bytes(b"other weights")  # rewritten in place: a new name
        assert ranks[0].adapter_name(steps[1]) != ranks[0].lora_name
        for rank in ranks:
            rank.close()


def test_rl_sampler_needs_the_server_url():
    preset = get_preset("cpu-smoke", gen={"backend": "vllm-server"})
    with pytest.raises(ValueError, match=r"gen\.server_url"):
        rl_sampler(preset, None, None)


def test_the_in_process_engine_leaves_the_trainer_its_share_of_the_gpu(monkeypatch, tmp_path):
    """gen.backend="vllm" puts the engine on the training GPU: it is built with the preset's
    memory fraction (vLLM's default, 0.9, would leave the policy being trained no room), and a
    full fine-tune's output where an adapter would go becomes the engine's base model."""
    import coa_lab.generation.llm as llm

    built = []

    class FakeEngine:
        def __init__(self, model_path, tokenizer, max_lora_rank=64, **kwargs):
            built.append((model_path, max_lora_rank, kwargs))
            self.adapters = []

        def set_adapter(self, adapter_dir):
            self.adapters.append(adapter_dir)

    monkeypatch.setattr(llm, "VLLMGenerator", FakeEngine)
    preset = get_preset("gpu-3b-qlora", gen={"vllm_memory_fraction": 0.4, "backend": "vllm"})
    gen = rl_sampler(preset, None, "runs/x/sft/adapter")
    assert built[-1][1] == 64 and built[-1][2]["gpu_memory_utilization"] == 0.4
    assert built[-1][2]["dtype"] == llm.engine_dtype(preset.model)  # vLLM computes as the trainer does
    assert gen.adapters == ["runs/x/sft/adapter"]
    full = tmp_path / "sft_full"
    full.mkdir()
    (full / "config.json").write_text("{}")
    gen = rl_sampler(preset, None, full)
    assert built[-1][0] == str(full) and gen.adapters == [None]


# -- the real `coa-lab serve` with the embedded model ----------------------------------------

PROMPTS = ["Say hi.", "Count to three.", "Name a color.", "What is 2+2?"]


def make_adapter(preset, folder):
    """A LoRA adapter whose greedy outputs differ from the base model's: the fresh LoRA's B
    matrices (zeros) drawn from a fixed seed."""
    import torch

    from coa_lab.generation.models import load_model

    model, _ = load_model(preset.model, trainable=True)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """`coa-lab serve` in a subprocess (LoRA endpoints on, an API key required, fp32 like the
    local references), and the local HFGenerators to compare with, loaded while it starts."""
    from coa_lab.generation.hf_generator import HFGenerator
    from coa_lab.generation.models import load_model

    key_env, key = "COA_TEST_VLLM_SERVER_KEY", f"sk-test-{uuid.uuid4().hex}"
    port, logs = free_port(), tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "TQDM_DISABLE": "1", "COA_LAB_CPU_BF16": "0", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
           key_env: key}
    with open(logs, "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "coa_lab.cli", "serve", "embedded:smollm2-135m-instruct",
                                   "--port", str(port), "--name", "smol", "--api-key-env", key_env],
                                  env=env, stdout=log, stderr=subprocess.STDOUT)
    os.environ[key_env] = key
    try:
        preset = get_preset("cpu-smoke", model={"cpu_autocast_bf16": False})
        base_model, tokenizer = load_model(preset.model)
        adapter = make_adapter(preset, tmp_path_factory.mktemp("adapter"))
        tuned_model, _ = load_model(preset.model, adapter=adapter)
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, logs.read_text()[-2000:]
            assert time.monotonic() < deadline, "coa-lab serve did not come up in 180 s"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        lab = SimpleNamespace(url=url, tok=tokenizer, key_env=key_env, key=key, adapter=adapter,
                              base=HFGenerator(base_model, tokenizer), tuned=HFGenerator(tuned_model, tokenizer),
                              prompts=[chat_prompt_ids(tokenizer, [{"role": "user", "content": q}]) for q in PROMPTS])
        cache = {}

        def reference(which):  # the local greedy answers the adapter tests compare with, computed once
            if which not in cache:
                cache[which] = getattr(lab, which).generate(lab.prompts, 16, 0.0, 1.0, ["."])
            return cache[which]

        lab.reference = reference
        yield lab
    finally:
        os.environ.pop(key_env, None)
        server.terminate()
        server.wait(timeout=30)


def served_ids(lab) -> list[str]:
    r = httpx.get(f"{lab.url}/models", headers={"Authorization": f"Bearer {lab.key}"})
    return [c["id"] for c in r.json()["data"]]


def same(got, want) -> bool:
    return all((g.token_ids, g.finish_reason, g.text, g.prompt_tokens) == (w.token_ids, w.finish_reason, w.text,
                                                                            w.prompt_tokens)
               for g, w in zip(got, want, strict=True))


@pytest.mark.model
def test_the_official_openai_client_reads_coa_lab_serve(lab):
    """The reader test_vllm_cpu_serve.py runs against real `vllm serve`, here on the stand-in."""
    from openai_reader import read_with_openai

    got = read_with_openai(lab.url, lab.key, "smol")
    assert "smol" in got["models"] and got["text"] and got["finish_reason"] in ("length", "stop")
    assert got["chat"] and got["wrong_key_refused"]


@pytest.mark.model
def test_greedy_completions_from_token_ids_equal_hf_generate(lab):
    gen = VLLMServerGenerator(lab.url, lab.tok, api_key_env=lab.key_env, concurrency=2)  # 2 requests of 2 rows
    want = lab.base.generate(lab.prompts, 24, 0.0, 1.0, ["!"])
    got = gen.generate(lab.prompts, 24, 0.0, 1.0, ["!"])
    assert same(got, want)
    assert sorted(g.finish_reason for g in want) == ["eos", "eos", "length", "stop"]  # all three kinds covered
    stopped = next(g for g in got if g.finish_reason == "stop")
    assert stopped.text.endswith("!") and got[2].token_ids[-1] == lab.tok.eos_token_id
    assert gen.model == "smol" and gen.max_model_len > 0


@pytest.mark.model
def test_set_adapter_hot_loads_the_lora_and_unloads_the_previous_one(lab, tmp_path):
    preset = get_preset("cpu-smoke", gen={"backend": "vllm-server", "server_url": lab.url,
                                          "server_api_key_env": lab.key_env})
    gen = rl_sampler(preset, lab.tok, lab.adapter)  # what train_rl does: the starting adapter pushed
    assert isinstance(gen, VLLMServerGenerator) and gen.lora_name in served_ids(lab)
    want, base = lab.reference("tuned"), lab.reference("base")
    assert [w.token_ids for w in want] != [b.token_ids for b in base]  # the adapter matters
    assert same(gen.generate(lab.prompts, 16, 0.0, 1.0, ["."]), want)
    # the base model and the adapter requested together (queued while the server is busy, so
    # the engine takes them at once): each batch decodes with one adapter active, or none
    plain = VLLMServerGenerator(lab.url, lab.tok, api_key_env=lab.key_env)
    with ThreadPoolExecutor(3) as pool:
        busy = pool.submit(gen.generate, lab.prompts, 32)
        time.sleep(0.3)
        both = [pool.submit(g.generate, lab.prompts, 16, 0.0, 1.0, ["."]) for g in (gen, plain)]
        assert same(both[0].result(), want) and same(both[1].result(), base) and busy.result()
    first = gen.lora_name
    step = shutil.copytree(lab.adapter, tmp_path / "sampler" / "step0")  # the trainer's push after an update
    gen.set_adapter(step)
    assert gen.lora_name != first and served_ids(lab) == ["smol", gen.lora_name]  # the old one dropped
    assert same(gen.generate(lab.prompts, 16, 0.0, 1.0, ["."]), want)
    gen.set_adapter(None)  # back to the base model, nothing left loaded
    assert gen.lora_name is None and served_ids(lab) == ["smol"]
    assert same(gen.generate(lab.prompts, 16, 0.0, 1.0, ["."]), base)


@pytest.mark.model
def test_an_adapter_that_does_not_load_is_a_clear_error_and_the_server_goes_on(lab, tmp_path):
    no_weights, wrong_rank = tmp_path / "no_weights", tmp_path / "wrong_rank"
    no_weights.mkdir()
    shutil.copy(lab.adapter / "adapter_config.json", no_weights)
    shutil.copytree(lab.adapter, wrong_rank)  # rank-16 weights under a config that says 8: shapes mismatch
    config = json.loads((wrong_rank / "adapter_config.json").read_text())
    (wrong_rank / "adapter_config.json").write_text(json.dumps({**config, "r": 8}))
    gen = VLLMServerGenerator(lab.url, lab.tok, api_key_env=lab.key_env)
    for broken in (no_weights, wrong_rank):
        with pytest.raises(BackendError, match="Loading lora .* failed") as e:
            gen.set_adapter(broken)
        assert lab.key not in str(e.value) and gen.lora_name is None and served_ids(lab) == ["smol"]
    assert same(gen.generate(lab.prompts, 16, 0.0, 1.0, ["."]), lab.reference("base"))
    gen.set_adapter(lab.adapter)  # with an adapter loaded, a failed load leaves it in place
    good = gen.lora_name
    with pytest.raises(BackendError, match="size mismatch"):
        gen.set_adapter(wrong_rank)
    assert gen.lora_name == good and served_ids(lab) == ["smol", good]
    assert same(gen.generate(lab.prompts, 16, 0.0, 1.0, ["."]), lab.reference("tuned"))
    gen.set_adapter(None)


@pytest.mark.model
def test_coa_rollouts_through_the_server_equal_local_ones(lab):
    """run_coa (the rollouts RL and evaluation share) on the server, with the adapter pushed,
    against the local PEFT model taking the same one-turn-at-a-time path: the same tokens,
    masks and endings. (This untrained model answers without calling a tool; run_coa's
    observation turns are tests/core/test_student_rollout.py's.)"""
    from coa_lab.student_rollout import run_coa
    from coa_lab.tasks.records import Task
    from coa_lab.tools.registry import build_tools

    class OneTurnAtATime:  # no multi_turn: run_coa re-sends each rollout's prefix, as for a server
        def __init__(self, generator):
            self.tokenizer, self.generate = generator.tokenizer, generator.generate

    cfg = get_preset("cpu-smoke").gen
    tasks = [Task("t1", "What is 17 * 23?", ["391"], "test", "math", {}),
             Task("t2", "What is 2 to the power of 10?", ["1024"], "test", "math", {})]
    tools = build_tools(["code"])
    gen = VLLMServerGenerator(lab.url, lab.tok, api_key_env=lab.key_env)
    gen.set_adapter(lab.adapter)
    try:
        got = run_coa(gen, tasks, tools, cfg, samples=1, temperature=0.0)
    finally:
        gen.set_adapter(None)
    want = run_coa(OneTurnAtATime(lab.tuned), tasks, tools, cfg, samples=1, temperature=0.0)

    def key(r):
        return r.response_ids, r.response_mask, r.text, r.finish, r.tool_calls

    assert [key(r) for r in got] == [key(r) for r in want]
    assert all(r.response_ids for r in got)


@pytest.mark.model
def test_an_rl_run_samples_from_the_server_and_pushes_every_update(lab, tmp_path):
    """train_rl with gen.backend="vllm-server": rollouts come from the server, and after each
    update the new adapter is saved, hot-loaded there, and older step folders are cleared. The
    server then samples exactly like the trained policy loaded locally."""
    from coa_lab.generation.hf_generator import HFGenerator
    from coa_lab.generation.models import load_model
    from coa_lab.rl.trainer import train_rl
    from coa_lab.tasks.records import Task
    from coa_lab.tools.registry import build_tools

    # short budgets with an overlong window: rollouts of different lengths get different shaped
    # rewards, so every group moves the weights even when no answer is right
    preset = get_preset("cpu-smoke", model={"cpu_autocast_bf16": False},
                        gen={"backend": "vllm-server", "server_url": lab.url, "server_api_key_env": lab.key_env,
                             "max_new_tokens": 24, "max_response_tokens": 32, "max_turns": 1},
                        rl={"steps": 3, "prompts_per_step": 2, "group_size": 2, "dynamic_sampling": False,
                            "overlong_buffer": 24, "overlong_filter": False, "learning_rate": 1e-3, "save_steps": 0})
    tasks = [Task(f"t{i}", f"What is {i} + {i}?", [str(2 * i)], "test", "math", {}) for i in range(1, 5)]
    result = train_rl(preset, tasks, build_tools(["code"]), tmp_path / "rl", adapter=lab.adapter)
    assert [m["step"] for m in result.metrics] == [0, 1, 2] and all("loss" in m for m in result.metrics)
    assert sorted(p.name for p in (tmp_path / "rl" / "sampler").iterdir()) == ["step1", "step2"]  # step0 cleared
    served = [i for i in served_ids(lab) if i != "smol"]
    assert len(served) == 1  # the last push replaced the ones before it

    local, tok = load_model(preset.model, adapter=tmp_path / "rl" / "adapter")
    want = HFGenerator(local, tok).generate(lab.prompts, 16, 0.0, 1.0, ["."])
    # RL moved the policy: checked on the weights, not on greedy tokens, which three small steps at
    # this rate can leave unchanged
    from safetensors.torch import load_file
    before = load_file(str(lab.adapter / "adapter_model.safetensors"))
    after = load_file(str(tmp_path / "rl" / "adapter" / "adapter_model.safetensors"))
    assert before.keys() == after.keys()
    assert max((after[k] - before[k]).abs().max().item() for k in before) > 0
    probe = VLLMServerGenerator(lab.url, lab.tok, api_key_env=lab.key_env)
    probe.set_adapter(tmp_path / "rl" / "sampler" / "step2")  # the same folder: the adapter already loaded
    assert probe.lora_name == served[0]
    assert same(probe.generate(lab.prompts, 16, 0.0, 1.0, ["."]), want)
    probe.set_adapter(None)


@pytest.mark.model
def test_sampling_through_the_server_returns_the_sampled_tokens_logprobs(lab):
    """RL's sampler asks for each sampled token's log-prob (logprobs=0) and carries it into the
    update (probability gap, truncated importance sampling); greedy decoding asks for none."""
    import math

    gen = VLLMServerGenerator(lab.url, lab.tok, api_key_env=lab.key_env)
    sampled = gen.generate(lab.prompts[:2], 12, 0.8, 1.0, [])
    for g in sampled:
        assert g.logprobs is not None and len(g.logprobs) == len(g.token_ids)
        assert all(math.isfinite(x) and x <= 0 for x in g.logprobs)
    assert all(g.logprobs is None for g in gen.generate(lab.prompts[:1], 4, 0.0, 1.0, []))
    bad = httpx.post(f"{lab.url}/completions", headers={"Authorization": f"Bearer {lab.key}"},
                     json={"model": "smol", "prompt": lab.prompts[0], "max_tokens": 2, "logprobs": 5})
    assert bad.status_code == 400 and "logprobs" in bad.text


def test_the_engines_share_of_the_gpu_comes_from_the_plan(monkeypatch):
    """gen.vllm_memory_fraction None: the pipeline's stages fill it with the rollout side's planned
    need on this card, with the planner's margin (generation.engine_share.with_engine_share, the
    numbers `coa-lab plan` prints); an explicit fraction is kept, and a generator built straight
    from an unfilled preset takes 0.5."""
    import types

    import torch

    import coa_lab.generation.llm as llm
    from coa_lab.generation.engine_share import GIB, MEMORY_MARGIN, with_engine_share
    from coa_lab.generation.model_shape import shape_of
    from coa_lab.planning.memory_plan import plan

    preset = get_preset("gpu-3b-qlora")
    assert preset.gen.vllm_memory_fraction is None and llm.vllm_share(preset) == 0.5
    rollout = plan(preset, 1, shape_of(preset.model.name)).rollout_total_gib
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=80 * GIB))
    filled = with_engine_share(preset)
    assert llm.vllm_share(filled) == round(rollout * MEMORY_MARGIN / 80, 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=24 * GIB))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the card the preset is sized for (an L4): 0.44, as `coa-lab plan` says
        assert llm.vllm_share(with_engine_share(preset)) == round(rollout * MEMORY_MARGIN / 24, 2) == 0.44
    explicit = get_preset("gpu-3b-qlora", gen={"vllm_memory_fraction": 0.4})
    assert with_engine_share(explicit) is explicit and llm.vllm_share(explicit) == 0.4
