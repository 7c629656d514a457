"""The 2025 families: each preset's parameter count against the figure its publisher gives (model card, report or
Hub), to the precision published, and the family facts that are not in any config key. The exact count (what
transformers builds) is held by the parity tests in test_model.py."""
from __future__ import annotations

import pytest

from ftscope import catalog
from ftscope.spec.architecture import normalize
from ftscope.spec.families import (FAMILIES, TRANSFORMERS_FAMILIES, pixtral_tower_params, siglip_tower_params,
                                   vision_tower)
from ftscope.spec.resolve import load_model

B = 1e9

# preset -> (published total in billions as printed, where). Totals are what AutoModelForCausalLM builds; see
# test_published_figures_that_count_something_else for the three that publish a different quantity.
PUBLISHED_TOTAL = {
    "llama-3.3-70b": ("70.6", "Hub: 70.6B params"),
    "llama-4-maverick": ("400", "model card: 400B total"),
    "qwen3-0.6b": ("0.6", "model card: 0.6B"),
    "qwen3-8b": ("8.2", "model card: 8.2B"),
    "qwen3-32b": ("32.8", "model card: 32.8B"),
    "gemma-3-4b": ("4.3", "Hub: 4.3B"),
    "gemma-3-27b": ("27.4", "Hub: 27.4B"),
    "mistral-7b-v0.3": ("7.25", "Hub: 7.25B"),
    "mistral-small-24b": ("23.6", "Hub: 23.6B ('24B')"),
    "mistral-small-3.1-24b": ("24", "model card and transformers docs: 24B (a tied lm_head would read 23)"),
    "phi-3-mini-4k": ("3.8", "model card: 3.8B"),
    "phi-4": ("14.7", "Hub: 14.7B ('14B')"),
    "deepseek-v3": ("671", "model card: 671B total (685B with the MTP module)"),
    "gpt-oss-20b": ("20.91", "model card table: 20.91B total"),
    "gpt-oss-120b": ("116.83", "model card table: 116.83B total"),
    "olmo-2-7b": ("7.30", "Hub: 7.30B"),
    "olmo-2-13b": ("13.7", "Hub: 13.7B"),
    "smollm3-3b": ("3.08", "Hub: 3.08B"),
}

# preset -> (published non-embedding or active count in billions, what it counts)
PUBLISHED_PART = {
    "qwen3-0.6b": ("0.44", "non_embedding"),
    "qwen3-8b": ("6.95", "non_embedding"),
    "qwen3-32b": ("31.2", "non_embedding"),
    "gemma-3-1b": ("0.698", "non_embedding"),      # Gemma 3 report, table 1 (text; vision counted apart)
    "gemma-3-4b": ("3.209", "non_embedding"),
    "gemma-3-27b": ("25.600", "non_embedding"),
    "llama-4-scout": ("17", "active"),             # model card: 17B active, embeddings included
    "llama-4-maverick": ("17", "active"),
    "deepseek-v3": ("37", "active_matmul"),        # 37B activated: the input embedding is a lookup
    "gpt-oss-20b": ("3.61", "active_matmul"),      # model card table: active, unembedding counted
    "gpt-oss-120b": ("5.13", "active_matmul"),
}


def _rounded(value: float, printed: str) -> str:
    digits = len(printed.split(".")[1]) if "." in printed else 0
    return f"{value / B:.{digits}f}"


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTAL))
def test_total_matches_the_published_figure_to_its_precision(name):
    printed, _ = PUBLISHED_TOTAL[name]
    total = load_model(name).total_params
    if name == "llama-4-maverick":  # "400B" is a round figure, not a 3-digit count
        assert abs(total / B - 400) / 400 < 0.005
    else:
        assert _rounded(total, printed) == printed


def _non_embedding(name: str) -> int:
    m = load_model(name)  # embedding and an untied LM head out; a vision tower is counted apart too
    return m.total_params - m.embedding_params - m.lm_head_params - m.vision_params


@pytest.mark.parametrize("name", sorted(PUBLISHED_PART))
def test_published_part_matches(name):
    printed, what = PUBLISHED_PART[name]
    m = load_model(name)
    value = {"non_embedding": lambda: _non_embedding(name),
             "active": lambda: m.active_params(),
             "active_matmul": lambda: m.active_params() - m.embedding_params}[what]()
    assert _rounded(value, printed) == printed


