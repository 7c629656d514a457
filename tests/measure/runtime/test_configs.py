"""The HF configs real models are built from (measure/runtime/configs.py): shrunk copies keep the structure
transformers needs (the builds themselves are checked in test_build.py; --shrink's text in test_options.py)."""
from __future__ import annotations

from ftscope import catalog
from ftscope.measure.runtime.configs import apply_shrink, shrink_config


def test_shrink_keeps_gqa_grouping_and_even_head_dim():
    cfg = shrink_config(catalog.model_config("mixtral-8x7b"), hidden=256)
    assert cfg["num_attention_heads"] // cfg["num_key_value_heads"] == 4  # 32 / 8 in the full model
    assert (cfg["hidden_size"] // cfg["num_attention_heads"]) % 2 == 0


def test_shrink_rounds_hidden_when_no_head_count_divides_it():
    cfg = shrink_config(catalog.model_config("falcon-180b"), hidden=256)  # 232 heads in groups of 29
    assert cfg["hidden_size"] % cfg["num_attention_heads"] == 0 and cfg["num_attention_heads"] % 29 == 0


def test_shrink_caps_top_k_and_keeps_a_moe_layer():
    cfg = shrink_config(catalog.model_config("olmoe-1b-7b"), experts=4, layers=1)
    assert cfg["num_experts"] == 4 and cfg["num_experts_per_tok"] == 4
    ds = shrink_config(catalog.model_config("deepseek-v2-lite"), layers=2, experts=4)
    assert ds["first_k_dense_replace"] == 1 and ds["n_group"] == 1


def test_apply_shrink_routes_config_size_keys_through_shrink_config():
    cfg = apply_shrink(catalog.model_config("llama-2-7b"), {"num_hidden_layers": 2, "hidden_size": 256,
                                                            "rms_norm_eps": 1e-5})
    assert cfg["num_hidden_layers"] == 2 and cfg["hidden_size"] == 256 and cfg["num_attention_heads"] == 2
    assert cfg["rms_norm_eps"] == 1e-5
