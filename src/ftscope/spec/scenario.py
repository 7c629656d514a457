"""The scenario: one YAML/JSON input every verb takes, with `key.path=value` overrides."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from ..errors import FtscopeError, did_you_mean
from .hardware import Cluster, GpuSpec, gpu_from_catalog, gpu_from_inline
from .mix import Mix, check_mix
from .model import ModelSpec, load_model
from .workload import DatasetStats, Workload, check_workload

SECTIONS = {
    "hardware": {"gpu", "gpus_per_node", "nodes", "inter_node_gbs"},
    "mix": {f.name for f in fields(Mix)},
    "workload": {f.name for f in fields(Workload)},
    "price": {"usd_per_gpu_hour", "provider"},
}
TOP_KEYS = {"model", "name", "description", *SECTIONS}
DATASET_KEYS = {f.name for f in fields(DatasetStats)} | {"path", "tokenizer", "text_field"}


@dataclass(frozen=True)
class Scenario:
    """Model x hardware x mix x workload (x price), resolved and checked."""

    model: ModelSpec
    cluster: Cluster
    mix: Mix
    workload: Workload
    usd_per_gpu_hour: float | None = None
    """Price override; None uses the catalog's cheapest dated price."""
    model_ref: str = ""
    """The `model:` value as given."""
    name: str = ""

    def with_(self, **changes: Any) -> "Scenario":
        """A copy with `mix`/`workload`/`cluster` fields replaced: with_(micro_batch_size=8, zero_stage=2).
        A name that is none of their fields raises TypeError (as dataclasses.replace does), never a silent no-op."""
        mix_f = {k: v for k, v in changes.items() if k in SECTIONS["mix"]}
        wl_f = {k: v for k, v in changes.items() if k in SECTIONS["workload"]}
        cl_f = {k: v for k, v in changes.items() if k in ("gpu", "gpus_per_node", "nodes", "inter_node_gbs")}
        unknown = sorted(set(changes) - set(mix_f) - set(wl_f) - set(cl_f))
        if unknown:
            raise TypeError(f"Scenario.with_: no mix, workload or cluster field named {', '.join(unknown)}")
        new = self
        if mix_f:
            new = replace(new, mix=replace(new.mix, **mix_f))
        if wl_f:
            new = replace(new, workload=replace(new.workload, **wl_f))
        if cl_f:
            new = replace(new, cluster=replace(new.cluster, **cl_f))
        return new

    @property
    def top_k(self) -> int:
        """Experts per token this run uses (0 for dense models)."""
        return (self.mix.experts_top_k or self.model.arch.top_k) if self.model.is_moe else 0

    def to_dict(self) -> dict[str, Any]:
        """The resolved scenario, in the input format (JSON-ready)."""
        mix = asdict(self.mix)
        if isinstance(mix["lora_targets"], tuple):
            mix["lora_targets"] = list(mix["lora_targets"])
        wl = asdict(self.workload)
        gpu = self.cluster.gpu
        return {
            "name": self.name,
            "model": self.model_ref or self.model.name,
            "hardware": {"gpu": gpu.key, "gpus_per_node": self.cluster.gpus_per_node, "nodes": self.cluster.nodes,
                         "inter_node_gbs": self.cluster.inter_node_gbs},
            "mix": mix,
            "workload": wl,
            "price": {"usd_per_gpu_hour": self.usd_per_gpu_hour},
        }


def _check_keys(section: str, data: Mapping[str, Any], allowed: set[str]) -> None:
    for key in data:
        if key not in allowed:
            where = f"{section}.{key}" if section else str(key)
            if not where.isprintable() or len(where) > 60:
                where = repr(where)[:60]
            raise FtscopeError(f"unknown key '{where}'{did_you_mean(str(key), allowed)}")


