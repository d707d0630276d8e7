"""Training through compiled decoder layers on a CPU (torch.compile, inductor).

A LoRA training step of the 135M model under bf16 autocast spent about as long in small operators
as in its matmuls (profile of a packed SFT step of two demo trajectories, ~500 tokens: `aten::mm` 27%
of operator time, `copy_` 14% — autocast's casts of every Linear's input and frozen weight —, `mul`
8%, allocations, adds and divisions a few percent each). Every Linear casts, LoRA adds a cast, two
thin products, a scale and a sum, and RMSNorm, rotary and SiLU are a few elementwise operators each,
forward and backward. Inductor fuses them, layer by layer: `benchmarks/bench_compile.py`
measures the step against eager in one run.

    with compiled_layers(model, preset.model):   # SFT's Trainer.train(), an RL or control update
        ...forward, backward...

Layers, not the whole model: the 30 decoder layers share one compiled graph (their parameters
are its inputs), so compiling costs seconds rather than minutes, and the attention runs eager
between the graphs (`cpu_attention`: a packed row's Python loop over its sequences would otherwise
compile once per number of sequences). Only inside the context: the decoder runs the same model
held in bf16 without gradients (generation/decode_numerics.py), which the compiled graphs are
not for. CPU only (a GPU preset's kernels are unsloth's or the library's), never under gradient
checkpointing, and only where a C++ compiler is found (inductor's CPU code is C++): without one the
step runs eager and says so once.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from coa_lab.config import ModelConfig

log = logging.getLogger(__name__)
_warned: set[str] = set()


def decoder_layers(model) -> list:
    """The model's stack of decoder layers (a ModuleList of `*DecoderLayer`s), or []."""
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) and all(
                type(m).__name__.endswith("DecoderLayer") for m in module):
            return list(module)
    return []


def _say_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        log.warning("training runs its decoder layers eager: %s", reason)


def compiler_found() -> bool:
    """Whether inductor finds the C++ compiler its CPU kernels are built with."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return bool(get_cpp_compiler())
    except Exception:  # noqa: BLE001 - any failure to find one means: no compiler
        return False


def wanted(model, cfg: ModelConfig) -> bool:
    """Compile this model's layers for training? (cfg.cpu_compile, a CPU model, no gradient
    checkpointing, no unsloth, a C++ compiler.)"""
    if not cfg.cpu_compile or cfg.use_unsloth:
        return False
    if next(model.parameters()).device.type != "cpu" or getattr(model, "is_gradient_checkpointing", False):
        return False
    if not compiler_found():
        _say_once("no C++ compiler for torch.compile (install g++ or clang, or set model.cpu_compile=false)")
        return False
    return True


@contextlib.contextmanager
def compiled_layers(model, cfg: ModelConfig):
    """Run every decoder layer of `model` through its compiled graph inside the block (see the module
    docstring); yields whether it does. The compiled callables stay on the layers, so entering again
    (every RL step) compiles nothing new."""
    layers = decoder_layers(model) if wanted(model, cfg) else []
    for layer in layers:
        if getattr(layer, "_coa_compiled", None) is None:
            layer._coa_compiled = torch.compile(layer._call_impl, dynamic=True)
        layer._compiled_call_impl = layer._coa_compiled
    try:
        yield bool(layers)
    except torch._dynamo.exc.BackendCompilerFailed as exc:  # a broken compiler set-up: say how to train without
        raise RuntimeError("compiling the decoder layers for training failed (inductor: see the cause above); "
                           "train them eager with --set model.cpu_compile=false") from exc
    finally:
        for layer in layers:
            layer._compiled_call_impl = None
