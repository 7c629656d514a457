"""The scenario: one YAML/JSON input every verb takes, with `key.path=value` overrides.

`ScenarioInput` is the file's shape: every key typed (the section types are `Hardware`, `Mix`, `Workload`),
so one `validate` call checks types, ranges and unknown keys; the rules across keys run after it
(`rules.py`, `check_workload`); then the model and GPU are resolved into a `Scenario`.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Mapping, Sequence

from pydantic import BeforeValidator, Field

from ..errors import FtscopeError
from ..files import MAX_DEPTH, load_structured, parse_yaml
from .hardware import Cluster, Hardware
from .mix import Mix
from .model import ModelSpec
from .resolve import load_model, model_from_config
from .recipe import DEFAULT_FRAMEWORK, Recipe, load_recipe
from .rules import check_layout, mix_problem, model_problem
from .schema import Number, Text, forbid_extra, validate
from .workload import Workload, check_workload

PROFILE_DATASET_KEYS = ("path", "tokenizer", "text_field")
"""workload.dataset keys `ftscope profile` reads; estimates need the token statistics."""


def _scalar_text(value: Any) -> Any:
    """A scenario's name may be a number in YAML (name: 2024); it is text all the same."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


Label = Annotated[Text(max_length=4096), BeforeValidator(_scalar_text)]


@forbid_extra
@dataclass(frozen=True)
class Price:
    """The scenario's `price:` keys."""

    usd_per_gpu_hour: Number(gt=0, le=10_000) | None = None
    """US dollars per GPU-hour, instead of the catalog's cheapest dated price (null: the catalog's)."""
    provider: Label | None = None
    """The provider the price is from (a label)."""


ModelRef = Annotated[
    Text(min_length=1, max_length=4096) | dict[Text(), Any],
    Field(description="a preset (ftscope models), an HF id, a path to config.json, or an inline config.json mapping"),
]


@forbid_extra
@dataclass(frozen=True)
class ScenarioInput:
    """A scenario as written: the shape `validate` checks every key against."""

    model: ModelRef
    """A preset (ftscope models), an HF id, a path to config.json (or its folder), or an inline config.json mapping."""
    framework: Text(description="a framework recipe (hf-trainer, trl-sft, ...)") | None = None
    """The framework whose training step the run uses (its recipe's mix/workload defaults apply)."""
    name: Label = ""
    """A label shown in outputs."""
    description: Label = ""
    hardware: Hardware = Hardware()
    mix: Mix = Mix()
    workload: Workload = Workload()
    price: Price = Price()
    model_resolution: Text(max_length=4096) | None = None
    """Output only (how `model:` was resolved, in --json and --show-scenario); ignored on input."""


SECTIONS = {
    "hardware": {f.name for f in fields(Hardware)},
    "mix": {f.name for f in fields(Mix)},
    "workload": {f.name for f in fields(Workload)},
    "price": {f.name for f in fields(Price)},
}
TOP_KEYS = {f.name for f in fields(ScenarioInput)}
_CLUSTER_FIELDS = frozenset(("gpu", "gpus_per_node", "nodes", "inter_node_gbs"))
"""The Cluster fields Scenario.with_ sets."""
_MIX_FIELDS, _WORKLOAD_FIELDS = frozenset(SECTIONS["mix"]), frozenset(SECTIONS["workload"])


