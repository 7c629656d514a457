"""The page's scenario: `key.path=value` pairs in the URL (the CLI's override syntax), checked like a file.

The share URL and the API's GET requests carry the same pairs, so a scenario the page shows, the YAML it
downloads and the JSON it estimates are one mapping. Keys starting with `_` are page state (the open view),
not scenario keys.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from ..errors import FtscopeError
from ..spec.scenario import Scenario, apply_overrides, load_scenario
from .uploads import Uploads


def from_query(pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """A scenario mapping from URL query pairs: values parsed as YAML scalars, exactly as CLI overrides are."""
    overrides = [f"{key}={value}" for key, value in pairs if key and not key.startswith("_")]
    return apply_overrides({}, overrides)


def check_model_ref(ref: Any, uploads: Uploads) -> str:
    """The model the server may load for a web request: a preset, an HF id (local cache) or an uploaded
    config.json. Paths on the server's disk are the CLI's business: the page must not read arbitrary files."""
    from .. import catalog

    text = str(ref).strip() if ref is not None else ""
    if text.startswith("upload:"):
        return str(uploads.path("config", text))
    if catalog.resolve_model_name(text) is not None:
        return text
    if not text or text.startswith((".", "/", "~")) or text.endswith(".json") or "\\" in text or _exists(text):
        raise FtscopeError("model: give a preset (ftscope models), an HF id in the local cache, or drop a config.json "
                           "on the page (paths on the server are for the CLI)")
    return text  # an HF id is looked up in the local HF cache; anything else gets load_model's "did you mean"


def _exists(text: str) -> bool:
    try:
        return Path(text).exists()
    except (OSError, ValueError):  # a NUL byte, a name too long: not a file anyway
        return False


def resolve(raw: Mapping[str, Any], uploads: Uploads) -> Scenario:
    """A checked Scenario from a web request's mapping (the same checks as `ftscope estimate FILE`)."""
    if not isinstance(raw, Mapping):
        raise FtscopeError("a scenario must be a mapping with model, hardware, mix and workload")
    if "model" not in raw or raw["model"] in (None, ""):
        return load_scenario(dict(raw))  # the CLI's own message for a missing model
    return load_scenario({**raw, "model": check_model_ref(raw["model"], uploads)})


def scenario_yaml(raw: Mapping[str, Any]) -> str:
    """The scenario as a YAML file `ftscope estimate` reads (an uploaded config becomes config.json beside it)."""
    data = dict(raw)
    lines = ["# ftscope scenario, written by `ftscope serve`: run `ftscope estimate THIS_FILE`"]
    if str(data.get("model", "")).startswith("upload:"):
        lines.append("# model: the config.json you dropped on the page; keep it beside this file")
        data["model"] = "config.json"
    return "\n".join(lines) + "\n" + yaml.safe_dump(data, sort_keys=False)
