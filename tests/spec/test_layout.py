"""Block layouts counted by hand from the published architectures where they differ from a plain Llama block:
Phi-3's fused projections, gpt-oss's biases and attention sinks, Gemma 3's and Mistral 3's vision
Linears as LoRA targets."""
from __future__ import annotations

import pytest

from ftscope import FtscopeError
from ftscope.spec.resolve import load_model

R = 16


def test_phi3_fuses_qkv_and_gate_up_into_one_matrix_each():
    m = load_model("phi-4")
    h, heads, kv, d, inter, layers = 5120, 40, 10, 128, 17920, 40
    assert sorted(lin.names[0] for lin, _ in m.linears()) == ["down_proj", "gate_up_proj", "o_proj", "qkv_proj"]
    assert m.lora_params(R, ["qkv_proj"]) == R * (h + (heads + 2 * kv) * d) * layers
    assert m.lora_params(R, ["gate_up_proj"]) == R * (h + 2 * inter) * layers  # one adapter on the fused matrix
    assert m.lora_params(R, "all-linear") == m.lora_params(R, "attention") + m.lora_params(R, "mlp")
    with pytest.raises(FtscopeError, match="did you mean: qkv_proj"):
        m.lora_targets(["q_proj"])


def test_gpt_oss_block_has_biases_everywhere_and_a_sink_per_head():
    m = load_model("gpt-oss-20b")
    h, heads, kv, d, experts, inter, layers = 2880, 64, 8, 64, 32, 2880, 24
    attention = h * heads * d + heads * d + 2 * (h * kv * d + kv * d) + heads * d * h + h  # q, k, v, o with biases
    router = h * experts + experts
    expert_stack = experts * (h * 2 * inter + 2 * inter + inter * h + h)  # gate_up and down, with their biases
    norms_and_sinks = 2 * h + heads
    block = attention + router + expert_stack + norms_and_sinks
    vocab = 201_088
    assert m.total_params == layers * block + 2 * vocab * h + h
    parts = m.params_by_component()
    assert parts["router"] == layers * router and parts["experts"] == layers * expert_stack


def test_gemma3_vision_linears_answer_to_all_linear_and_names_not_to_attention():
    m = load_model("gemma-3-4b")
    h, inter, layers = 1152, 4304, 27
    vision_qv = R * 2 * (h + h) * layers
    text_qv = m.lora_params(R, ["q_proj", "v_proj"]) - vision_qv
    assert text_qv == R * 34 * ((2560 + 8 * 256) + (2560 + 4 * 256))
    vision_all = R * layers * (4 * 2 * h + 2 * (h + inter))
    assert m.lora_params(R, "all-linear") == m.lora_params(R, "attention") + m.lora_params(R, "mlp") + vision_all
    assert m.lora_params(R, ["fc1"]) == R * (h + inter) * layers  # a name only the tower has


def test_mistral3_pixtral_and_projector_linears_answer_to_all_linear_and_names():
    m = load_model("mistral-small-3.1-24b")
    h, inter, layers, text = 1024, 4096, 24, 5120
    vision_all = R * (layers * (4 * 2 * h + 3 * (h + inter)) + (4 * h + h) + (h + text) + 2 * text)
    assert m.lora_params(R, "all-linear") == m.lora_params(R, "attention") + m.lora_params(R, "mlp") + vision_all
    text_o = R * 40 * (32 * 128 + text)
    assert m.lora_params(R, ["o_proj"]) == text_o + R * layers * 2 * h  # Pixtral's attention names its o_proj so too
    assert m.lora_params(R, ["merging_layer", "linear_1"]) == R * (5 * h + h + text)


def test_text_only_models_have_no_vision_part():
    m = load_model("gemma-3-1b")
    assert m.vision_params == 0 and not m.vision_linears and "vision" not in m.params_by_component()
