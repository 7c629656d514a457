"""The values each control of the page may take, read from the sources the CLI validates against.

Everything the page offers comes from here, so a value the page shows is a value `load_scenario` accepts.
The mix keys' values are read from Mix's `Literal` field types (`spec.schema.choices`); `allowed()` reads a tuple
of values or a `typing.Literal`.
"""
from __future__ import annotations

import typing
from typing import Any

from .. import catalog
from ..spec.mix import Mix
from ..spec.model import hf_hub_cache
from ..spec.resolve import load_model
from ..spec.schema import choices
from ..spec.workload import Workload

MIX_CHOICE_KEYS = ("method", "attention", "offload", "precision", "optimizer", "experts_backend", "loss", "zero_stage")
LORA_TARGET_GROUPS = ("all-linear", "attention", "mlp")
"""The named target groups ModelSpec.lora_targets knows (module names may be typed instead)."""


def allowed(source: Any) -> list[Any]:
    """The values of a tuple of choices or of a Literal type, in their declared order."""
    if isinstance(source, (tuple, list, frozenset, set)):
        return list(source)
    args = typing.get_args(source)
    if args:  # Literal["a", "b"], or Optional[Literal[...]] whose None is a choice too
        return [v for a in args for v in (allowed(a) if typing.get_args(a) else [None if a is type(None) else a])]
    raise TypeError(f"not a set of choices: {source!r}")


def mix_choices() -> dict[str, list[Any]]:
    """`mix.<key>` -> the values its select offers (None = not set, e.g. no FSDP): the Literal field types of Mix,
    the one source the CLI's checks read too."""
    out: dict[str, list[Any]] = {key: list(choices(Mix, key)) for key in MIX_CHOICE_KEYS}
    out["fsdp"] = [None, *choices(Mix, "fsdp")]
    out["lora_targets"] = list(LORA_TARGET_GROUPS)
    return out


def gpu_choices() -> list[dict[str, Any]]:
    """Catalog GPUs with what the select shows: memory and whether the catalog has a price for it."""
    return [{"key": key, "name": e.get("name", key), "memory_gib": round(e["memory_mib"] / 1024, 1),
             "priced": bool(catalog.prices_for(key))}
            for key, e in catalog.gpu_table().items()]


def model_choices() -> list[dict[str, Any]]:
    """Bundled presets with their HF ids (the search box matches either) and whether they are MoE."""
    return [{"name": name, "hf_id": entry.get("hf_id") or "", "moe": load_model(name).is_moe}
            for name, entry in catalog.model_index().items()]


def cached_models() -> list[str]:
    """HF ids with a config.json in the local HF cache (what `model: owner/name` finds without a network)."""
    root = hf_hub_cache()
    if not root.is_dir():
        return []
    return sorted(d.name[len("models--"):].replace("--", "/") for d in root.glob("models--*")
                  if any((snap / "config.json").is_file() for snap in (d / "snapshots").glob("*")))


def page_choices() -> dict[str, Any]:
    """Everything the page's controls need, in one JSON object (GET /api/choices)."""
    return {"mix": mix_choices(), "workload": {"padding": list(choices(Workload, "padding"))},
            "gpus": gpu_choices(), "models": model_choices(), "cached": cached_models()}
