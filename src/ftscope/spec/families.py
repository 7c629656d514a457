"""What each supported model_type builds that its config.json does not say.

A config names sizes; the implementation decides the layout (fused QKV, biases, norms per block, which layers are
MoE) and fills keys the file leaves out from its config class's defaults (Gemma 3's multimodal configs state four
text keys and rely on Gemma3TextConfig for the rest). Everything here is read from transformers' modeling and
configuration code, and a test builds shrunk configs of every family on the meta device to hold it to that.
"""
from __future__ import annotations

from typing import Any

# model_type -> layout facts. Keys: qkv_bias, o_bias, qk_norm (head | full), norms_per_layer, norm (layernorm),
# attention (mla | fused_qkv), qkv_name, parallel, mlp (plain | fused_gated), mlp_bias, mlp_names, o_name,
# lm_head_bias, tie_default (the config class's tie_word_embeddings default: in transformers 5 False but for the
# families marked), expert_names, expert_bias, router_bias, sinks (one learned logit per head per layer),
# mixer (mamba), aliases (normalized field -> this family's config key, ahead of the shared table),
# moe_step_key (config key giving the MoE layer interval, counted from step-1), defaults (the config class's
# defaults where they are not derived from other keys: transformers fills a missing key with them).
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {}, "mistral": {"defaults": {"num_key_value_heads": 8}},
    "qwen2": {"qkv_bias": True, "defaults": {"num_key_value_heads": 32}},
    "qwen3": {"qk_norm": "head", "defaults": {"num_key_value_heads": 32, "head_dim": 128}},
    # a Llama with NoPE layers (no_rope_layers): the same weights
    "smollm3": {"tie_default": True, "defaults": {"num_key_value_heads": 4}},
    "gemma": {"tie_default": True, "defaults": {"num_key_value_heads": 16, "head_dim": 256}},
    "gemma2": {"norms_per_layer": 4, "tie_default": True, "defaults": {"num_key_value_heads": 4, "head_dim": 256}},
    "gemma3_text": {"norms_per_layer": 4, "qk_norm": "head", "tie_default": True,
                    "defaults": {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
                                 "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                                 "head_dim": 256}},
    "olmo2": {"qk_norm": "full"},  # post-attention and post-feedforward norms: two per block, none before
    "phi3": {"attention": "fused_qkv", "qkv_name": "qkv_proj", "mlp": "fused_gated"},
    "mixtral": {"expert_names": ("w1", "w3", "w2"), "defaults": {"num_key_value_heads": 8}},
    "qwen2_moe": {"qkv_bias": True, "defaults": {"num_key_value_heads": 16}},
    "qwen3_moe": {"qk_norm": "head", "defaults": {"num_key_value_heads": 4}},
    "olmoe": {"qk_norm": "full"},
    "deepseek_v2": {"attention": "mla"}, "deepseek_v3": {"attention": "mla", "defaults": {"num_key_value_heads": 128}},
    # Llama 4: the MoE layers' experts and their one shared expert are `intermediate_size` wide, the dense
    # layers between them `intermediate_size_mlp`; the QK norm is an L2 norm without weights.
    "llama4_text": {"moe_step_key": "interleave_moe_layer_step",
                    "defaults": {"num_key_value_heads": 8, "head_dim": 128, "intermediate_size_mlp": 16384},
                    "aliases": {"intermediate_size": ("intermediate_size_mlp",),
                                "moe_intermediate_size": ("intermediate_size",),
                                "shared_expert_intermediate_size": ("intermediate_size",)}},
    # gpt-oss: biases on attention, router and experts; a learned attention-sink logit per head
    "gpt_oss": {"expert_bias": True, "router_bias": True, "sinks": True,
                "defaults": {"num_key_value_heads": 8, "head_dim": 64, "attention_bias": True}},
    "phi": {"parallel": True, "norm": "layernorm", "qkv_bias": True, "o_bias": True, "mlp": "plain",
            "mlp_bias": True, "norms_per_layer": 1, "lm_head_bias": True, "o_name": "dense"},
    "falcon": {"parallel": True, "norm": "layernorm", "attention": "fused_qkv", "mlp": "plain",
               "mlp_names": ("dense_h_to_4h", "dense_4h_to_h"), "o_name": "dense", "tie_default": True},
    "blackmamba": {"mixer": "mamba", "tie_default": True},
}

TRANSFORMERS_FAMILIES = frozenset(FAMILIES) - {"blackmamba"}

# Multimodal wrappers: what AutoModelForCausalLM builds from them. Gemma 3 builds the whole
# Gemma3ForConditionalGeneration (SigLIP tower and projector included); Llama 4 builds the text model only.
WRAPPERS: dict[str, str | None] = {"gemma3": "siglip", "llama4": None}

_SIGLIP_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_channels": 3,
                    "image_size": 224, "patch_size": 16, "vision_use_head": True}


def _siglip(vision: dict[str, Any]) -> dict[str, Any]:
    return {**_SIGLIP_DEFAULTS, **{k: x for k, x in vision.items() if x is not None}}


def siglip_tower_params(vision: dict[str, Any], text_hidden: int) -> int:
    """Parameters of Gemma 3's SigLIP vision tower and multimodal projector (SiglipVisionModel +
    Gemma3MultiModalProjector), from its vision_config."""
    v = _siglip(vision)
    h, inter, patch = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["patch_size"])
    patches = (int(v["image_size"]) // patch) ** 2
    embeddings = v["num_channels"] * patch * patch * h + h + patches * h   # patch conv (+bias), positions
    attention = 4 * (h * h + h)                                           # q, k, v, out with biases
    mlp = h * inter + inter + inter * h + h
    layer = attention + mlp + 2 * 2 * h                                   # two LayerNorms (weight, bias)
    tower = embeddings + int(v["num_hidden_layers"]) * layer + 2 * h      # post-LayerNorm
    if v["vision_use_head"]:  # attention-pooling head: probe, MultiheadAttention, LayerNorm, MLP
        tower += h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + mlp
    projector = h * text_hidden + h                                       # projection matrix, RMSNorm
    return tower + projector


def vision_tower(cfg: dict[str, Any], text_hidden: int) -> tuple[int, tuple[int, int, int]]:
    """(parameters, (hidden, intermediate, layers) of its encoder blocks) of what transformers builds beside the
    language model of a multimodal config; (0, ()) when it builds nothing there."""
    vision = cfg.get("vision_config")
    if WRAPPERS.get(str(cfg.get("model_type"))) != "siglip" or not isinstance(vision, dict):
        return 0, ()
    v = _siglip(vision)
    dims = (int(v["hidden_size"]), int(v["intermediate_size"]), int(v["num_hidden_layers"]))
    return siglip_tower_params(vision, text_hidden), dims


def moe_interval_layers(layers: int, step: int) -> tuple[int, ...]:
    """Llama 4's default moe_layers: every `step`-th layer, starting at step - 1."""
    step = max(int(step), 1)
    return tuple(range(step - 1, layers, step))

