"""One alias table that turns any supported HF config.json into the same normalized fields.

Families differ in key names (Mixtral `num_local_experts`, Qwen-MoE `num_experts`, DeepSeek `n_routed_experts`,
GPT-style `n_embd`), in nesting (`text_config`) and in layout (fused QKV, parallel blocks, MLA, Mamba).
Everything downstream reads `Arch`, never the raw config.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator

from ..errors import FtscopeError
from .families import FAMILIES, TRANSFORMERS_FAMILIES, moe_interval_layers, vision_tower

__all__ = ["ALIASES", "Arch", "FAMILIES", "TRANSFORMERS_FAMILIES", "model_type_of", "normalize"]
from .schema import Flag, Int, Text, validate

# normalized field -> config keys that mean it, first match wins
ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "num_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv", "n_kv_heads"),
    "head_dim": ("head_dim", "kv_channels"),
    "intermediate_size": ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
    "top_k": ("num_experts_per_tok", "moe_top_k", "top_k", "num_selected_experts", "mlp_top_k"),
    "moe_intermediate_size": ("moe_intermediate_size", "expert_intermediate_size"),
    "shared_expert_intermediate_size": ("shared_expert_intermediate_size",),
    "num_shared_experts": ("n_shared_experts", "num_shared_experts"),
    "first_dense_layers": ("first_k_dense_replace",),
    "tie_embeddings": ("tie_word_embeddings",),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"),
    "sliding_window": ("sliding_window",),
    "q_lora_rank": ("q_lora_rank",),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "mamba_d_state": ("state_size", "d_state", "mamba_d_state"),
    "mamba_d_conv": ("conv_kernel", "d_conv", "conv_dimension", "mamba_d_conv"),
    "mamba_expand": ("expand", "expansion_factor", "mamba_expand"),
}



@dataclass(frozen=True)
class Arch:
    """Normalized architecture fields (sizes in elements, not bytes)."""

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool
    max_position_embeddings: int
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    moe_layers: tuple[int, ...] = ()
    sliding_window: int | None = None
    attention: str = "gqa"            # gqa | fused_qkv | mla
    mixer_pattern: tuple[str, ...] = ()  # per layer: attention | mamba
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mamba_d_state: int = 0
    mamba_d_conv: int = 0
    mamba_d_inner: int = 0
    mamba_dt_rank: int = 0
    vision_params: int = 0
    """Parameters the fine-tuning load builds beside the language model (Gemma 3's SigLIP tower and projector,
    Mistral 3's Pixtral tower and projector)."""
    vision_matrices: tuple[tuple[str, int, int, bool, int], ...] = ()
    """That tower's nn.Linears, which LoRA can target: (module name, in, out, bias, how many blocks hold it)."""
    facts: tuple[tuple[str, Any], ...] = ()

    def fact(self, key: str, default: Any = None) -> Any:
        return dict(self.facts).get(key, default)


def _get(cfg: dict[str, Any], field: str, default: Any = None) -> Any:
    for key in ALIASES.get(field, (field,)):
        if key in cfg and cfg[key] is not None:
            return cfg[key]
    return default


def _key(cfg: dict[str, Any], field: str) -> str:
    """The config key that gave `field` (the HF name when none did)."""
    return next((k for k in ALIASES.get(field, (field,)) if cfg.get(k) is not None), ALIASES.get(field, (field,))[0])


Size = Int(1, 2**24)
"""Widths and counts: 1 to 16.7M (the largest published vocabulary is 256k, hidden size 25k)."""
Count = Int(0, 2**24)
Heads = Int(1, 65_536)


@dataclass(frozen=True)
class ConfigFields:
    """The config.json values normalize() reads, alias-resolved, each typed: one place checks them all
    (NaN, strings, lists or negatives where a size belongs are errors naming the config key)."""

    hidden_size: Size
    num_layers: Int(1, 100_000)
    vocab_size: Size
    num_heads: Heads | None = None
    num_kv_heads: Heads | None = None
    head_dim: Heads | None = None
    intermediate_size: Size | None = None
    num_experts: Count | None = None
    top_k: Count | None = None
    moe_intermediate_size: Count | None = None
    shared_expert_intermediate_size: Count | None = None
    num_shared_experts: Count | None = None
    first_dense_layers: Count | None = None
    tie_embeddings: Flag() | None = None
    max_position_embeddings: Int(1, 2**40) | None = None
    sliding_window: Annotated[Int(1, 2**40) | None, BeforeValidator(lambda v: None if v is False else v)] = None
    q_lora_rank: Count | None = None
    kv_lora_rank: Count | None = None
    qk_nope_head_dim: Count | None = None
    qk_rope_head_dim: Count | None = None
    v_head_dim: Count | None = None
    mamba_d_state: Size | None = None
    mamba_d_conv: Size | None = None
    mamba_expand: Int(1, 64) | None = None
    decoder_sparse_step: Int(1, 100_000) | None = None
    mlp_only_layers: tuple[Int(0, 100_000), ...] | None = None
    mamba_moe_layers: tuple[Text() | Int(0, 65_536), ...] | None = None
    dt_rank: Literal["auto"] | Size | None = None
    rope_scaling: dict[str, Any] | None = None
    moe_layers: tuple[Int(0, 100_000), ...] | None = None
    moe_step: Int(1, 100_000) | None = None
    """The family's interval between MoE layers (Llama 4's interleave_moe_layer_step), read from fam's key."""


_RAW_KEYS = ("decoder_sparse_step", "mlp_only_layers", "mamba_moe_layers", "dt_rank", "rope_scaling", "moe_layers")


def config_fields(cfg: dict[str, Any], where: str = "config.json") -> ConfigFields:
    """The typed values of a config.json dict; a wrong type or range is one FtscopeError naming its key."""
    values = {f: _get(cfg, f) for f in ALIASES} | {k: cfg.get(k) for k in _RAW_KEYS}
    fam = FAMILIES.get(str(cfg.get("model_type")), {})
    if fam.get("moe_step_key"):
        values["moe_step"] = cfg.get(fam["moe_step_key"])
    names = {f: _key(cfg, f) for f in ALIASES}
    for f in ("hidden_size", "num_layers", "vocab_size"):
        if values[f] is None:
            raise FtscopeError(f"{where} has no '{names[f]}' (needed for {f})")
    return validate(ConfigFields, {k: v for k, v in values.items() if v is not None}, source=where, names=names)


def model_type_of(cfg: dict[str, Any], where: str = "config.json") -> str:
    mt = cfg.get("model_type")
    archs = cfg.get("architectures")
    if mt is None and isinstance(archs, list) and archs and isinstance(archs[0], str):
        arch = archs[0].lower()
        mt = "blackmamba" if "mamba" in arch else arch.replace("forcausallm", "")
    if mt is None and ("mamba_moe_layers" in cfg or "mamba" in str(cfg.get("_name_or_path", "")).lower()):
        mt = "blackmamba"
    if mt is None:
        raise FtscopeError(f"{where} has no 'model_type'; cannot tell the architecture")
    if not isinstance(mt, str):
        raise FtscopeError(f"{where}: model_type must be a string; got {str(mt)[:40]!r}")
    return mt


def _family_view(cfg: dict[str, Any], fam: dict[str, Any]) -> dict[str, Any]:
    """The config as the family's config class reads it: its defaults for keys the file leaves out, and its own
    key names (Llama 4's intermediate_size_mlp) moved onto the shared ones."""
    out = {**fam.get("defaults", {}), **{k: v for k, v in cfg.items() if v is not None}}
    moved = {ALIASES[field][0]: next(out[k] for k in keys if k in out)
             for field, keys in fam.get("aliases", {}).items() if any(k in out for k in keys)}
    return {**out, **moved}


def _unwrap(cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the language model's config, the outer config): multimodal wrappers keep the LM in text_config."""
    if not isinstance(cfg, dict):
        raise FtscopeError("config.json must be a JSON object")
    if isinstance(cfg.get("text_config"), dict):
        return {**cfg, **cfg["text_config"]}, cfg
    return cfg, cfg


def _moe_layers(cfg: dict[str, Any], c: ConfigFields, fam: dict[str, Any], layers: int) -> tuple[int, ...]:
    if c.moe_layers is not None:  # Llama 4 states them, or derives them from its interval
        return tuple(sorted(i for i in c.moe_layers if i < layers))
    if fam.get("moe_step_key"):
        return moe_interval_layers(layers, c.moe_step or 1)
    first_dense = c.first_dense_layers or 0
    step = c.decoder_sparse_step or 1
    mlp_only = set(c.mlp_only_layers or ())
    # DeepSeek's moe_layer_freq is ignored, as transformers does (every published config sets 1)
    return tuple(i for i in range(layers) if i >= first_dense and i not in mlp_only and (i + 1) % step == 0)


def _facts(cfg: dict[str, Any], c: ConfigFields, fam: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    facts = {k: v for k, v in fam.items() if k not in ("aliases", "defaults")}
    facts["glu"] = bool(cfg.get("swiglu", cfg.get("gated_linear_unit", False)))
    facts["attention_bias"] = bool(cfg.get("attention_bias", False) or cfg.get("bias", False))
    facts["mlp_bias"] = bool(cfg.get("mlp_bias", fam.get("mlp_bias", False)) or cfg.get("bias", False))
    facts["new_decoder_architecture"] = bool(cfg.get("new_decoder_architecture", False))
    facts["num_ln_in_parallel_attn"] = cfg.get("num_ln_in_parallel_attn")
    facts["parallel_attn"] = bool(cfg.get("parallel_attn", True))
    facts["qk_layernorm"] = bool(cfg.get("qk_layernorm", False))
    facts["norm_topk_prob"] = cfg.get("norm_topk_prob")
    facts["router_aux_loss_coef"] = cfg.get("router_aux_loss_coef")
    facts["rope_scaling"] = bool(c.rope_scaling)
    return tuple(sorted(facts.items()))


def _heads(cfg: dict[str, Any], c: ConfigFields, fam: dict[str, Any], where: str) -> tuple[int, int, int]:
    """(heads, kv heads, head_dim), with the rules across them: kv heads divide heads, heads divide the width."""
    heads = c.num_heads or (1 if fam.get("mixer") == "mamba" else None)
    if heads is None:
        raise FtscopeError(f"{where} has no 'num_attention_heads' (needed for num_heads)")
    kv = c.num_kv_heads or (1 if cfg.get("multi_query") is True and not cfg.get("new_decoder_architecture") else heads)
    if heads % kv:
        raise FtscopeError(f"{where}: num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv})")
    if c.head_dim is None and c.hidden_size % heads and fam.get("mixer") != "mamba":
        raise FtscopeError(f"{where}: hidden_size ({c.hidden_size}) is not a multiple of num_attention_heads ({heads}) "
                           "and there is no head_dim")
    return heads, kv, c.head_dim or c.hidden_size // heads


def normalize(cfg: dict[str, Any], where: str = "config.json") -> Arch:
    """Read an HF config.json dict into `Arch`; raises FtscopeError on anything unusable."""
    if not isinstance(cfg, dict):
        raise FtscopeError(f"{where} must be a JSON object")
    cfg, outer = _unwrap(cfg)
    mt = model_type_of(cfg, where)
    if mt not in FAMILIES:
        raise FtscopeError(f"{where}: model_type '{mt[:60]}' is not supported yet (supported: {', '.join(sorted(FAMILIES))})")
    fam = FAMILIES[mt]
    cfg = _family_view(cfg, fam)
    c = config_fields(cfg, where)
    h, layers, vocab = c.hidden_size, c.num_layers, c.vocab_size
    heads, kv, head_dim = _heads(cfg, c, fam, where)
    inter = c.intermediate_size or 4 * h
    experts = c.num_experts or 0
    top_k = (c.top_k or 0) if experts else 0
    if experts and not 1 <= top_k <= experts:
        raise FtscopeError(f"{where}: experts per token ({top_k}) must be between 1 and the number of experts ({experts})")
    moe_inter = c.moe_intermediate_size or (inter if experts else 0)
    shared_inter = c.shared_expert_intermediate_size or 0
    if c.num_shared_experts and not shared_inter:
        shared_inter = c.num_shared_experts * moe_inter

    mixer = fam.get("mixer", "attention")
    if mixer == "mamba":
        # BlackMamba alternates Mamba ("r") and MoE ("8": 8 experts) blocks; num_layers counts both kinds.
        kinds = c.mamba_moe_layers or tuple("r" if i % 2 == 0 else "8" for i in range(layers))
        if len(kinds) != layers:
            raise FtscopeError(f"{where}: mamba_moe_layers lists {len(kinds)} blocks but num_layers is {layers}")
        pattern = tuple("mamba" if str(k).lower() == "r" else "moe" for k in kinds)
        if not experts and "moe" in pattern:
            count = next(str(k) for k in kinds if str(k).lower() != "r")
            if not count.isdigit() or not 1 <= int(count) <= 65_536:
                raise FtscopeError(f"{where}: mamba_moe_layers entries must be 'r' or an expert count; got {count[:20]!r}")
            experts = int(count)
            top_k = min(c.top_k or 1, experts)  # Zyphra's BlackMamba routes each token to one expert
        moe_layers = tuple(i for i, kind in enumerate(pattern) if kind == "moe")
    else:
        pattern = ("attention",) * layers
        moe_layers = _moe_layers(cfg, c, fam, layers) if experts else ()

    if experts and not moe_inter:
        moe_inter = inter
    tie = c.tie_embeddings
    if tie is None:
        tie = fam.get("tie_default", False)  # the config class's default (transformers 5)
    vision = vision_tower(outer, h)
    d_inner = dt_rank = 0
    if mixer == "mamba":
        d_inner = (c.mamba_expand or 2) * h
        dt_rank = c.dt_rank if isinstance(c.dt_rank, int) else -(-h // 16)

    return Arch(
        model_type=mt, hidden_size=h, num_layers=layers, num_heads=heads, num_kv_heads=kv,
        head_dim=head_dim, intermediate_size=inter, vocab_size=vocab, tie_embeddings=bool(tie),
        max_position_embeddings=c.max_position_embeddings or 4096, num_experts=experts, top_k=top_k,
        moe_intermediate_size=moe_inter, shared_expert_intermediate_size=shared_inter, moe_layers=moe_layers,
        sliding_window=c.sliding_window, attention=fam.get("attention", "gqa"), mixer_pattern=pattern,
        q_lora_rank=c.q_lora_rank, kv_lora_rank=c.kv_lora_rank or 0,
        qk_nope_head_dim=c.qk_nope_head_dim or 0, qk_rope_head_dim=c.qk_rope_head_dim or 0,
        v_head_dim=c.v_head_dim or 0,
        mamba_d_state=(c.mamba_d_state or 16) if mixer == "mamba" else 0,
        mamba_d_conv=(c.mamba_d_conv or 4) if mixer == "mamba" else 0,
        mamba_d_inner=d_inner, mamba_dt_rank=dt_rank,
        vision_params=vision[0], vision_matrices=vision[1], facts=_facts(cfg, c, fam),
    )
