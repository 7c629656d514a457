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

# Multimodal wrappers: the vision tower a fine-tuning load builds beside the language model. Gemma 3:
# AutoModelForCausalLM builds the whole Gemma3ForConditionalGeneration (SigLIP tower and projector included);
# Llama 4: it builds the text model only. Mistral 3 (Mistral Small 3.1 / 3.2): AutoModelForCausalLM refuses
# Mistral3Config (transformers 5.24), so it is counted as AutoModelForImageTextToText builds it (the Auto class
# transformers' Mistral 3 docs load these ids with): Mistral3ForConditionalGeneration, Pixtral tower and projector.
WRAPPERS: dict[str, str | None] = {"gemma3": "siglip", "llama4": None, "mistral3": "pixtral"}

VisionMatrix = tuple[str, int, int, bool, int]
"""One nn.Linear of a vision tower or projector: (module name, in, out, bias, how many blocks hold it)."""

_SIGLIP_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_channels": 3,
                    "image_size": 224, "patch_size": 16, "vision_use_head": True}
# PixtralVisionConfig's defaults fill a vision_config's missing keys; with no vision_config at all Mistral3Config
# builds its own default tower (Mistral Small 3.1's: patch 14), which only the patch size sets apart
_PIXTRAL_DEFAULTS = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_channels": 3,
                     "patch_size": 16}
_MISTRAL3_VISION = {**_PIXTRAL_DEFAULTS, "patch_size": 14}


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


def _siglip_matrices(vision: dict[str, Any]) -> tuple[VisionMatrix, ...]:
    """The SigLIP encoder blocks' Linears (the projector is a bare matrix, not an nn.Linear)."""
    v = _siglip(vision)
    h, inter, layers = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["num_hidden_layers"])
    return (*((name, h, h, True, layers) for name in ("q_proj", "k_proj", "v_proj", "out_proj")),
            ("fc1", h, inter, True, layers), ("fc2", inter, h, True, layers))


def _pixtral(cfg: dict[str, Any]) -> dict[str, Any]:
    vision = cfg.get("vision_config")
    if not isinstance(vision, dict):
        return dict(_MISTRAL3_VISION)
    return {**_PIXTRAL_DEFAULTS, **{k: x for k, x in vision.items() if x is not None}}


def _patch_area(patch: Any) -> int:
    """The patch conv's kernel area: patch_size is an int or a (height, width) pair."""
    if isinstance(patch, (list, tuple)):
        return int(patch[0]) * int(patch[-1])
    return int(patch) ** 2


def _pixtral_matrices(cfg: dict[str, Any], text_hidden: int) -> tuple[VisionMatrix, ...]:
    """Mistral 3's Linears beside the LM: the Pixtral blocks' (SwiGLU MLP, no biases) and the projector's
    (patch merger over spatial_merge_size^2 patches, then two layers to the text width)."""
    v = _pixtral(cfg)
    h, inter, layers = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["num_hidden_layers"])
    merge = int(cfg.get("spatial_merge_size") or 2)
    feature_layer = cfg.get("vision_feature_layer", -1)
    features = len(feature_layer) if isinstance(feature_layer, (list, tuple)) else 1  # concatenated layers
    bias = bool(cfg.get("multimodal_projector_bias", False))
    return (*((name, h, h, False, layers) for name in ("q_proj", "k_proj", "v_proj", "o_proj")),
            ("gate_proj", h, inter, False, layers), ("up_proj", h, inter, False, layers),
            ("down_proj", inter, h, False, layers),
            ("merging_layer", h * merge * merge, h, False, 1),
            ("linear_1", h * features, text_hidden, bias, 1), ("linear_2", text_hidden, text_hidden, bias, 1))


def pixtral_tower_params(cfg: dict[str, Any], text_hidden: int) -> int:
    """Parameters of Mistral 3's Pixtral vision tower and multimodal projector (PixtralVisionModel +
    Mistral3MultiModalProjector), from the wrapper config (the projector reads keys outside vision_config).
    Pixtral's positions are rotary (buffers, no parameters)."""
    v = _pixtral(cfg)
    h, layers = int(v["hidden_size"]), int(v["num_hidden_layers"])
    linears = sum((i * o + (o if bias else 0)) * n for _, i, o, bias, n in _pixtral_matrices(cfg, text_hidden))
    patch_conv = int(v["num_channels"]) * _patch_area(v["patch_size"]) * h  # no bias
    norms = h + layers * 2 * h + h  # ln_pre, attention_norm and ffn_norm per block, the projector's RMSNorm
    return linears + patch_conv + norms


def vision_tower(cfg: dict[str, Any], text_hidden: int) -> tuple[int, tuple[VisionMatrix, ...]]:
    """(parameters, its nn.Linears) of what the fine-tuning load of a multimodal config builds beside the
    language model; (0, ()) when it builds nothing there."""
    kind = WRAPPERS.get(str(cfg.get("model_type")))
    if kind == "pixtral":
        return pixtral_tower_params(cfg, text_hidden), _pixtral_matrices(cfg, text_hidden)
    vision = cfg.get("vision_config")
    if kind != "siglip" or not isinstance(vision, dict):
        return 0, ()
    return siglip_tower_params(vision, text_hidden), _siglip_matrices(vision)


def moe_interval_layers(layers: int, step: int) -> tuple[int, ...]:
    """Llama 4's default moe_layers: every `step`-th layer, starting at step - 1."""
    step = max(int(step), 1)
    return tuple(range(step - 1, layers, step))

