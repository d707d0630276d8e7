"""A model's shape from its config, without loading it: what sizing an engine (engine_share.py) and
planning a preset (coa_lab/planning/) start from. Needs neither torch nor a download for the
presets' models (KNOWN_SHAPES)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from coa_lab.config import EMBEDDED_MODEL
from coa_lab.generation.models import resolve_model

LLAMA_3_2_1B = dict(hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, intermediate=8192, vocab=128256,
                    tied=True)
# Shapes of the presets' models (their config.json), so a plan needs no download and no transformers.
KNOWN_SHAPES = {
    EMBEDDED_MODEL: dict(hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64,  # SmolLM2-135M-Instruct
                         intermediate=1536, vocab=49152, tied=True),
    # colab-t4's student (fp16 on a T4: docs/colab.md), and Unsloth's ungated upload of the same weights
    "meta-llama/Llama-3.2-1B-Instruct": LLAMA_3_2_1B,
    "unsloth/Llama-3.2-1B-Instruct": LLAMA_3_2_1B,
    "Qwen/Qwen2.5-1.5B-Instruct": dict(hidden=1536, layers=28, heads=12, kv_heads=2, head_dim=128,
                                       intermediate=8960, vocab=151936, tied=True),
    "Qwen/Qwen2.5-3B-Instruct": dict(hidden=2048, layers=36, heads=16, kv_heads=2, head_dim=128,
                                     intermediate=11008, vocab=151936, tied=True),
    # larger local teachers for the GPU presets' capture (capture.teacher_model; docs/scaling.md)
    "Qwen/Qwen2.5-7B-Instruct": dict(hidden=3584, layers=28, heads=28, kv_heads=4, head_dim=128,
                                     intermediate=18944, vocab=152064, tied=False),
    "Qwen/Qwen2.5-14B-Instruct": dict(hidden=5120, layers=48, heads=40, kv_heads=8, head_dim=128,
                                      intermediate=13824, vocab=152064, tied=False),
    "Qwen/Qwen2.5-32B-Instruct": dict(hidden=5120, layers=64, heads=40, kv_heads=8, head_dim=128,
                                      intermediate=27648, vocab=152064, tied=False),
}


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool

    @classmethod
    def from_config(cls, cfg: dict) -> "ModelShape":
        heads = cfg["num_attention_heads"]
        return cls(hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"], heads=heads,
                   kv_heads=cfg.get("num_key_value_heads", heads),
                   head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                   intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
                   tied=bool(cfg.get("tie_word_embeddings", False)))

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear module of one decoder layer (Llama / Qwen2 layout)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        q = self.heads * self.head_dim
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, self.intermediate), "up_proj": (h, self.intermediate),
                "down_proj": (self.intermediate, h)}

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def layer_linear_params(self) -> int:
        return sum(i * o for i, o in self.linear_shapes().values())

    def params(self, biases: int = 0) -> int:
        """Every parameter: embeddings (+ untied LM head), linear weights, two RMSNorms per layer
        and the final norm; `biases` adds per-layer bias terms (Qwen2 has q/k/v biases)."""
        norms = self.layers * 2 * self.hidden + self.hidden
        return self.embedding_params() + self.layers * (self.layer_linear_params() + biases) + norms


def shape_of(model_name: str) -> ModelShape:
    """The shape from a local folder's config.json, KNOWN_SHAPES, or the resolved model's config.

    KNOWN_SHAPES comes before resolving: resolving the embedded model converts it (transformers,
    ~20 s) on a fresh machine, and a plan must stay instant anywhere."""
    local = Path(model_name) / "config.json"
    if local.exists():
        return ModelShape.from_config(json.loads(local.read_text()))
    if model_name in KNOWN_SHAPES:
        return ModelShape(**KNOWN_SHAPES[model_name])
    resolved = Path(resolve_model(model_name)) / "config.json"
    if resolved.exists():
        return ModelShape.from_config(json.loads(resolved.read_text()))
    raise ValueError(f"no shape known for {model_name!r}: pass a local model folder with a config.json, "
                     f"or one of {sorted(KNOWN_SHAPES)}")


def qwen2_biases(shape: ModelShape) -> int:
    """Qwen2's q, k and v projections carry biases: q_out + 2 kv_out per layer."""
    return shape.heads * shape.head_dim + 2 * shape.kv_heads * shape.head_dim


def params_named(name: str, shape: ModelShape) -> int:
    """Every parameter of the model called `name` with this shape: Qwen2 models carry q/k/v biases."""
    return shape.params(qwen2_biases(shape) if "qwen" in name.lower() else 0)
