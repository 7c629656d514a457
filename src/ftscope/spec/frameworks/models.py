"""The model a framework config names (an HF id, a torchtune builder), as a `model:` value ftscope can load."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from ... import catalog
from ..resolve import name_words, preset_by_name

SAME_ARCHITECTURE = {
    "llama-3-8b": "llama-3.1-8b", "meta-llama/meta-llama-3-8b": "llama-3.1-8b",
    "llama-3-70b": "llama-3.1-70b", "meta-llama/meta-llama-3-70b": "llama-3.1-70b",
    "meta-llama/llama-2-7b": "llama-2-7b", "meta-llama/llama-2-70b-chat-hf": "llama-2-70b",
    "decapoda-research/llama-7b-hf": "llama-2-7b", "decapoda-research/llama-13b-hf": "llama-2-13b",
    "mistralai/mistral-7b-v0.2": "mistral-7b",
}
"""Models whose blocks equal a preset's (only context length or RoPE settings differ, which change neither memory
per token nor FLOPs): Llama 3 = Llama 3.1 at 8k context, LLaMA-1 = Llama 2 at 2k, Mistral v0.2 = v0.1 without the
sliding window."""


@lru_cache(maxsize=None)
def _same_architecture_words() -> dict[tuple[str, ...], str]:
    return {name_words(k): v for k, v in SAME_ARCHITECTURE.items()}


PREQUANTIZED = re.compile(r"[-_.](awq|gptq|aqlm|gguf|exl2|hqq|eetq)([-_.]|$)", re.I)
"""Checkpoints stored in a quantization format other than bitsandbytes NF4 (named so by convention)."""


def prequantized(name: str) -> str | None:
    """The quantization scheme a model id says its weights are stored in (AWQ, GPTQ, ...), else None."""
    found = PREQUANTIZED.search(str(name))
    return found.group(1).upper() if found else None


def model_ref(name: str) -> tuple[str, str]:
    """(the `model:` value, a note saying what was assumed, or ''). A preset, a path, or a fine-tuned variant the
    scenario's model resolution matches by name (spec/resolve.py, which says so itself) is passed on as it is; a
    model whose blocks equal a preset's under another name (Meta-Llama-3-8B -> llama-3.1-8b) is read as that preset
    and the note says so; anything else is passed on for the scenario loader to find or reject."""
    name = str(name).strip()
    if catalog.resolve_model_name(name) or Path(name).expanduser().exists() or preset_by_name(name):
        return name, ""
    found = _same_architecture_words().get(name_words(name))
    if found and catalog.resolve_model_name(found):
        return found, f"model {name}: read as preset {found} (the same blocks; context length, RoPE or the chat tuning differ)"
    return name, ""


_TORCHTUNE_FAMILY = {"llama3_1": "llama-3.1", "llama3_2": "llama-3.2", "llama3_3": "llama-3.3", "llama3": "llama-3",
                     "llama2": "llama-2", "qwen2_5": "qwen2.5", "qwen3": "qwen3", "mistral": "mistral",
                     "gemma2": "gemma-2"}
_TORCHTUNE_SUFFIX = {"qwen2_5": "_base"}  # torchtune builds qwen2_5_7b_base / _instruct, not qwen2_5_7b


def torchtune_model(component: str) -> tuple[str, str, str]:
    """(method, model name, builder) from a torchtune model builder path, e.g.
    torchtune.models.llama3_1.qlora_llama3_1_8b -> (qlora, llama-3.1-8b, llama3_1_8b)."""
    builder = component.rsplit(".", 1)[-1]
    method = "full"
    for prefix in ("qlora_", "lora_"):
        if builder.startswith(prefix):
            method, builder = prefix[:-1], builder[len(prefix):]
    family = torchtune_family(builder)
    if family:
        size = builder[len(family) + 1:].split("_")[0]
        return method, f"{_TORCHTUNE_FAMILY[family]}-{size}", builder
    return method, builder, builder


def torchtune_family(builder: str) -> str | None:
    """The torchtune model package of a builder: llama3_1_8b -> llama3_1, llama3_8b -> llama3."""
    for family in sorted(_TORCHTUNE_FAMILY, key=len, reverse=True):
        if builder.startswith(family + "_"):
            return family
    return None


def torchtune_builder(preset: str) -> str | None:
    """The torchtune model builder (without the lora_ / qlora_ prefix) of a preset, e.g. llama-3.1-8b -> llama3_1_8b;
    None when torchtune has no builder for its family."""
    reverse = {v: k for k, v in _TORCHTUNE_FAMILY.items() if k != "llama3"}
    found = re.match(r"^(.*)-(\d+(?:\.\d+)?b)$", preset)
    if not found or found.group(1) not in reverse:
        return None
    family = reverse[found.group(1)]
    return f"{family}_{found.group(2).replace('.', '_')}{_TORCHTUNE_SUFFIX.get(family, '')}"