def _section(raw: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = raw.get(name) or {}
    if not isinstance(value, Mapping):
        raise FtscopeError(f"'{name}' must be a mapping of keys, got {type(value).__name__}")
    _check_keys(name, value, SECTIONS[name])
    return dict(value)


def _int_or(value: Any, key: str) -> Any:
    """YAML gives ints for ints; accept integral floats (4.0) but nothing else."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _dataset(value: Any) -> DatasetStats | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise FtscopeError("workload.dataset must be a mapping (num_samples, mean_tokens, max_tokens, ...)")
    _check_keys("workload.dataset", value, DATASET_KEYS)
    if "path" in value and "mean_tokens" not in value:
        raise FtscopeError("workload.dataset.path is read by `ftscope profile`; for estimates give token statistics "
                           "(num_samples, mean_tokens, median_tokens, p99_tokens, max_tokens)")
    missing = [k for k in ("num_samples", "mean_tokens", "max_tokens") if k not in value]
    if missing:
        raise FtscopeError(f"workload.dataset needs {', '.join(missing)}")
    known = {f.name for f in fields(DatasetStats)}
    return DatasetStats(**{k: _int_or(v, k) for k, v in value.items() if k in known})


def _gpu(value: Any) -> GpuSpec:
    if isinstance(value, str):
        return gpu_from_catalog(value)
    if isinstance(value, Mapping):
        return gpu_from_inline(dict(value))
    raise FtscopeError(f"hardware.gpu must be a catalog name (ftscope gpus) or a mapping; got {value!r}")


def _positive(value: Any, key: str, integer: bool = True, upper: float = 1e6) -> Any:
    value = _int_or(value, key)
    ok = (isinstance(value, int) if integer else isinstance(value, (int, float))) and not isinstance(value, bool)
    if not ok or not 0 < value <= upper or value != value:
        kind = "an integer" if integer else "a number"
        raise FtscopeError(f"{key} must be {kind} from 1 to {upper:g}; got {value!r}" if integer
                           else f"{key} must be {kind} above 0; got {value!r}")
    return value


def scenario_from_dict(raw: Mapping[str, Any]) -> Scenario:
    """Check and resolve a scenario mapping; every problem is a one-line FtscopeError."""
    if not isinstance(raw, Mapping):
        raise FtscopeError("a scenario must be a mapping with model, hardware, mix and workload")
    _check_keys("", raw, TOP_KEYS)
    if "model" not in raw or raw["model"] in (None, ""):
        raise FtscopeError("scenario has no 'model' (a preset from `ftscope models`, an HF id or a config.json path)")
    model = load_model(str(raw["model"]))
    hw = _section(raw, "hardware")
    gpu = _gpu(hw.get("gpu", "a100-80gb"))
    cluster = Cluster(
        gpu=gpu,
        gpus_per_node=_positive(hw.get("gpus_per_node", 1), "hardware.gpus_per_node", upper=64),
        nodes=_positive(hw.get("nodes", 1), "hardware.nodes", upper=4096),
        inter_node_gbs=float(_positive(hw.get("inter_node_gbs", 25.0), "hardware.inter_node_gbs", integer=False)),
    )
    mix_raw = _section(raw, "mix")
    if isinstance(mix_raw.get("lora_targets"), list):
        mix_raw["lora_targets"] = tuple(str(t) for t in mix_raw["lora_targets"])
    for key in ("lora_rank", "zero_stage", "experts_top_k"):
        if key in mix_raw:
            mix_raw[key] = _int_or(mix_raw[key], key)
    if "zero_stage" in mix_raw and mix_raw["zero_stage"] is None:
        mix_raw["zero_stage"] = 0
    if "offload" in mix_raw and mix_raw["offload"] in (None, False):
        mix_raw["offload"] = "none"
    if mix_raw.get("fsdp") in (False, "none", "no"):
        mix_raw["fsdp"] = None
    mix = Mix(**mix_raw)
    check_mix(mix)
    if not (isinstance(mix.lora_targets, (str, tuple)) and mix.lora_targets):
        raise FtscopeError("mix.lora_targets must be all-linear, attention, mlp or a list of module names")
    if mix.trains_lora:
        model.lora_targets(mix.lora_targets)  # raises on names that match nothing
    wl_raw = _section(raw, "workload")
    wl_raw["dataset"] = _dataset(wl_raw.get("dataset"))
    for key in ("micro_batch_size", "seq_len", "gradient_accumulation", "num_samples"):
        if key in wl_raw:
            wl_raw[key] = _int_or(wl_raw[key], key)
    workload = Workload(**wl_raw)
    check_workload(workload)
    if model.is_moe and mix.experts_top_k and mix.experts_top_k > model.arch.num_experts:
        raise FtscopeError(f"mix.experts_top_k ({mix.experts_top_k}) exceeds the model's {model.arch.num_experts} experts")
    if model.is_moe and mix.experts_backend == "grouped_mm" and mix.precision in ("fp32", "fp16-mixed"):
        raise FtscopeError("experts_backend grouped_mm runs in bf16 only; use batched_mm or eager with fp16/fp32")
    if not model.is_moe and mix.experts_top_k:
        raise FtscopeError(f"mix.experts_top_k is for MoE models; {model.name} is dense")
    price = _section(raw, "price")
    usd = price.get("usd_per_gpu_hour")
    if usd is not None:
        usd = float(_positive(usd, "price.usd_per_gpu_hour", integer=False))
    return Scenario(model=model, cluster=cluster, mix=mix, workload=workload, usd_per_gpu_hour=usd,
                    model_ref=str(raw["model"]), name=str(raw.get("name") or ""))


def parse_overrides(pairs: Sequence[str]) -> list[tuple[list[str], Any]]:
    """`mix.zero_stage=3` -> (['mix', 'zero_stage'], 3); values parsed as YAML scalars / lists."""
    out = []
    for pair in pairs:
        if "=" not in pair:
            raise FtscopeError(f"override '{pair}' is not key.path=value")
        key, _, text = pair.partition("=")
        try:
            value = yaml.safe_load(text) if text else None
        except yaml.YAMLError:
            value = text
        out.append((key.strip().split("."), value))
    return out


def apply_overrides(raw: dict[str, Any], pairs: Sequence[str]) -> dict[str, Any]:
    raw = json.loads(json.dumps(raw, default=str))  # deep copy of plain data
    for path, value in parse_overrides(pairs):
        node = raw
        for part in path[:-1]:
            child = node.get(part)
            if child is None or not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[path[-1]] = value
    return raw


def read_scenario_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise FtscopeError(f"scenario file not found: {p}")
    text = p.read_text()
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FtscopeError(f"malformed scenario {p}: {first}") from None
    if not isinstance(data, dict):
        raise FtscopeError(f"scenario {p} must be a mapping with model, hardware, mix and workload")
    return data


def load_scenario(source: str | Path | Mapping[str, Any], overrides: Sequence[str] = ()) -> Scenario:
    """A checked Scenario from a YAML/JSON path or a mapping, with `key.path=value` overrides applied."""
    raw = read_scenario_file(source) if isinstance(source, (str, Path)) else dict(source)
    if overrides:
        raw = apply_overrides(raw, overrides)
    if isinstance(source, (str, Path)) and isinstance(raw.get("model"), str):
        # a relative config path is read beside the scenario file, wherever the command runs from
        beside = Path(source).parent / raw["model"]
        if not Path(raw["model"]).exists() and (beside.is_file() or (beside / "config.json").is_file()):
            raw = {**raw, "model": str(beside)}
    return scenario_from_dict(raw)
