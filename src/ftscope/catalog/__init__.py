"""The bundled data: real HF config.json files, GPU datasheet numbers and dated prices.

Data only; every entry carries its source. Loaded lazily and cached.
"""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from ..errors import unknown
from ..files import _yaml_loader

_ROOT = resources.files(__package__)


def _yaml(name: str) -> Any:
    # libyaml's safe loader parses the catalog 8x faster than the pure-Python one (~0.13 s of every CLI call)
    return yaml.load(_ROOT.joinpath(name).read_text(), Loader=_yaml_loader())


@lru_cache(maxsize=None)
def model_index() -> dict[str, dict[str, Any]]:
    """Bundled model presets: name -> {hf_id, source, family, aliases, config, ...}."""
    return _yaml("models/index.yaml")["models"]


@lru_cache(maxsize=None)
def _model_lookup() -> dict[str, str]:
    table: dict[str, str] = {}
    for name, entry in model_index().items():
        table[name.lower()] = name
        for alias in entry.get("aliases", []) or []:
            table[str(alias).lower()] = name
        if entry.get("hf_id"):
            table[entry["hf_id"].lower()] = name
    return table


def resolve_model_name(name: str) -> str | None:
    """The preset name for a preset name, alias or HF id (case-insensitive), else None."""
    return _model_lookup().get(str(name).lower())


@lru_cache(maxsize=None)
def model_config(name: str) -> dict[str, Any]:
    """The bundled HF config.json of a preset (a fresh dict each call is not needed: treat as read-only)."""
    preset = resolve_model_name(name)
    if preset is None:
        raise unknown("model", name, model_index().keys())
    entry = model_index()[preset]
    text = _ROOT.joinpath("models", entry.get("config", f"{preset}.json")).read_text()
    return json.loads(text)


@lru_cache(maxsize=None)
def gpu_table() -> dict[str, dict[str, Any]]:
    return _yaml("gpus.yaml")["gpus"]


@lru_cache(maxsize=None)
def _gpu_lookup() -> dict[str, str]:
    table: dict[str, str] = {}
    for key, entry in gpu_table().items():
        table[key.lower()] = key
        for alias in entry.get("aliases", []) or []:
            table[str(alias).lower()] = key
        if entry.get("name"):
            table[str(entry["name"]).lower()] = key
    return table


def resolve_gpu_name(name: str) -> str:
    key = _gpu_lookup().get(str(name).lower().strip())
    if key is None:
        raise unknown("GPU", name, gpu_table().keys())
    return key


@lru_cache(maxsize=None)
def price_list() -> list[dict[str, Any]]:
    return _yaml("prices.yaml")["prices"]


@lru_cache(maxsize=None)
def prices_for(gpu_key: str) -> tuple[dict[str, Any], ...]:
    """Each provider's newest dated price for one GPU, cheapest first."""
    newest: dict[str, dict[str, Any]] = {}
    for p in price_list():
        if p["gpu"] == gpu_key:
            seen = newest.get(p["provider"])
            if seen is None or str(p["date"]) > str(seen["date"]):
                newest[p["provider"]] = p
    return tuple(sorted(newest.values(), key=lambda p: p["usd_per_gpu_hour"]))


@lru_cache(maxsize=None)
def recipe_names() -> tuple[str, ...]:
    """Bundled framework recipes (catalog/recipes/<name>.yaml)."""
    return tuple(sorted(p.name[:-5] for p in _ROOT.joinpath("recipes").iterdir() if p.name.endswith(".yaml")))


@lru_cache(maxsize=None)
def recipe_data(name: str) -> dict[str, Any]:
    """One framework recipe's mapping (see spec/recipe.py for its fields)."""
    return _yaml(f"recipes/{name}.yaml")


@lru_cache(maxsize=None)
def framework_keys() -> dict[str, Any]:
    """How each framework format's config keys are read (see catalog/framework_keys.yaml)."""
    return _yaml("framework_keys.yaml")
