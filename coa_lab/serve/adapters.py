"""LoRA adapters loaded onto `coa-lab serve`'s model at runtime (POST /v1/load_lora_adapter),
and switched around each batch by the engine thread (coa_lab/serve/batching.py)."""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path


class LoraAdapters:
    """LoRA adapters loaded at runtime onto the served model (peft), by name. A batch decodes
    with one of them active, or with none: the model as served (a model served with --adapter
    keeps that adapter, peft's "default", for requests that name the served model).

    The first runtime adapter wraps the plain model in a PeftModel; removing the last one
    unwraps it again. Only the engine thread calls these."""

    def __init__(self, generator):
        self.generator = generator
        self.paths: dict[str, str] = {}  # name -> folder
        model = getattr(generator, "model", None)
        self.served_adapter = model.active_adapter if _is_peft(model) else None

    def load(self, name: str, path: str) -> None:
        from peft import PeftConfig, PeftModel

        if name in self.paths:
            raise AdapterAlreadyLoaded(name)
        if not any((Path(path) / f).is_file() for f in ("adapter_model.safetensors", "adapter_model.bin")):
            raise FileNotFoundError(f"{path} holds no adapter weights (adapter_model.safetensors or .bin)")
        model = self.generator.model
        if _is_peft(model):
            try:
                model.load_adapter(path, adapter_name=name)
            except Exception:
                if name in model.peft_config:
                    model.delete_adapter(name)
                raise
        else:
            config = PeftConfig.from_pretrained(path)
            config.inference_mode = True
            wrapped = PeftModel(model, config, adapter_name=name)
            try:
                wrapped.load_adapter(path, adapter_name=name)
            except Exception:
                wrapped.unload()  # takes the injected LoRA layers out of the model again
                raise
            wrapped.eval()
            self.generator.model = wrapped
        self.paths[name] = path

    def unload(self, name: str) -> None:
        if name not in self.paths:
            raise KeyError(name)
        model = self.generator.model
        del self.paths[name]
        if not self.paths and self.served_adapter is None:
            self.generator.model = model.unload()  # the last one: back to the plain model
        else:
            with warnings.catch_warnings():  # "adapter X was active which is now deleted": each batch sets its own
                warnings.simplefilter("ignore")
                model.delete_adapter(name)

    @contextlib.contextmanager
    def active(self, name: str | None):
        model = getattr(self.generator, "model", None)
        if name is not None and name not in self.paths:
            raise RuntimeError(f"the LoRA adapter {name!r} was unloaded before its batch ran")
        if not _is_peft(model):
            yield
            return
        target = name or self.served_adapter
        if target is None:
            with model.disable_adapter():
                yield
        else:
            model.set_adapter(target)
            yield


def _is_peft(model) -> bool:
    return model is not None and hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


class AdapterAlreadyLoaded(Exception):
    pass

