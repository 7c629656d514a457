"""What a live training run is, read off its model and device: the config as built, PEFT's LoRA, a bitsandbytes
base, the weights' dtypes, checkpointing, the attention and experts implementations, the GPU in the catalog.

Every function takes the objects the training loop already holds (a transformers model, possibly inside a
PeftModel; a torch device string); torch is imported only when a function needs it.
"""
from __future__ import annotations

import os
import re
from collections import Counter
from typing import Any

from .. import catalog
from ..errors import FtscopeError
from ..spec.architecture import ALIASES
from .run_config import RunConfig, lora_settings, model_name


def base_model(model: Any) -> Any:
    """The transformers model inside a PeftModel (or the model itself)."""
    getter = getattr(model, "get_base_model", None)
    return getter() if callable(getter) else model


def find_hf_model(module: Any) -> Any | None:
    """The transformers model a training module holds: itself, or the first submodule with an HF config (a
    LightningModule's `self.model`); None when there is none."""
    if getattr(getattr(module, "config", None), "model_type", None) is not None:
        return module
    for child in getattr(module, "modules", lambda: [])():
        if child is not module and getattr(getattr(child, "config", None), "model_type", None) is not None:
            return child
    return None


def _lora(model: Any) -> dict[str, Any] | None:
    configs = getattr(model, "peft_config", None)
    if not configs:
        return None
    active = getattr(model, "active_adapter", None)
    name = active[0] if isinstance(active, (list, tuple)) and active else active
    config = configs.get(name) if isinstance(name, str) and name in configs else next(iter(configs.values()))
    inner = getattr(model, "base_model", None)
    targeted = getattr(inner, "targeted_module_names", None) or getattr(model, "targeted_module_names", None)
    return lora_settings(config, list(targeted) if targeted else None)


def quantization(model: Any) -> str | None:
    """'4bit' or '8bit' when bitsandbytes layers hold the base weights, else None."""
    kinds = {type(m).__name__ for m in model.modules()}
    if kinds & {"Linear4bit", "Params4bit"}:
        return "4bit"
    if "Linear8bitLt" in kinds:
        return "8bit"
    return None


def _main_dtype(params: list[Any]) -> str | None:
    """The dtype holding most of these parameters' elements (floating point only)."""
    counts: Counter[str] = Counter()
    for p in params:
        if p.is_floating_point():
            counts[str(p.dtype).removeprefix("torch.")] += p.numel()
    return counts.most_common(1)[0][0] if counts else None


def catalog_gpu(name: str) -> tuple[str | None, str]:
    """(catalog key, note) of a GPU as torch names it ('NVIDIA H100 80GB HBM3', 'Tesla T4'), read against the
    catalog's names and aliases; (None, why) for a GPU the catalog does not have."""
    word = re.sub(r"^(nvidia|amd)\s+", "", name.strip().lower()).replace(" ", "-")
    try:
        return catalog.resolve_gpu_name(word), ""
    except FtscopeError:
        return None, f"GPU '{name}' is not in ftscope's catalog: pass gpu= to the callback"


def gpu_key(device: str) -> tuple[str | None, str]:
    """catalog_gpu of the CUDA device the run is on; (None, '') off CUDA."""
    if not device.startswith("cuda"):
        return None, ""
    import torch

    return catalog_gpu(torch.cuda.get_device_name(torch.device(device)))


def world() -> tuple[int, int]:
    """(processes in the run, processes on this node), from the launcher's environment (torchrun, accelerate)."""
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    return size, int(os.environ.get("LOCAL_WORLD_SIZE", str(size)) or size)


def run_config(model: Any, training_args: dict[str, Any], framework: str = "hf-trainer",
               gpu: str | None = None) -> RunConfig:
    """The run's RunConfig from its model (a transformers model or a PeftModel) and its TrainingArguments keys."""
    base = base_model(model)
    config = base.config
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    frozen = [p for p in params if not p.requires_grad]
    lora = _lora(model)
    size, per_node = world()
    # what transformers' is_activation_checkpointing reads (4.x names it is_gradient_checkpointing)
    checkpointing = any(getattr(m, "gradient_checkpointing", False) is True for m in base.modules()) or any(
        training_args.get(k) is True for k in ("activation_checkpointing", "gradient_checkpointing"))
    text = config.to_dict()
    moe = any(int(text.get(k) or 0) > 1 for k in ALIASES["num_experts"])
    return RunConfig(
        model_config=text, model_name=model_name(text), training_args=training_args,
        framework=framework, lora=lora, quantization=quantization(model),
        trainable_dtype=_main_dtype(trainable), frozen_dtype=_main_dtype(frozen),
        hand_frozen=lora is None and bool(frozen) and bool(trainable), gradient_checkpointing=checkpointing,
        attention=getattr(config, "_attn_implementation", None),
        experts_implementation=getattr(config, "_experts_implementation", None) if moe else None,
        gpu=gpu, world_size=size, gpus_per_node=per_node)


__all__ = ["base_model", "catalog_gpu", "find_hf_model", "gpu_key", "quantization", "run_config", "world"]
