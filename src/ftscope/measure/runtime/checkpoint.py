"""A local checkpoint for a measurement: which Auto class loads a config, whether a folder holds the scenario's model,
and its load (local files only, one-line errors)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import FtscopeError
from .configs import text_config

WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")
CONFIG_MATCH = ("hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size", "num_attention_heads")


def check_weights(weights: str | Path, cfg: dict[str, Any], shrink: dict[str, Any] | None, device: str) -> Path:
    """A local Hugging Face model folder whose config matches the scenario's model (one-line errors)."""
    folder = Path(weights).expanduser()
    if device == "meta":
        raise FtscopeError("--weights: trace needs no weights (it allocates nothing); drop --weights")
    if shrink:
        raise FtscopeError("--weights and --shrink cannot be combined: shrinking changes every weight's shape")
    if not folder.is_dir():
        raise FtscopeError(f"--weights: {folder} is not a folder (a local Hugging Face model: config.json + *.safetensors)")
    if not any(any(folder.glob(pattern)) for pattern in WEIGHT_FILES):
        raise FtscopeError(f"--weights: no *.safetensors or pytorch_model*.bin in {folder}")
    try:
        theirs = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        raise FtscopeError(f"--weights: {folder} has no config.json") from None
    except json.JSONDecodeError as exc:
        raise FtscopeError(f"--weights: {folder / 'config.json'} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    ours_text, theirs_text = text_config(cfg), text_config(theirs)
    for key in CONFIG_MATCH:
        if key in ours_text and key in theirs_text and ours_text[key] != theirs_text[key]:
            raise FtscopeError(f"--weights: {folder} holds a different model than the scenario's ({key} "
                               f"{theirs_text[key]} there, {ours_text[key]} in the scenario; point `model:` at "
                               f"{folder / 'config.json'})")
    return folder


def auto_model_class(transformers: Any, hf_cfg: Any, cfg: dict[str, Any]) -> Any:
    """The Auto class a fine-tuning load uses: AutoModelForCausalLM, else, for a multimodal wrapper it refuses
    (Mistral3Config), AutoModelForImageTextToText, the Auto class transformers' Mistral 3 docs load it with
    (spec/families.py WRAPPERS). Such a wrapper's lm_head is tied as its text config says when the file states no flag: the published
    Mistral 3 checkpoints hold both matrices and from_pretrained keeps them apart, which Mistral3Config's own default
    (tied) would not build from the config alone."""
    if type(hf_cfg) in transformers.AutoModelForCausalLM._model_mapping:
        return transformers.AutoModelForCausalLM
    if "tie_word_embeddings" not in cfg and hasattr(hf_cfg, "text_config"):
        hf_cfg.tie_word_embeddings = hf_cfg.get_text_config().tie_word_embeddings
    return transformers.AutoModelForImageTextToText


def from_pretrained(folder: Path, hf_cfg: Any, dtype: Any, device: str, kwargs: dict[str, Any],
                    auto: Any) -> Any:
    """auto.from_pretrained of a local folder (never a download); a load error is one line."""
    try:
        return auto.from_pretrained(
            str(folder), config=hf_cfg, dtype=dtype, device_map=device if device.startswith("cuda") else None,
            local_files_only=True, **kwargs)
    except (OSError, RuntimeError) as exc:
        raise FtscopeError(f"--weights: transformers cannot load {folder}: {str(exc).splitlines()[0][:300]}") from None
