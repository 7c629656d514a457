"""Which model a reference names, and how it was matched.

In order: a preset name, alias or HF id (`ftscope models`); a config.json or model folder; an HF id whose model
folder is in the local HF cache (no network); otherwise the name rule, for fine-tuned variants of a preset
whose config is not at hand. A config that is present is always what gets counted; when its layout equals a
preset's, the resolution says so (the config fingerprint). The name rule lowercases the name after the org,
drops variant words (VARIANT_WORDS: -Instruct, -it, -chat, -hf, -Base, quantization tags, ...), and takes the
preset whose name, alias or HF name is what remains, or else the one whose name, alias or HF name (two words at
least) occurs in it as consecutive words, when only one preset's do: `meta-llama/Llama-3.1-8B-Instruct` and
`NousResearch/Hermes-3-Llama-3.1-8B` -> llama-3.1-8b, `mistralai/Mistral-7B-Instruct-v0.3` -> mistral-7b-v0.3.
"""
from __future__ import annotations

import logging
import re
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from .. import catalog
from ..errors import FtscopeError, did_you_mean
from ..files import check_path, os_error, parse_json, read_text, show
from .architecture import normalize
from .layout import build
from .model import ModelSpec, hf_hub_cache

log = logging.getLogger("ftscope")

# Words that name a training stage, a chat template or a weight format, not an architecture.
VARIANT_WORDS = frozenset({
    "instruct", "it", "chat", "hf", "base", "pt", "sft", "dpo", "orpo", "kto", "rlhf", "grpo", "preview",
    "fp8", "bf16", "fp16", "awq", "gptq", "gguf", "bnb", "4bit", "8bit", "int4", "int8", "mlx", "unsloth",
})


def name_words(ref: str) -> tuple[str, ...]:
    """The words of a model name (after its org) that the name rule compares: lowercased, variant words dropped."""
    name = str(ref).strip().rstrip("/").rsplit("/", 1)[-1].lower()
    return tuple(w for w in re.split(r"[-_\s]+", name) if w and w not in VARIANT_WORDS)


@lru_cache(maxsize=None)
def _name_keys() -> dict[tuple[str, ...], str]:
    """Name-rule key -> preset, from every preset's name, aliases and HF id; keys two presets share are dropped."""
    keys: dict[tuple[str, ...], set[str]] = {}
    for preset, entry in catalog.model_index().items():
        for ref in (preset, entry.get("hf_id") or "", *(entry.get("aliases") or [])):
            words = name_words(str(ref))
            if words:
                keys.setdefault(words, set()).add(preset)
    return {k: next(iter(v)) for k, v in keys.items() if len(v) == 1}


def preset_by_name(ref: str) -> str | None:
    """The preset the name rule maps a reference to, or None (no match, or words of two presets in it)."""
    words = name_words(ref)
    keys = _name_keys()
    if words in keys:
        return keys[words]
    found = {preset for key, preset in keys.items() if len(key) >= 2
             and any(words[i:i + len(key)] == key for i in range(len(words) - len(key) + 1))}
    return found.pop() if len(found) == 1 else None


def fingerprint(model: ModelSpec) -> tuple[Any, ...]:
    """What makes two configs the same architecture for ftscope: every weight matrix, norm and embedding."""
    return (model.arch.model_type, model.embedding_params, model.lm_head_params, model.final_norm_params,
            model.vision_params, model.layer_groups)


@lru_cache(maxsize=None)
def _preset_fingerprints() -> dict[tuple[Any, ...], tuple[str, ...]]:
    table: dict[tuple[Any, ...], list[str]] = {}
    for preset in catalog.model_index():
        table.setdefault(fingerprint(_preset(preset)), []).append(preset)
    return {k: tuple(v) for k, v in table.items()}


def presets_like(model: ModelSpec) -> tuple[str, ...]:
    """Presets whose architecture equals this model's (same weight matrices, norms and embeddings)."""
    return _preset_fingerprints().get(fingerprint(model), ())


@lru_cache(maxsize=None)
def _preset(preset: str) -> ModelSpec:
    entry = catalog.model_index()[preset]
    return build(normalize(catalog.model_config(preset)), preset, entry.get("source", ""))


