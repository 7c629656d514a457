"""Fine-tuning frameworks' own config files as ftscope scenarios.

`read_config(path)` detects an Axolotl YAML, a LLaMA-Factory train YAML, a torchtune recipe config or a TRL
SFTConfig / TrainingArguments JSON, `trl sft --config` YAML or command-line file, and maps it to a scenario mapping
with `framework:` set; keys that may change memory or time but are not mapped are listed, never dropped, and a
feature ftscope cannot express is a one-line FtscopeError naming its key. An ftscope scenario reads as None.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ...errors import FtscopeError
from ...files import parse_json, parse_yaml, read_text
from . import axolotl, llama_factory, torchtune, trl
from .base import FORMATS, FrameworkConfig

__all__ = ["FORMATS", "FrameworkConfig", "detect", "load", "read_config", "scenario_mapping"]

if TYPE_CHECKING:
    from ..scenario import Scenario

_READERS = {"axolotl": axolotl.read, "llama-factory": llama_factory.read, "torchtune": torchtune.read, "trl": trl.read}
_TRAINER_KEYS = {"per_device_train_batch_size", "output_dir", "gradient_accumulation_steps", "num_train_epochs"}


def detect(data: Any) -> str | None:
    """The framework format of a parsed config (a mapping, or the text of a command line); None for an ftscope
    scenario or anything unrecognised."""
    if isinstance(data, str):
        return "trl" if "--" in data else None
    if not isinstance(data, Mapping):
        return None
    if "base_model" in data:
        return "axolotl"
    if isinstance(data.get("model"), Mapping) and "_component_" in data["model"]:
        return "torchtune"
    if "model" in data:
        return None
    if "model_name_or_path" in data and llama_factory.DETECT_KEYS & set(data):
        return "llama-factory"
    if "model_name_or_path" in data or _TRAINER_KEYS & set(data) or trl.SFT_KEYS & set(data):
        return "trl"
    return None


def _parse(path: Path) -> Any:
    """The file parsed under files.py's budgets (size, depth, aliases); None when it does not parse, so that the
    scenario reader reports the problem."""
    text = read_text(path, "scenario file")
    try:
        data = parse_json(text, str(path)) if path.suffix == ".json" else parse_yaml(text, str(path))
    except FtscopeError:
        data = None
    if isinstance(data, Mapping):
        return dict(data)
    return text if "--" in text else data


def read_config(path: str | Path) -> FrameworkConfig | None:
    """The framework config at `path`, mapped to a scenario; None when the file is not one (an ftscope scenario)."""
    p = Path(path)
    try:
        if not p.is_file():
            return None
    except (OSError, ValueError):  # a name no file system could hold: the scenario reader says so
        return None
    data = _parse(p)
    fmt = detect(data)
    if fmt is None:
        return None
    original = trl.parse_command(data) if isinstance(data, str) else data
    cfg = FrameworkConfig(format=fmt, path=p, original=dict(original))
    _READERS[fmt](dict(original), cfg)
    return cfg


def scenario_mapping(cfg: FrameworkConfig, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The mapped scenario with `key.path=value` overrides applied; what is still missing is said in the
    framework's own terms, and what the mapping assumed about hardware joins the notes."""
    from ..scenario import apply_overrides

    raw = apply_overrides(cfg.scenario, overrides) if overrides else json.loads(json.dumps(cfg.scenario))
    if not raw.get("model"):
        raise FtscopeError(f"{cfg.path.name} ({cfg.format}) names no model: add model=<preset | HF id | config.json>")
    wl = raw.get("workload") or {}
    if wl.get("seq_len") is None and wl.get("dataset") is None:
        raise FtscopeError(f"{cfg.path.name} ({cfg.format}) sets no sequence length: add workload.seq_len=N")
    hw = raw.get("hardware") or {}
    mix = raw.setdefault("mix", {})
    if cfg.multi_gpu_mix and int(hw.get("gpus_per_node", 1)) * int(hw.get("nodes", 1)) > 1 \
            and not {"fsdp", "zero_stage", "offload"} & set(mix):
        mix.update(cfg.multi_gpu_mix)
        cfg.notes.append(f"more than one GPU: {cfg.format}'s distributed recipe, " + ", ".join(
            f"{k} {v}" for k, v in cfg.multi_gpu_mix.items()))
    if wl.get("num_samples") is None and wl.get("dataset") is None:
        cfg.notes.append("run length: the dataset's size is unknown here; 10,000 samples per epoch assumed "
                         "(add workload.num_samples=N)")
    if not hw.get("gpu"):
        cfg.notes.append("hardware.gpu: a framework config names no GPU; a100-80gb assumed (add hardware.gpu=...)")
    return raw


def load(path: str | Path, overrides: Sequence[str] = ()) -> tuple["Scenario", FrameworkConfig | None]:
    """The scenario of a scenario file or of a framework config (with the config, for its warnings and notes)."""
    from ..scenario import load_scenario, scenario_from_dict

    cfg = read_config(path)
    if cfg is None:
        return load_scenario(path, overrides), None
    return scenario_from_dict(scenario_mapping(cfg, overrides)), cfg
