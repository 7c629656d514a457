"""normalize(): one alias table turns every family's config.json into the same Arch fields."""
from __future__ import annotations

import pytest

from ftscope import FtscopeError, catalog
from ftscope.spec.architecture import FAMILIES, TRANSFORMERS_FAMILIES, model_type_of, normalize

LLAMA = dict(model_type="llama", hidden_size=64, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=96, vocab_size=256)


def test_alias_keys_mean_the_same_as_hf_keys():
    gpt_style = dict(model_type="llama", n_embd=64, n_layer=4, n_head=8, n_head_kv=2, n_inner=96,
                     padded_vocab_size=256)
    a, b = normalize(gpt_style), normalize(LLAMA)
    for field in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                  "vocab_size"):
        assert getattr(a, field) == getattr(b, field), field


def test_head_dim_defaults_to_hidden_over_heads_and_explicit_head_dim_wins():
    assert normalize(LLAMA).head_dim == 8
    assert normalize({**LLAMA, "head_dim": 32}).head_dim == 32


def test_kv_heads_default_to_heads_mha():
    cfg = {k: v for k, v in LLAMA.items() if k != "num_key_value_heads"}
    assert normalize(cfg).num_kv_heads == 8


def test_falcon_multi_query_without_new_architecture_has_one_kv_head():
    cfg = dict(model_type="falcon", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=256,
               multi_query=True, new_decoder_architecture=False)
    assert normalize(cfg).num_kv_heads == 1
    assert normalize({**cfg, "new_decoder_architecture": True, "num_kv_heads": 2}).num_kv_heads == 2


def test_nested_text_config_is_read():
    wrapped = {"model_type": "llama", "architectures": ["X"], "text_config": LLAMA}
    assert normalize(wrapped).hidden_size == 64


def test_model_type_is_inferred_from_architectures():
    assert model_type_of({"architectures": ["LlamaForCausalLM"]}) == "llama"
    assert model_type_of({"architectures": ["BlackMambaForCausalLM"]}) == "blackmamba"


def test_mixtral_experts_and_top_k():
    a = normalize(catalog.model_config("mixtral-8x7b"))
    assert (a.num_experts, a.top_k, a.moe_intermediate_size) == (8, 2, 14336)
    assert a.moe_layers == tuple(range(32))


def test_qwen_moe_shared_expert_and_moe_intermediate():
    a = normalize(catalog.model_config("qwen1.5-moe-a2.7b"))
    assert (a.num_experts, a.top_k, a.moe_intermediate_size, a.shared_expert_intermediate_size) == (60, 4, 1408, 5632)


def test_deepseek_dense_first_layers_and_shared_experts():
    a = normalize(catalog.model_config("deepseek-v2-lite"))
    assert a.attention == "mla"
    assert (a.num_experts, a.top_k) == (64, 6)
    assert a.moe_layers == tuple(range(1, 27))  # first_k_dense_replace: 1
    assert a.shared_expert_intermediate_size == 2 * 1408  # n_shared_experts x moe_intermediate_size
    assert a.q_lora_rank is None and a.kv_lora_rank == 512


def test_qwen_moe_sparse_step_and_mlp_only_layers_pick_the_moe_layers():
    cfg = dict(LLAMA, model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
               decoder_sparse_step=2, mlp_only_layers=[3])
    assert normalize(cfg).moe_layers == (1,)


def test_blackmamba_alternates_mamba_and_moe_blocks():
    a = normalize(catalog.model_config("blackmamba-2.8b"))
    assert a.mixer_pattern == ("mamba", "moe") * 18
    assert (a.num_experts, a.top_k) == (8, 1)
    assert (a.hidden_size, a.moe_intermediate_size, a.vocab_size) == (1472, 3872, 50304)
    assert (a.mamba_d_inner, a.mamba_dt_rank, a.mamba_d_state, a.mamba_d_conv) == (2944, 92, 16, 4)
    assert a.tie_embeddings