def fast_replace(obj: Any, **changes: Any) -> Any:
    """dataclasses.replace for frozen dataclasses whose __init__ only stores the fields (no __post_init__, no
    init=False field: Scenario, Mix, Workload, Cluster, the memory model's), without re-running __init__ field by
    field: the searches build hundreds of thousands. The caller passes only field names. A MemoryModel that
    memory_model returned only for its capacity: the copy keeps the reserved curves attached to it."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__, **changes)
    return new


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
    recipe: Recipe = field(default_factory=load_recipe)
    """The `framework:` recipe (default hf-trainer): what the framework's step does beyond the generic one."""

    def with_(self, **changes: Any) -> "Scenario":
        """A copy with `mix`/`workload`/`cluster` fields replaced: with_(micro_batch_size=8, zero_stage=2).
        A name that is none of their fields raises TypeError (as dataclasses.replace does), never a silent no-op."""
        mix_f, wl_f, cl_f = {}, {}, {}  # (the three sections share no field name)
        for k, v in changes.items():
            if k in _MIX_FIELDS:
                mix_f[k] = v
            elif k in _WORKLOAD_FIELDS:
                wl_f[k] = v
            elif k in _CLUSTER_FIELDS:
                cl_f[k] = v
            else:
                unknown = sorted(set(changes) - _MIX_FIELDS - _WORKLOAD_FIELDS - _CLUSTER_FIELDS)
                raise TypeError(f"Scenario.with_: no mix, workload or cluster field named {', '.join(unknown)}")
        new = self
        if mix_f:
            new = fast_replace(new, mix=fast_replace(new.mix, **mix_f))
        if wl_f:
            new = fast_replace(new, workload=fast_replace(new.workload, **wl_f))
        if cl_f:
            new = fast_replace(new, cluster=fast_replace(new.cluster, **cl_f))
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
            "framework": self.recipe.name,
            "model": self.model_ref or self.model.name,
            **({"model_resolution": self.model.resolution} if self.model.resolution else {}),
            "hardware": {"gpu": gpu.key, "gpus_per_node": self.cluster.gpus_per_node, "nodes": self.cluster.nodes,
                         "inter_node_gbs": self.cluster.inter_node_gbs},
            "mix": mix,
            "workload": wl,
            "price": {"usd_per_gpu_hour": self.usd_per_gpu_hour},
        }


def _prepare(raw: Mapping[str, Any]) -> tuple[dict[str, Any], Recipe]:
    """The scenario with what its types do not say filled in, and its framework recipe: an empty section (`mix:`)
    means defaults; the recipe's mix and workload defaults apply under the scenario's own keys;
    `workload.dataset.path` is for `ftscope profile` and needs token statistics beside it for an estimate."""
    out = {k: ({} if k in SECTIONS and v is None else v) for k, v in raw.items()}
    framework = out.get("framework") or DEFAULT_FRAMEWORK
    if not isinstance(framework, str):
        raise FtscopeError(f"framework must be a recipe name (hf-trainer, trl-sft, ...); got {str(framework)[:40]!r}")
    recipe = load_recipe(framework)
    for section, defaults in (("mix", recipe.mix_defaults), ("workload", recipe.workload_defaults)):
        if defaults and isinstance(out.get(section, {}), Mapping):
            out[section] = {**defaults, **out.get(section, {})}  # the scenario's own keys win
    wl = out.get("workload")
    dataset = wl.get("dataset") if isinstance(wl, Mapping) else None
    if isinstance(dataset, Mapping) and any(k in dataset for k in PROFILE_DATASET_KEYS):
        if "mean_tokens" not in dataset:
            raise FtscopeError("workload.dataset.path is read by `ftscope profile`; for estimates give token statistics "
                               "(num_samples, mean_tokens, median_tokens, p99_tokens, max_tokens)")
        stats = {k: v for k, v in dataset.items() if k not in PROFILE_DATASET_KEYS}
        out["workload"] = {**wl, "dataset": stats}
    return out, recipe


def scenario_from_dict(raw: Mapping[str, Any], model: ModelSpec | None = None) -> Scenario:
    """Check and resolve a scenario mapping; every problem is a one-line FtscopeError. `model`: the model as built
    (a profile store's config), used instead of resolving the `model:` text."""
    if not isinstance(raw, Mapping):
        raise FtscopeError("a scenario must be a mapping with model, hardware, mix and workload")
    if raw.get("model") in (None, ""):
        raise FtscopeError("scenario has no 'model' (a preset from `ftscope models`, an HF id or a config.json path)")
    prepared, recipe = _prepare(raw)
    given = validate(ScenarioInput, prepared)
    if model is None:
        model = _model(given.model)
    cluster = given.hardware.to_cluster()
    mix = given.mix
    problem = mix_problem(mix) or model_problem(mix, model) or _recipe_problem(mix, recipe)
    if problem:
        raise FtscopeError(problem)
    if mix.trains_lora:
        model.lora_targets(mix.lora_targets)  # raises on names that match nothing
    check_workload(given.workload)
    a = model.arch
    check_layout(mix, heads=a.num_heads, kv_heads=a.num_kv_heads, layers=model.num_layers, experts=a.num_experts,
                 world=cluster.world_size, gpus_per_node=cluster.gpus_per_node,
                 gradient_accumulation=given.workload.gradient_accumulation, seq_len=given.workload.seq_len)
    return Scenario(model=model, cluster=cluster, mix=mix, workload=given.workload,
                    usd_per_gpu_hour=given.price.usd_per_gpu_hour, name=given.name, recipe=recipe,
                    model_ref=model.name if isinstance(given.model, dict) else given.model)