def read_config(path: Path) -> tuple[dict[str, Any], str]:
    """(a config.json's (or a model folder's) dict, how errors name it); one-line errors for missing, unreadable,
    oversized or malformed files (files.py's budgets)."""
    try:
        if path.is_dir():
            path = path / "config.json"
        exists = path.exists()
    except OSError as exc:
        raise os_error(exc, "model path", path) from None
    where = f"config.json at {show(path)}"
    if not exists:
        raise FtscopeError(f"no config.json at {show(path)}")
    return parse_json(read_text(path, "config.json"), where), where


def hf_cache_folder(hf_id: str) -> Path | None:
    """The model folder of an HF id in the local HF cache (no network): the snapshot refs/main names, else any."""
    repo = hf_hub_cache() / ("models--" + hf_id.strip("/").replace("/", "--"))
    snapshots = repo / "snapshots"
    try:
        if not snapshots.is_dir():
            return None
        main = repo / "refs" / "main"
        named = [snapshots / main.read_text().strip()] if main.is_file() else []
        for snap in named + sorted(snapshots.iterdir(), reverse=True):
            if (snap / "config.json").is_file():
                return snap
    except (OSError, ValueError) as exc:  # ValueError: a refs/main naming no valid path
        if isinstance(exc, OSError):
            raise os_error(exc, "HF cache folder", snapshots) from None
    return None


def _from_config(cfg: dict[str, Any], where: str, name: str, source: str) -> ModelSpec:
    model = build(normalize(cfg, where), name, source)
    like = presets_like(model)
    if not like:
        return model
    note = f"{name}: its config.json has the architecture of preset {', '.join(like)} (same weights, by fingerprint)"
    log.info(note)
    return replace(model, resolution=note)


def _unknown(ref: str) -> FtscopeError:
    names = list(catalog.model_index())
    hf_ref = ref if re.fullmatch(r"[\w.-]+/[\w.-]+", ref) else "ORG/NAME"
    return FtscopeError(
        f"unknown model '{show(ref)}'{did_you_mean(ref, names)}: give a preset (ftscope models), a config.json or model "
        f"folder, or an HF id in the local HF cache; to get just its config: "
        f"`hf download {hf_ref} config.json --local-dir DIR` (or `huggingface-cli download {hf_ref} config.json "
        f"--local-dir DIR`), then `model: DIR/config.json`")


@lru_cache(maxsize=256)
def resolve_model(ref: str) -> ModelSpec:
    """The ModelSpec a model reference names (see the module docstring for the order and the name rule)."""
    ref = ref.strip()
    preset = catalog.resolve_model_name(ref)
    if preset is not None:
        return _preset(preset)
    check_path(ref, "model")
    try:
        path = Path(ref).expanduser()
    except RuntimeError:  # '~user' for a user that does not exist
        raise FtscopeError(f"cannot resolve the home directory in model path '{show(ref)}'") from None
    try:
        exists = path.exists()
    except OSError as exc:
        raise os_error(exc, "model path", ref) from None
    if exists or ref.endswith(".json"):
        return _from_config(*read_config(path), str(path), str(path.resolve()))
    if "/" in ref:
        folder = hf_cache_folder(ref)
        if folder is not None:
            return _from_config(*read_config(folder), ref, str(folder))
    # a path that does not exist is a typo, not a model name to guess from
    preset = preset_by_name(ref) if re.fullmatch(r"[\w][\w.-]*(/[\w.-]+)?", ref) else None
    if preset is None:
        raise _unknown(ref)
    hf_id = catalog.model_index()[preset].get("hf_id", preset)
    note = (f"{ref}: no config.json here; by name a variant of preset {preset} ({hf_id}), counted as that "
            f"preset (give its config.json for an exact count)")
    log.info(note)
    return replace(_preset(preset), resolution=note)


def load_model(ref: str) -> ModelSpec:
    """A ModelSpec from a preset name, an HF id (a preset alias, a model folder in the local HF cache, or a
    fine-tuned variant of a preset by the name rule), a config.json or a model folder."""
    return resolve_model(str(ref))


def model_from_config(cfg: dict[str, Any], name: str = "custom", where: str = "config.json") -> ModelSpec:
    """A ModelSpec straight from a config dict (an inline `model:` mapping, `--shrink`, stores, tests)."""
    return build(normalize(cfg, where), name)