def test_tie_default_follows_transformers_when_the_key_is_absent():
    # each config class's own default (transformers 5): LlamaConfig unties, Gemma and SmolLM3 tie
    assert not normalize(LLAMA).tie_embeddings
    assert normalize({**LLAMA, "model_type": "gemma"}).tie_embeddings
    assert normalize({**LLAMA, "model_type": "smollm3"}).tie_embeddings
    assert normalize({**LLAMA, "tie_word_embeddings": True}).tie_embeddings


def test_every_family_but_blackmamba_has_a_transformers_implementation():
    assert TRANSFORMERS_FAMILIES == set(FAMILIES) - {"blackmamba"}


# ---- errors -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg, message", [
    ({k: v for k, v in LLAMA.items() if k != "hidden_size"}, "no 'hidden_size'"),
    ({**LLAMA, "hidden_size": 0}, "hidden_size must be an integer from 1"),
    ({**LLAMA, "hidden_size": 64.5}, "hidden_size must be an integer from 1"),
    ({**LLAMA, "hidden_size": "64"}, "hidden_size must be an integer from 1"),
    ({**LLAMA, "hidden_size": True}, "hidden_size must be an integer from 1"),
    ({**LLAMA, "hidden_size": float("nan")}, "hidden_size must be an integer"),
    ({**LLAMA, "hidden_size": float("inf")}, "hidden_size must be an integer"),
    ({**LLAMA, "num_attention_heads": [8]}, "num_attention_heads must be an integer"),
    ({**LLAMA, "num_key_value_heads": "two"}, "num_key_value_heads must be an integer"),
    ({**LLAMA, "max_position_embeddings": float("nan")}, "max_position_embeddings must be an integer"),
    ({**LLAMA, "max_position_embeddings": -1}, "max_position_embeddings must be an integer"),
    ({**LLAMA, "head_dim": 0}, "head_dim must be an integer from 1"),
    ({**LLAMA, "head_dim": -8}, "head_dim must be an integer from 1"),
    ({**LLAMA, "q_lora_rank": "big"}, "q_lora_rank must be an integer"),
    ({**LLAMA, "model_type": "mixtral", "num_local_experts": [4]}, "num_local_experts must be an integer"),
    ({**LLAMA, "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": "0,1"},
     "mlp_only_layers must be a list"),
    ({**LLAMA, "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": [-1]},
     r"mlp_only_layers\[0\] must be an integer from 0"),
    ({**LLAMA, "num_hidden_layers": 10**30}, "num_hidden_layers must be an integer from 1 to 100,000"),
    ({**LLAMA, "num_attention_heads": 7, "num_key_value_heads": 7}, "not a multiple of num_attention_heads"),
    ({**LLAMA, "model_type": ["llama"]}, "model_type must be a string"),
    ({"model_type": "blackmamba", "hidden_size": 64, "num_layers": 2, "vocab_size": 256,
      "mamba_moe_layers": ["r", "x"]}, "'r' or an expert count"),
    ({"n_embd": "wide", "model_type": "llama", "n_layer": 2, "vocab_size": 10, "n_head": 2}, "n_embd must be"),
    ({**LLAMA, "num_key_value_heads": 3}, "multiple of num_key_value_heads"),
    ({**LLAMA, "model_type": "gpt_bigcode"}, "not supported"),
    ({k: v for k, v in LLAMA.items() if k != "model_type"}, "no 'model_type'"),
    ({**LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 5}, "between 1 and"),
    ({**LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 0}, "between 1 and"),
    ({"model_type": "blackmamba", "hidden_size": 64, "num_layers": 3, "vocab_size": 256,
      "mamba_moe_layers": ["r", "8"]}, "lists 2 blocks"),
    ([1, 2], "JSON object"),
])
def test_unusable_config_is_a_one_line_ftscope_error(cfg, message):
    with pytest.raises(FtscopeError, match=message) as info:
        normalize(cfg)
    assert "\n" not in str(info.value)
