"""ModelSpec: what a model is made of, counted the way the real implementation builds it.

Every weight matrix is a `Linear` with the names users pass as LoRA targets; parameter counts (total, active
per token, per component, LoRA) are sums over them, and a test builds shrunk configs with transformers on the
meta device to check that the sums are exact.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from .. import catalog
from ..errors import FtscopeError, did_you_mean
from ..files import check_path, os_error, parse_json, read_text, show
from .architecture import Arch, normalize


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

    @property
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
    source: str = ""
    """Where the config came from (URL of the published config, or a local path)."""

    # ---- counts -------------------------------------------------------------------------------------------
    @property
    def total_params(self) -> int:
        return self.embedding_params + self.lm_head_params + self.final_norm_params + sum(
            layer.params * n for layer, n in self.layer_groups
        )

    def active_params(self, top_k: int | None = None) -> int:
        """Parameters one token passes through (routed experts: top_k of them; embeddings included)."""
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
               "norms": self.final_norm_params}
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
        if isinstance(targets, str):
            if targets == "all-linear":
                return tuple((lin, n) for lin, n in self.linears() if lin.group not in ("router",))
            if targets == "attention":
                return tuple((lin, n) for lin, n in self.linears() if lin.group in ("attention",))
            if targets == "mlp":
                return tuple((lin, n) for lin, n in self.linears() if lin.group in ("mlp", "experts", "shared_expert"))
            targets = (targets,)
        chosen: list[tuple[Linear, int]] = []
        known = {name for lin, _ in self.linears() for name in lin.names}
        for name in targets:
            if name not in known:
                raise FtscopeError(
                    f"LoRA target '{name}' matches no weight in {self.name}{did_you_mean(name, known)}"
                    f" (names here: {', '.join(sorted(known))})"
                )
        for lin, n in self.linears():
            if any(t in lin.names for t in targets):
                chosen.append((lin, n))
        return tuple(chosen)

    def lora_params(self, rank: int, targets: str | Sequence[str], fused_experts: bool = False) -> int:
        """Trainable LoRA parameters: A (r x in) and B (out x r) per targeted matrix and per expert. Fused 3-D
        experts (transformers 5) hold gate and up in one gate_up parameter: PEFT gives it one adapter, so the
        two share an A."""
        key = targets if isinstance(targets, str) else tuple(targets)
        return rank * _lora_width(self, key, fused_experts)


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
            pair = [lin for lin in layer.linears if lin.group == "experts" and lin.role in ("gate", "up") and id(lin) in ids]
            if len(pair) == 2:
                width -= pair[0].in_features * pair[0].count * n
    return width


@lru_cache(maxsize=4096)
def _lora_target_ids(model: ModelSpec, targets: str | tuple[str, ...]) -> frozenset[int]:
    return frozenset(id(lin) for lin, _ in _lora_targets(model, targets))


# ---- building from an Arch ---------------------------------------------------------------------------------

def _attention_linears(a: Arch) -> tuple[list[Linear], int]:
    """Attention weight matrices and the extra (qk-norm) parameters of one block."""
    h, d = a.hidden_size, a.head_dim
    q_out, kv_out = a.num_heads * d, a.num_kv_heads * d
    qkv_bias = a.fact("qkv_bias", False) or a.fact("attention_bias", False)
    o_bias = a.fact("o_bias", False) or a.fact("attention_bias", False)
    o_name = a.fact("o_name", "o_proj")
    extra = 0
    if a.attention == "fused_qkv":
        # Falcon: one query_key_value matrix; the new decoder architecture keeps separate k/v per kv-group.
        out = (a.num_heads + 2 * a.num_kv_heads) * d if a.fact("new_decoder_architecture") or a.num_kv_heads < a.num_heads else 3 * h
        lins = [Linear("qkv", ("query_key_value", "qkv"), h, out, qkv_bias),
                Linear("o", (o_name, "o_proj"), a.num_heads * d, h, o_bias)]
    elif a.attention == "mla":
        qk_head = a.qk_nope_head_dim + a.qk_rope_head_dim
        lins = []
        if a.q_lora_rank:
            lins += [Linear("mla_q_a", ("q_a_proj",), h, a.q_lora_rank, qkv_bias),
                     Linear("mla_q_b", ("q_b_proj",), a.q_lora_rank, a.num_heads * qk_head)]
            extra += a.q_lora_rank
        else:
            lins.append(Linear("q", ("q_proj",), h, a.num_heads * qk_head))
        lins += [Linear("mla_kv_a", ("kv_a_proj_with_mqa",), h, a.kv_lora_rank + a.qk_rope_head_dim, qkv_bias),
                 Linear("mla_kv_b", ("kv_b_proj",), a.kv_lora_rank, a.num_heads * (a.qk_nope_head_dim + a.v_head_dim)),
                 Linear("o", ("o_proj",), a.num_heads * a.v_head_dim, h, o_bias)]
        extra += a.kv_lora_rank
    else:
        lins = [Linear("q", ("q_proj",), h, q_out, qkv_bias), Linear("k", ("k_proj",), h, kv_out, qkv_bias),
                Linear("v", ("v_proj",), h, kv_out, qkv_bias), Linear("o", (o_name, "output_proj"), q_out, h, o_bias)]
    qk_norm = a.fact("qk_norm")
    if a.model_type == "phi" and a.fact("qk_layernorm"):
        extra += 4 * d  # q_layernorm and k_layernorm: LayerNorm(head_dim), weight and bias
    if qk_norm == "head":
        extra += 2 * d
    elif qk_norm == "full":
        extra += q_out + kv_out
    return lins, extra


def _mlp_linears(a: Arch, inter: int, group: str, names: dict[str, tuple[str, ...]] | None = None,
                 count: int = 1, used: float = 1.0) -> list[Linear]:
    h = a.hidden_size
    bias = a.fact("mlp_bias", False) and group == "mlp"
    if a.fact("mlp", "gated") == "plain" and group == "mlp":
        up_name, down_name = a.fact("mlp_names", ("fc1", "fc2"))
        return [Linear("up", (up_name,), h, inter, bias, group=group),
                Linear("down", (down_name,), inter, h, bias, group=group)]
    # torchtune names the SwiGLU matrices w1 (gate), w3 (up), w2 (down)
    names = names or {"gate": ("gate_proj", "w1"), "up": ("up_proj", "w3"), "down": ("down_proj", "w2")}
    return [Linear("gate", names["gate"], h, inter, bias, count, used, group),
            Linear("up", names["up"], h, inter, bias, count, used, group),
            Linear("down", names["down"], inter, h, bias, count, used, group)]


def _expert_names(a: Arch) -> dict[str, tuple[str, ...]]:
    # transformers 5 fuses experts into gate_up_proj / down_proj 3-D parameters; older names still select them.
    g, u, d = a.fact("expert_names", ("gate_proj", "up_proj", "down_proj"))
    return {"gate": (g, "gate_up_proj", "experts"), "up": (u, "gate_up_proj", "experts"),
            "down": (d, "down_proj", "experts")}


def _moe_linears(a: Arch) -> list[Linear]:
    h, e = a.hidden_size, a.num_experts
    lins = [Linear("router", ("gate", "router"), h, e, group="router")]
    if a.fact("mixer") == "mamba":
        lins += [Linear("up", ("fc1", "experts"), h, 2 * a.moe_intermediate_size if a.fact("glu") else a.moe_intermediate_size,
                        count=e, used_per_token=a.top_k, group="experts"),
                 Linear("down", ("fc2", "experts"), a.moe_intermediate_size, h, count=e, used_per_token=a.top_k,
                        group="experts")]
        return lins
    lins += _mlp_linears(a, a.moe_intermediate_size, "experts", _expert_names(a), e, a.top_k)
    if a.shared_expert_intermediate_size:
        lins += _mlp_linears(a, a.shared_expert_intermediate_size, "shared_expert",
                             {"gate": ("gate_proj",), "up": ("up_proj",), "down": ("down_proj",)})
        if a.model_type == "qwen2_moe":
            lins.append(Linear("shared_gate", ("shared_expert_gate",), h, 1, group="router"))
    return lins


def _mamba_linears(a: Arch) -> tuple[list[Linear], int]:
    h, di, n, r = a.hidden_size, a.mamba_d_inner, a.mamba_d_state, a.mamba_dt_rank
    lins = [Linear("in", ("in_proj",), h, 2 * di, group="mamba"),
            Linear("x", ("x_proj",), di, r + 2 * n, group="mamba"),
            Linear("dt", ("dt_proj",), r, di, True, group="mamba"),
            Linear("out", ("out_proj",), di, h, group="mamba")]
    other = di * a.mamba_d_conv + di + di * n + di  # conv1d weight + bias, A_log, D
    return lins, other


def build(arch: Arch, name: str, source: str = "") -> ModelSpec:
    """The ModelSpec of a normalized architecture."""
    a = arch
    h = a.hidden_size
    norm_params = (2 if a.fact("norm") == "layernorm" else 1) * h
    norms_per_layer = a.fact("norms_per_layer", 2)
    if a.model_type == "falcon":
        if a.fact("new_decoder_architecture"):
            norms_per_layer = 1 if a.fact("num_ln_in_parallel_attn") == 1 else 2
        else:  # rw-style: one norm when attention and MLP run in parallel, two when sequential
            norms_per_layer = 1 if a.fact("parallel_attn") else 2
    groups: dict[Layer, int] = {}
    moe = set(a.moe_layers)
    for i, kind in enumerate(a.mixer_pattern):
        if kind == "mamba":
            lins, other = _mamba_linears(a)
            layer = Layer("mamba", "none", tuple(lins), other + norm_params)
        elif kind == "moe":  # BlackMamba's MoE block: a norm and the routed experts
            layer = Layer("moe", "moe", tuple(_moe_linears(a)), norm_params)
        else:
            lins, extra = _attention_linears(a)
            ffn = "moe" if i in moe else "dense"
            lins += _moe_linears(a) if ffn == "moe" else _mlp_linears(a, a.intermediate_size, "mlp")
            layer = Layer("attention", ffn, tuple(lins), extra + norms_per_layer * norm_params)
        groups[layer] = groups.get(layer, 0) + 1
    vocab = a.vocab_size
    lm_head = 0 if a.tie_embeddings else vocab * h
    if a.fact("lm_head_bias"):
        lm_head += vocab
    return ModelSpec(name=name, arch=a, layer_groups=tuple(groups.items()), embedding_params=vocab * h,
                     lm_head_params=lm_head, final_norm_params=norm_params, source=source)


# ---- loading ------------------------------------------------------------------------------------------------

def _read_config(path: Path) -> tuple[dict[str, Any], str]:
    """(the config.json dict, how to name it in errors) of a config file or a model folder."""
    if path.is_dir():
        path = path / "config.json"
    where = f"config.json at {show(path)}"
    if not path.exists():
        raise FtscopeError(f"no config.json at {show(path)}")
    return parse_json(read_text(path, "config.json"), where), where


def hf_hub_cache() -> Path:
    """The local Hugging Face hub cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    import os
    return Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")