def _recipe_problem(mix: Mix, recipe: Recipe) -> str | None:
    """A mix setting the framework's own code cannot run."""
    if recipe.nested_quant_fixed and mix.method == "qlora" and not mix.nested_quant:
        return (f"framework {recipe.name} quantizes through torchao's NF4Tensor, which always quantizes its scales "
                "again: mix.nested_quant false cannot run there (drop it or pick a bitsandbytes framework)")
    return None


def _model(value: str | dict[str, Any]) -> ModelSpec:
    """A preset, HF id or config path; or an inline config.json mapping (its `_name_or_path` names it)."""
    if isinstance(value, dict):
        name = str(value.get("_name_or_path") or "inline config")[:200]
        return model_from_config(value, name=name, where="model (an inline config.json)")
    return load_model(value)


def parse_overrides(pairs: Sequence[str]) -> list[tuple[list[str], Any]]:
    """`mix.zero_stage=3` -> (['mix', 'zero_stage'], 3); values parsed as YAML scalars / lists (under the same
    budgets as a file); text YAML cannot parse stays text, a list or mapping that does not parse is an error."""
    out = []
    for pair in pairs:
        if "=" not in pair:
            raise FtscopeError(f"override '{pair[:60]}' is not key.path=value")
        key, _, text = pair.partition("=")
        path = key.strip().split(".")
        if len(path) > MAX_DEPTH or not all(path):
            raise FtscopeError(f"override key '{key[:60]}' is not a key path like mix.zero_stage")
        try:
            value = parse_yaml(text, f"override {key[:60]}") if text else None
        except FtscopeError as exc:
            if text.startswith(("[", "{")) or "nested" in str(exc) or "expands" in str(exc):
                raise  # a list or mapping that does not parse is a mistake, not text
            value = text  # plain text YAML cannot read (e.g. a: b) stays text
        out.append((path, value))
    return out


def apply_overrides(raw: Mapping[str, Any], pairs: Sequence[str]) -> dict[str, Any]:
    """A copy of `raw` with each override set (missing sections are created; the input is left alone)."""
    out = copy.deepcopy(dict(raw))  # keeps YAML aliases shared: a copy never expands them
    for path, value in parse_overrides(pairs):
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[path[-1]] = value
    return out


def read_scenario_file(path: str | Path) -> dict[str, Any]:
    data = load_structured(path, "scenario file")
    if not isinstance(data, dict):
        raise FtscopeError(f"scenario {path} must be a mapping with model, hardware, mix and workload")
    return data


def load_scenario(source: str | Path | Mapping[str, Any], overrides: Sequence[str] = ()) -> Scenario:
    """A checked Scenario from a YAML/JSON path or a mapping, with `key.path=value` overrides applied. (A
    framework's own config file is read by spec/frameworks.load, and by the public `ftscope.load_scenario`.)"""
    raw = read_scenario_file(source) if isinstance(source, (str, Path)) else dict(source)
    if overrides:
        raw = apply_overrides(raw, overrides)
    model = raw.get("model")
    if isinstance(source, (str, Path)) and isinstance(model, str) and model and not _is_path(model):
        # a relative config path is read beside the scenario file, wherever the command runs from
        beside = Path(source).parent / model
        if _is_path(str(beside)) and (beside.is_file() or (beside / "config.json").is_file()):
            raw = {**raw, "model": str(beside)}
    return scenario_from_dict(raw)


def _is_path(text: str) -> bool:
    """Whether `text` names something on disk (False for names no file system could hold)."""
    try:
        return Path(text).exists()
    except (OSError, ValueError):  # a name over 255 bytes, a NUL byte: not a path, so not beside the file either
        return False