def test_published_figures_that_count_something_else():
    # Llama 4 Scout's "109B total" counts the vision tower; AutoModelForCausalLM builds Llama4ForCausalLM (text)
    scout = load_model("llama-4-scout")
    assert 107 * B < scout.total_params < 109 * B and scout.vision_params == 0
    # Gemma 3 report: "417M" vision encoder = the SigLIP tower without the 2.9M (4b) projector
    for name, text_hidden in (("gemma-3-4b", 2560), ("gemma-3-27b", 5376)):
        m = load_model(name)
        projector = 1152 * text_hidden + 1152
        assert round((m.vision_params - projector) / 1e6) == 417


def test_siglip_tower_counts_its_head_when_the_config_asks_for_one():
    v = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "image_size": 28, "patch_size": 14}
    without = siglip_tower_params({**v, "vision_use_head": False}, 64)
    with_head = siglip_tower_params(v, 64)  # SiglipVisionConfig's default is a head
    h = 32
    assert with_head - without == h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * 48 + 48 + 48 * h + h)


def test_only_wrappers_whose_causal_lm_builds_a_tower_count_one():
    gemma = catalog.model_config("gemma-3-4b")
    llama4 = catalog.model_config("llama-4-scout")
    assert vision_tower(gemma, 2560)[1][-1] == ("fc2", 4304, 1152, True, 27)
    assert vision_tower(llama4, 5120) == (0, ())  # Llama4ForCausalLM drops the vision model
    assert vision_tower(catalog.model_config("mistral-small-3.1-24b"), 5120)[1][-1] == ("linear_2", 5120, 5120, False, 1)
    assert vision_tower(catalog.model_config("qwen3-8b"), 4096) == (0, ())


def test_pixtral_tower_and_projector_counted_by_hand():
    cfg = catalog.model_config("mistral-small-3.1-24b")
    h, inter, layers, patch, text = 1024, 4096, 24, 14, 5120
    block = 4 * h * h + 3 * h * inter + 2 * h            # q, k, v, o and a SwiGLU MLP, no biases; two RMSNorms
    tower = 3 * patch * patch * h + h + layers * block    # patch conv (no bias), ln_pre; rotary positions
    projector = h + 4 * h * h + h * text + text * text    # RMSNorm, 2x2 patch merger, linear_1, linear_2
    assert pixtral_tower_params(cfg, text) == tower + projector == load_model("mistral-small-3.1-24b").vision_params
    assert round(tower / 1e8) == 4                        # Pixtral's "400M vision encoder"
    biased = {**cfg, "multimodal_projector_bias": True, "vision_feature_layer": [-1, -2]}
    assert pixtral_tower_params(biased, text) - pixtral_tower_params(cfg, text) == h * text + 2 * text
    assert pixtral_tower_params({"model_type": "mistral3"}, text) == tower + projector  # Mistral3Config's default


def test_gemma3_text_config_takes_the_config_class_defaults_it_leaves_out():
    a = normalize(catalog.model_config("gemma-3-4b"))
    assert "num_attention_heads" not in catalog.model_config("gemma-3-4b")["text_config"]
    assert (a.num_heads, a.num_kv_heads, a.head_dim, a.vocab_size, a.tie_embeddings) == (8, 4, 256, 262_208, True)


def test_llama4_moe_interleaving_and_widths():
    scout, maverick = normalize(catalog.model_config("llama-4-scout")), normalize(catalog.model_config("llama-4-maverick"))
    assert scout.moe_layers == tuple(range(48))
    assert maverick.moe_layers == tuple(range(1, 48, 2))
    for a in (scout, maverick):
        assert (a.intermediate_size, a.moe_intermediate_size, a.shared_expert_intermediate_size) == (16384, 8192, 8192)
        assert a.top_k == 1 and not a.tie_embeddings


def test_deepseek_v3_has_three_dense_layers_then_256_experts_and_a_shared_one():
    a = normalize(catalog.model_config("deepseek-v3"))
    assert a.moe_layers == tuple(range(3, 61))
    assert (a.num_experts, a.top_k, a.shared_expert_intermediate_size) == (256, 8, 2048)
    assert (a.attention, a.q_lora_rank, a.kv_lora_rank) == ("mla", 1536, 512)


def test_family_table_keys_are_known():
    known = {"qkv_bias", "o_bias", "qk_norm", "norms_per_layer", "norm", "attention", "qkv_name", "parallel", "mlp",
             "mlp_bias", "mlp_names", "o_name", "lm_head_bias", "tie_default", "expert_names", "expert_bias",
             "router_bias", "sinks", "mixer", "aliases", "moe_step_key", "defaults"}
    for family, facts in FAMILIES.items():
        assert set(facts) <= known, family
    assert TRANSFORMERS_FAMILIES == set(FAMILIES) - {"blackmamba"}
