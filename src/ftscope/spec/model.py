"""ModelSpec: what a model is made of, counted the way the real implementation builds it.

Every weight matrix is a `Linear` with the names users pass as LoRA targets; parameter counts (total, active
per token, per component, LoRA) are sums over them, and a test builds shrunk configs with transformers on the
meta device to check that the sums are exact.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..errors import FtscopeError, did_you_mean
from .architecture import Arch


@dataclass(frozen=True)
class Linear:
    """One weight matrix of a block, or a stack of `count` expert matrices."""

    role: str
    """Canonical role: q, k, v, qkv, o, mla_q, mla_kv_a, mla_kv_b, gate, up, down, router, shared_gate, ..."""
    names: tuple[str, ...]
    """Names that select it as a LoRA target (the HF module / parameter names of this family)."""
    in_features: int
    out_features: int
    bias: bool = False
    count: int = 1
    """Number of stacked copies (experts)."""
    used_per_token: float = 1.0
    """Copies each token passes through (top-k for routed experts)."""
    group: str = "attention"
    """attention | mlp | experts | shared_expert | router | mamba"""

    @property
    def params(self) -> int:
        return self.count * (self.in_features * self.out_features + (self.out_features if self.bias else 0))

    @property
    def active_params(self) -> float:
        return self.used_per_token * (self.in_features * self.out_features + (self.out_features if self.bias else 0))


@dataclass(frozen=True)
class Layer:
    """One decoder block: its weight matrices and its other (norm, conv, state) parameters."""

    mixer: str
    """attention | mamba"""
    ffn: str
    """dense | moe | none"""
    linears: tuple[Linear, ...]
    other_params: int
    """Norm weights/biases, Mamba conv/A/D: trained in full fine-tuning, never LoRA targets."""

    @cached_property  # frozen: read once per layer, not once per memory model
    def params(self) -> int:
        return sum(lin.params for lin in self.linears) + self.other_params

    @property
    def active_params(self) -> float:
        return sum(lin.active_params for lin in self.linears) + self.other_params


@dataclass(frozen=True, eq=False)  # identity hash: cheap cache key, presets are cached objects
class ModelSpec:
    """A model's architecture and parameter layout, from its HF config.json."""

    name: str
    """Preset name or the path it was read from."""
    arch: Arch
    """Normalized config fields."""
    layer_groups: tuple[tuple[Layer, int], ...]
    """Distinct block layouts and how many blocks have each."""
    embedding_params: int
    lm_head_params: int
    """0 when tied to the embedding (counted once, as transformers' parameters() does)."""
    final_norm_params: int
    vision_params: int = 0
    """A multimodal checkpoint's vision tower and projector as its fine-tuning load builds them (Gemma 3 through
    AutoModelForCausalLM, Mistral 3 through AutoModelForImageTextToText): held and, in full fine-tuning, trained;
    no activations (text-only batches)."""
    vision_linears: tuple[tuple[Linear, int], ...] = ()
    """That tower's block Linears with their block count: LoRA targets (all-linear, module names), nothing else."""
    source: str = ""
    """Where the config came from (URL of the published config, or a local path)."""
    resolution: str = ""
    """How a reference that names no preset exactly was matched to one (empty when it needed no matching)."""

    # ---- counts -------------------------------------------------------------------------------------------
    @cached_property  # frozen: a search builds thousands of memory models that read it
    def total_params(self) -> int:
        return self.embedding_params + self.lm_head_params + self.final_norm_params + self.vision_params + sum(
            layer.params * n for layer, n in self.layer_groups
        )

    def active_params(self, top_k: int | None = None) -> int:
        """Parameters one token passes through (routed experts: top_k of them; embeddings included; a vision
        tower is not on a text token's path)."""
        return _active(self, top_k)

    def _active(self, top_k: int | None) -> int:
        total = self.embedding_params + self.lm_head_params + self.final_norm_params
        for layer, n in self.layer_groups:
            for lin in layer.linears:
                used = lin.used_per_token if (top_k is None or lin.group != "experts") else top_k
                total += used * (lin.params // lin.count) * n
            total += layer.other_params * n
        return int(round(total))

    def params_by_component(self) -> dict[str, int]:
        out = {"embedding": self.embedding_params, "lm_head": self.lm_head_params,
               "norms": self.final_norm_params, **({"vision": self.vision_params} if self.vision_params else {})}
        for layer, n in self.layer_groups:
            key = "mamba" if layer.mixer == "mamba" else "norms"
            out[key] = out.get(key, 0) + layer.other_params * n
            for lin in layer.linears:
                out[lin.group] = out.get(lin.group, 0) + lin.params * n
        return out

    @property
    def num_layers(self) -> int:
        return sum(n for _, n in self.layer_groups)

    @property
    def is_moe(self) -> bool:
        return self.arch.num_experts > 0

    def linears(self) -> Iterable[tuple[Linear, int]]:
        """Every block weight matrix with the number of blocks that hold it."""
        for layer, n in self.layer_groups:
            for lin in layer.linears:
                yield lin, n

    def largest_linear_params(self) -> int:
        """Largest single matrix (a whole expert stack counts as one: ZeRO-3 gathers MoE blocks whole)."""
        return _largest_linear(self)

    def largest_layer_params(self) -> int:
        return _largest_layer(self)

    def quantizable_params(self) -> int:
        """Parameters in block weight matrices (what bitsandbytes quantizes; routers stay in bf16)."""
        return _quantizable(self)

    # ---- LoRA ---------------------------------------------------------------------------------------------
    def lora_targets(self, targets: str | Sequence[str]) -> list[tuple[Linear, int]]:
        """The matrices a LoRA target spec selects: 'all-linear', 'attention', 'mlp', or a list of names."""
        return list(_lora_targets(self, targets if isinstance(targets, str) else tuple(targets)))

    def lora_target_ids(self, targets: str | Sequence[str]) -> frozenset[int]:
        """ids of the selected Linear objects (for fast membership tests)."""
        return _lora_target_ids(self, targets if isinstance(targets, str) else tuple(targets))

    def _select(self, targets: str | tuple[str, ...]) -> tuple[tuple[Linear, int], ...]:
        # a vision tower's Linears answer to all-linear and to module names (as in PEFT), not to attention/mlp
        everything = (*self.linears(), *self.vision_linears)
        if isinstance(targets, str):
            if targets == "all-linear":
                return tuple((lin, n) for lin, n in everything if lin.group not in ("router",))
            if targets == "attention":
                return tuple((lin, n) for lin, n in self.linears() if lin.group in ("attention",))
            if targets == "mlp":
                return tuple((lin, n) for lin, n in self.linears() if lin.group in ("mlp", "experts", "shared_expert"))
            targets = (targets,)
        known = {name for lin, _ in everything for name in lin.names}
        for name in targets:
            if name not in known:
                raise FtscopeError(
                    f"LoRA target '{name}' matches no weight in {self.name}{did_you_mean(name, known)}"
                    f" (names here: {', '.join(sorted(known))})"
                )
        return tuple((lin, n) for lin, n in everything if any(t in lin.names for t in targets))

    def lora_params(self, rank: int, targets: str | Sequence[str], fused_experts: bool = False) -> int:
        """Trainable LoRA parameters: A (r x in) and B (out x r) per targeted matrix and per expert. Fused 3-D
        experts (transformers 5) hold gate and up in one gate_up parameter: PEFT gives it one adapter, so the
        two share an A."""
        key = targets if isinstance(targets, str) else tuple(targets)
        return rank * _lora_width(self, key, fused_experts)

    def lora_layer_params(self, rank: int, targets: str | Sequence[str], fused_experts: bool = False
                          ) -> tuple[int, ...]:
        """lora_params of one block of each layer group, in layer_groups' order (ZeRO-3 / FSDP gather a block's
        adapters with it)."""
        return _lora_layer_params(self, rank, targets if isinstance(targets, str) else tuple(targets), fused_experts)


@lru_cache(maxsize=4096)
def _active(model: ModelSpec, top_k: int | None) -> int:
    return model._active(top_k)


@lru_cache(maxsize=1024)
def _largest_linear(model: ModelSpec) -> int:
    return max(lin.params for lin, _ in model.linears())


@lru_cache(maxsize=1024)
def _largest_layer(model: ModelSpec) -> int:
    return max(layer.params for layer, _ in model.layer_groups)


@lru_cache(maxsize=1024)
def _quantizable(model: ModelSpec) -> int:
    return sum(lin.params * k for lin, k in model.linears() if lin.group != "router")


@lru_cache(maxsize=4096)
def _lora_targets(model: ModelSpec, targets: str | tuple[str, ...]) -> tuple[tuple[Linear, int], ...]:
    return model._select(targets)


@lru_cache(maxsize=4096)
def _lora_width(model: ModelSpec, targets: str | tuple[str, ...], fused_experts: bool = False) -> int:
    selected = _lora_targets(model, targets)
    width = sum((lin.in_features + lin.out_features) * lin.count * n for lin, n in selected)
    if fused_experts:
        ids = {id(lin) for lin, _ in selected}
        for layer, n in model.layer_groups:
            width -= _shared_a(layer, ids) * n
    return width


@lru_cache(maxsize=4096)
def _lora_layer_params(model: ModelSpec, rank: int, targets: str | tuple[str, ...], fused_experts: bool
                       ) -> tuple[int, ...]:
    ids = _lora_target_ids(model, targets)
    return tuple(rank * (sum((lin.in_features + lin.out_features) * lin.count for lin in layer.linears
                             if id(lin) in ids) - (_shared_a(layer, ids) if fused_experts else 0))
                 for layer, _ in model.layer_groups)


def _shared_a(layer, ids: set[int] | frozenset[int]) -> int:
    """A's width a fused gate_up expert stack saves when both its halves are targeted: PEFT gives it one adapter."""
    pair = [lin for lin in layer.linears if lin.group == "experts" and lin.role in ("gate", "up") and id(lin) in ids]
    return pair[0].in_features * pair[0].count if len(pair) == 2 else 0


@lru_cache(maxsize=4096)
def _lora_target_ids(model: ModelSpec, targets: str | tuple[str, ...]) -> frozenset[int]:
    return frozenset(id(lin) for lin, _ in _lora_targets(model, targets))


# ---- loading (spec/resolve.py; here because every caller imports it from this module) -----------------------

def hf_hub_cache() -> Path:
    """The local Hugging Face hub cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    import os
    return Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