def _hf_cache_config(hf_id: str) -> Path | None:
    """A model folder for an HF id in the local HF cache (no network)."""
    snapshots = hf_hub_cache() / ("models--" + hf_id.replace("/", "--")) / "snapshots"
    try:
        if snapshots.is_dir():
            for snap in sorted(snapshots.iterdir(), reverse=True):
                if (snap / "config.json").is_file():
                    return snap
    except OSError as exc:
        raise os_error(exc, "HF cache folder", snapshots) from None
    return None


@lru_cache(maxsize=256)
def load_model(ref: str) -> ModelSpec:
    """A ModelSpec from a preset name, an HF id (preset alias or local HF cache), a config.json or a model folder."""
    ref = str(ref).strip()
    preset = catalog.resolve_model_name(ref)
    if preset is not None:
        entry = catalog.model_index()[preset]
        return build(normalize(catalog.model_config(preset)), preset, entry.get("source", ""))
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
        cfg, where = _read_config(path)
        return build(normalize(cfg, where), str(path), str(path.resolve()))
    if "/" in ref:
        snap = _hf_cache_config(ref)
        if snap is not None:
            cfg, where = _read_config(snap)
            return build(normalize(cfg, where), ref, str(snap))
    raise FtscopeError(
        f"unknown model '{show(ref)}'{did_you_mean(ref, catalog.model_index().keys())}: "
        "give a preset (ftscope models), an HF id in the local cache, or a path to config.json"
    )


def model_from_config(cfg: dict[str, Any], name: str = "custom", where: str = "config.json") -> ModelSpec:
    """A ModelSpec straight from a config dict (an inline `model:` mapping, `--shrink`, stores, tests)."""
    return build(normalize(cfg, where), name)
