"""Model loading: the embedded offline model, clear errors for bad names and missing extras."""

import pytest

from coa_lab.config import ModelConfig
from coa_lab.generation.models import ModelLoadError, embedded_model_dir, load_model, load_tokenizer, require

pytestmark = pytest.mark.model


def test_embedded_model_is_converted_once_and_cached():
    path = embedded_model_dir()
    assert (path / "model.safetensors").exists() and (path / "tokenizer.json").exists()
    mtime = (path / "model.safetensors").stat().st_mtime
    assert embedded_model_dir() == path  # second call reuses the cache
    assert (path / "model.safetensors").stat().st_mtime == mtime


def test_embedded_tokenizer_ends_turns_at_im_end():
    tok = load_tokenizer("embedded")
    # The GGUF metadata says <|im_start|>; generation must stop at the end of the turn.
    assert tok.eos_token == "<|im_end|>"
    assert tok.padding_side == "left"


def test_load_model_with_lora_only_trains_adapters():
    model, tok = load_model(ModelConfig(lora_r=4, lora_alpha=8), trainable=True)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    ids = tok("Hello", return_tensors="pt")["input_ids"]
    assert model(input_ids=ids).logits.shape[-1] == model.config.vocab_size


def test_unknown_model_name_gives_clear_error():
    with pytest.raises(ModelLoadError, match="could not load model 'no-such-org/no-such-model'"):
        load_model(ModelConfig(name="no-such-org/no-such-model"))


def test_4bit_on_cpu_is_refused_with_a_hint():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ModelLoadError, match="needs a CUDA GPU"):
        load_model(ModelConfig(load_in_4bit=True))


def test_missing_optional_package_names_the_extra():
    with pytest.raises(ModelLoadError, match=r"\[gpu\]"):
        require("surely_not_a_real_package_xyz", "gpu")


def test_a_full_fine_tune_output_becomes_the_base_for_a_lora(tmp_path):
    """SFT with lora_r=0 (the 32B preset) saves a whole model where an adapter would go; RL and
    eval then load it as the base and put their LoRA on top (docs/scaling.md)."""
    import torch

    from coa_lab.generation.models import is_full_model_dir

    full, tok = load_model(ModelConfig(lora_r=0), trainable=True)
    with torch.no_grad():
        full.model.norm.weight.mul_(1.5)  # "trained": differs from the embedded base
    full.save_pretrained(tmp_path / "sft_out")
    tok.save_pretrained(tmp_path / "sft_out")
    assert is_full_model_dir(tmp_path / "sft_out")

    policy, _ = load_model(ModelConfig(lora_r=8), adapter=tmp_path / "sft_out", trainable=True)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert torch.equal(policy.base_model.model.model.norm.weight, full.model.norm.weight)  # the SFT weights

    policy.save_pretrained(tmp_path / "rl_out")  # an adapter folder: not a whole model
    assert not is_full_model_dir(tmp_path / "rl_out")


class _On:
    """A stand-in model whose parameters live on `device` (no CUDA needed to build the context)."""

    def __init__(self, device):
        import torch

        on = torch.device(device)
        self._p = torch.nn.Parameter(torch.zeros(1)) if device == "cpu" else type("P", (), {"device": on})()

    def parameters(self):
        yield self._p


def test_compute_context_autocasts_a_bf16_preset_on_gpu_and_not_an_fp32_one():
    # QLoRA's prepare_model_for_kbit_training upcasts norms and embeddings to fp32: without autocast
    # every activation of the lab's own forward passes ran in fp32 on the GPU (docs/gpu-validation.md)
    import warnings

    import torch

    from coa_lab.generation.models import compute_context

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available": building the context is enough
        ctx = compute_context(_On("cuda"), ModelConfig(dtype="bfloat16", load_in_4bit=True))
    assert isinstance(ctx, torch.autocast) and ctx.device == "cuda" and ctx.fast_dtype == torch.bfloat16
    assert not isinstance(compute_context(_On("cuda"), ModelConfig(dtype="float32")), torch.autocast)
    assert not isinstance(compute_context(_On("cpu"), ModelConfig(cpu_autocast_bf16=False)), torch.autocast)


def test_held_frozen_linears_give_bit_identical_autocast_logits_and_restore_the_tied_head():
    # autocast re-cast every frozen fp32 weight at every decode step (it caches only weights that
    # require grad); holding them in bf16 while decoding must change nothing but that
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from coa_lab.generation.models import hold_frozen_linears

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    for p in model.parameters():  # a trained adapter, not LoRA's zero start
        if p.requires_grad:
            p.data.normal_(0, 0.1)
    base = model.base_model.model
    assert base.lm_head.weight is base.model.embed_tokens.weight  # tied
    ids = torch.randint(0, 64, (3, 9))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def logits():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return model(ids).logits

    plain = logits()
    with hold_frozen_linears(model, torch.bfloat16) as n:
        assert n == 2 * 7 + 1  # q, k, v, o, gate, up, down in each of the 2 layers, and the lm_head
        assert base.model.layers[0].self_attn.q_proj.base_layer.weight.dtype == torch.bfloat16
        assert base.lm_head.weight.dtype == torch.bfloat16
        assert base.model.embed_tokens.weight.dtype == torch.float32  # the residual stream starts in fp32
        assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)  # LoRA's
        held = logits()
    assert torch.equal(plain, held)
    assert base.lm_head.weight is base.model.embed_tokens.weight  # tied again
    for name, p in model.named_parameters():  # the very fp32 tensors are back
        assert p.dtype == torch.float32 and torch.equal(p, before[name]), name


def test_the_embedded_tokenizer_decodes_without_the_cleanup_warning(tmp_path):
    """transformers ignores clean_up_tokenization_spaces=True for a BPE tokenizer and warns on every
    decode; the converted config says false (models.bpe_without_cleanup), so no decode warns and
    none changes: spaces before punctuation survive."""
    import json
    import subprocess
    import sys

    from coa_lab.generation.models import bpe_without_cleanup

    folder = tmp_path / "converted"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps({"clean_up_tokenization_spaces": True, "x": 1}))
    bpe_without_cleanup(folder)
    assert json.loads((folder / "tokenizer_config.json").read_text()) == {"clean_up_tokenization_spaces": False, "x": 1}
    code = ("from coa_lab.generation.models import load_tokenizer\n"
            "t = load_tokenizer('embedded')\n"
            "print(repr(t.decode(t('Hello , world !').input_ids)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr("Hello , world !")
    assert "clean_up_tokenization_spaces" not in done.stderr, done.stderr
