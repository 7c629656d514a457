"""One alias table that turns any supported HF config.json into the same normalized fields.

Families differ in key names (Mixtral `num_local_experts`, Qwen-MoE `num_experts`, DeepSeek `n_routed_experts`,
GPT-style `n_embd`), in nesting (`text_config`) and in layout (fused QKV, parallel blocks, MLA, Mamba).
Everything downstream reads `Arch`, never the raw config.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import FtscopeError
from .families import FAMILIES, TRANSFORMERS_FAMILIES, moe_interval_layers, vision_tower

__all__ = ["ALIASES", "Arch", "FAMILIES", "TRANSFORMERS_FAMILIES", "model_type_of", "normalize"]

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
    """Parameters AutoModelForCausalLM builds beside the language model (Gemma 3's SigLIP tower and projector)."""
    vision_dims: tuple[int, ...] = ()
    """(hidden, intermediate, layers) of that vision tower's encoder blocks, whose Linears LoRA can target."""
    facts: tuple[tuple[str, Any], ...] = ()

    def fact(self, key: str, default: Any = None) -> Any:
        return dict(self.facts).get(key, default)


def _get(cfg: dict[str, Any], field: str, default: Any = None) -> Any:
    for key in ALIASES.get(field, (field,)):
        if key in cfg and cfg[key] is not None:
            return cfg[key]
    return default


def _positive_int(cfg: dict[str, Any], field: str, default: Any = None) -> int:
    value = _get(cfg, field, default)
    if value is None:
        raise FtscopeError(f"config.json has no '{ALIASES.get(field, (field,))[0]}' (needed for {field})")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or int(value) != value:
        raise FtscopeError(f"config.json field for {field} must be a positive integer, got {value!r}")
    return int(value)


def model_type_of(cfg: dict[str, Any]) -> str:
    mt = cfg.get("model_type")
    if mt is None and cfg.get("architectures"):
        arch = str(cfg["architectures"][0]).lower()
        mt = "blackmamba" if "mamba" in arch else arch.replace("forcausallm", "")
    if mt is None and ("mamba_moe_layers" in cfg or "mamba" in str(cfg.get("_name_or_path", "")).lower()):
        mt = "blackmamba"
    if mt is None:
        raise FtscopeError("config.json has no 'model_type'; cannot tell the architecture")
    return str(mt)


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


def _experts(cfg: dict[str, Any], inter: int) -> dict[str, int]:
    experts = int(_get(cfg, "num_experts", 0) or 0)
    top_k = int(_get(cfg, "top_k", 0) or 0) if experts else 0
    if experts and not 1 <= top_k <= experts:
        raise FtscopeError(f"experts per token ({top_k}) must be between 1 and the number of experts ({experts})")
    moe_inter = int(_get(cfg, "moe_intermediate_size", 0) or 0) or (inter if experts else 0)
    shared_inter = int(_get(cfg, "shared_expert_intermediate_size", 0) or 0)
    n_shared = int(_get(cfg, "num_shared_experts", 0) or 0)
    if n_shared and not shared_inter:
        shared_inter = n_shared * moe_inter
    return {"num_experts": experts, "top_k": top_k, "moe_intermediate_size": moe_inter,
            "shared_expert_intermediate_size": shared_inter}


def _mamba_pattern(cfg: dict[str, Any], layers: int, moe: dict[str, int]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    # BlackMamba alternates Mamba ("r") and MoE ("8": 8 experts) blocks; num_layers counts both kinds.
    kinds = cfg.get("mamba_moe_layers") or ["r" if i % 2 == 0 else "8" for i in range(layers)]
    if len(kinds) != layers:
        raise FtscopeError(f"mamba_moe_layers lists {len(kinds)} blocks but num_layers is {layers}")
    pattern = tuple("mamba" if str(k).lower() == "r" else "moe" for k in kinds)
    if not moe["num_experts"] and "moe" in pattern:
        moe["num_experts"] = int(next(str(k) for k in kinds if str(k).lower() != "r"))
        moe["top_k"] = int(cfg.get("top_k") or 1)  # Zyphra's BlackMamba routes each token to one expert
    return pattern, tuple(i for i, kind in enumerate(pattern) if kind == "moe")


def _moe_layers(cfg: dict[str, Any], fam: dict[str, Any], layers: int) -> tuple[int, ...]:
    if isinstance(cfg.get("moe_layers"), list):  # Llama 4 states them, or derives them from its interval
        return tuple(sorted(int(i) for i in cfg["moe_layers"] if 0 <= int(i) < layers))
    if fam.get("moe_step_key"):
        return moe_interval_layers(layers, cfg.get(fam["moe_step_key"]) or 1)
    first_dense = int(_get(cfg, "first_dense_layers", 0) or 0)
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    mlp_only = set(cfg.get("mlp_only_layers", []) or [])
    # DeepSeek's moe_layer_freq is ignored, as transformers does (every published config sets 1)
    return tuple(i for i in range(layers) if i >= first_dense and i not in mlp_only and (i + 1) % step == 0)


def _facts(cfg: dict[str, Any], fam: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
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
    return tuple(sorted(facts.items()))


def normalize(cfg: dict[str, Any]) -> Arch:
    """Read an HF config.json dict into `Arch`; raises FtscopeError on anything unusable."""
    cfg, outer = _unwrap(cfg)
    mt = model_type_of(cfg)
    if mt not in FAMILIES:
        raise FtscopeError(f"model_type '{mt}' is not supported yet (supported: {', '.join(sorted(FAMILIES))})")
    fam = FAMILIES[mt]
    cfg = _family_view(cfg, fam)
    h = _positive_int(cfg, "hidden_size")
    layers = _positive_int(cfg, "num_layers")
    vocab = _positive_int(cfg, "vocab_size")
    heads = _positive_int(cfg, "num_heads", 1 if fam.get("mixer") == "mamba" else None)
    kv = _get(cfg, "num_kv_heads")
    if kv is None:
        kv = 1 if cfg.get("multi_query") and not cfg.get("new_decoder_architecture") else heads
    kv = _positive_int({"num_kv_heads": kv}, "num_kv_heads")
    if heads % kv:
        raise FtscopeError(f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv})")
    inter = _positive_int(cfg, "intermediate_size", 4 * h)
    moe = _experts(cfg, inter)
    mixer = fam.get("mixer", "attention")
    if mixer == "mamba":
        pattern, moe_layers = _mamba_pattern(cfg, layers, moe)
    else:
        pattern = ("attention",) * layers
        moe_layers = _moe_layers(cfg, fam, layers) if moe["num_experts"] else ()
    if moe["num_experts"] and not moe["moe_intermediate_size"]:
        moe["moe_intermediate_size"] = inter
    tie = _get(cfg, "tie_embeddings")
    if tie is None:
        tie = fam.get("tie_default", False)  # the config class's default (transformers 5)
    vision = vision_tower(outer, h)
    d_inner = dt_rank = 0
    if mixer == "mamba":
        d_inner = int(_get(cfg, "mamba_expand", 2)) * h
        dt_rank = int(cfg.get("dt_rank") or -(-h // 16)) if str(cfg.get("dt_rank", "auto")) != "auto" else -(-h // 16)
    return Arch(
        model_type=mt, hidden_size=h, num_layers=layers, num_heads=heads, num_kv_heads=kv,
        head_dim=int(_get(cfg, "head_dim") or h // heads), intermediate_size=inter, vocab_size=vocab,
        tie_embeddings=bool(tie), max_position_embeddings=int(_get(cfg, "max_position_embeddings", 0) or 0) or 4096,
        **moe, moe_layers=moe_layers, sliding_window=_get(cfg, "sliding_window"),
        attention=fam.get("attention", "gqa"), mixer_pattern=pattern,
        q_lora_rank=_get(cfg, "q_lora_rank"), kv_lora_rank=int(_get(cfg, "kv_lora_rank", 0) or 0),
        qk_nope_head_dim=int(_get(cfg, "qk_nope_head_dim", 0) or 0),
        qk_rope_head_dim=int(_get(cfg, "qk_rope_head_dim", 0) or 0), v_head_dim=int(_get(cfg, "v_head_dim", 0) or 0),
        mamba_d_state=int(_get(cfg, "mamba_d_state", 16) or 16) if mixer == "mamba" else 0,
        mamba_d_conv=int(_get(cfg, "mamba_d_conv", 4) or 4) if mixer == "mamba" else 0,
        mamba_d_inner=d_inner, mamba_dt_rank=dt_rank,
        vision_params=vision[0], vision_dims=vision[1], facts=_facts(cfg, fam),
    )
