"""Activation coefficients (estimate/activations.py): what autograd keeps per token, per block."""
from __future__ import annotations

import math

import pytest

import ftscope
from ftscope.estimate.activations import LOSS_CHUNKS, activation_coefficients, block_inputs


def scn(model="llama-3.2-1b", mix=None):
    d = {"model": model, "hardware": {"gpu": "a100-80gb"}, "mix": {"attention": "flash", **(mix or {})},
         "workload": {"micro_batch_size": 1, "seq_len": 512}}
    return ftscope.load_scenario(d)


def coeffs(model="llama-3.2-1b", **mix):
    s = scn(model, mix)
    return activation_coefficients(s.model, s.mix, s.top_k), s


FIELDS = ("saved_per_token", "saved_per_token_quadratic", "layer_per_token", "layer_per_token_quadratic",
          "checkpoint_per_token", "head_per_token", "logits_saved_per_token", "logits_forward_extra_per_token",
          "logits_backward_extra_per_token")


@pytest.mark.parametrize("model", ["llama-3.2-1b", "mixtral-8x7b", "qwen1.5-moe-a2.7b", "blackmamba-2.8b",
                                   "deepseek-v2-lite", "phi-2", "falcon-180b", "gemma-2-9b"])
@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_coefficients_finite_and_non_negative(model, method):
    a, _ = coeffs(model, method=method, attention="eager")
    for f in FIELDS:
        v = getattr(a, f)
        assert math.isfinite(v) and v >= 0, f
    assert a.saved_per_token > 0


@pytest.mark.parametrize("fused", ["flash", "sdpa"])
def test_only_eager_has_quadratic_terms(fused):
    eager, _ = coeffs(attention="eager")
    fast, _ = coeffs(attention=fused)
    assert eager.saved_per_token_quadratic > 0 and eager.layer_per_token_quadratic > 0
    assert fast.saved_per_token_quadratic == 0 and fast.layer_per_token_quadratic == 0


def test_eager_scores_scale_with_heads_and_layers():
    # fp32 softmax + a 16-bit copy: at least 4 bytes per head per query x key in every attention block
    a, s = coeffs(attention="eager")
    arch = s.model.arch
    assert a.saved_per_token_quadratic >= 4 * arch.num_heads * s.model.num_layers
    assert a.saved_per_token_quadratic <= 8 * arch.num_heads * s.model.num_layers


def test_mamba_model_has_no_quadratic_term_even_with_eager():
    a, s = coeffs("blackmamba-2.8b", attention="eager")
    assert all(layer.mixer != "attention" for layer, _ in s.model.layer_groups)
    assert a.saved_per_token_quadratic == 0


def test_homogeneous_model_saves_layers_times_one_block():
    a, s = coeffs("llama-2-7b")
    assert len(s.model.layer_groups) == 1
    assert a.saved_per_token == pytest.approx(a.layer_per_token * s.model.num_layers, rel=1e-12)


def test_layer_is_the_largest_block():
    a, s = coeffs("qwen1.5-moe-a2.7b")
    assert a.layer_per_token <= a.saved_per_token
    assert a.layer_per_token >= a.saved_per_token / s.model.num_layers


def test_checkpointing_keeps_block_inputs_only():
    lora, s = coeffs("llama-2-7b", method="lora")
    h, layers = s.model.arch.hidden_size, s.model.num_layers
    # one bf16 hidden state per block per token
    assert lora.checkpoint_per_token == 2 * h * layers
    assert lora.checkpoint_per_token < lora.saved_per_token / 5
    # fp32 under full fine-tuning with AMP (fp32 parameters keep the residual stream in fp32)
    full_fp32, _ = coeffs("llama-2-7b", method="full", precision="fp32", attention="sdpa")
    assert full_fp32.checkpoint_per_token == 4 * h * layers


def test_full_saves_more_than_lora_saves_more_than_attention_only():
    full, _ = coeffs("llama-2-7b", method="full")
    lora_all, _ = coeffs("llama-2-7b", method="lora", lora_targets="all-linear")
    lora_att, _ = coeffs("llama-2-7b", method="lora", lora_targets="attention")
    assert full.saved_per_token > lora_all.saved_per_token > lora_att.saved_per_token


def test_lora_rank_adds_adapter_activations():
    r8, s = coeffs("llama-2-7b", method="lora", lora_rank=8)
    r64, _ = coeffs("llama-2-7b", method="lora", lora_rank=64)
    # lora_A output (rank wide, 16-bit) for each of the 7 targeted matrices in each block
    assert r64.saved_per_token - r8.saved_per_token == pytest.approx(2 * (64 - 8) * 7 * s.model.num_layers, rel=1e-9)


def test_fp32_saves_more_than_bf16():
    bf16, _ = coeffs(method="full", precision="bf16", attention="sdpa")
    fp32, _ = coeffs(method="full", precision="fp32", attention="sdpa")
    assert fp32.saved_per_token > bf16.saved_per_token


def test_moe_expert_activations_linear_in_top_k():
    by_k = {k: coeffs("mixtral-8x7b", method="qlora", experts_top_k=k)[0].saved_per_token for k in (1, 2, 4, 8)}
    step = by_k[2] - by_k[1]
    assert step > 0
    assert by_k[4] - by_k[2] == pytest.approx(2 * step, rel=1e-9)
    assert by_k[8] - by_k[4] == pytest.approx(4 * step, rel=1e-9)


def test_standard_loss_keeps_fp32_logits():
    a, s = coeffs("llama-3.1-8b", method="lora")
    v = s.model.arch.vocab_size
    assert a.logits_saved_per_token == 4 * v  # fp32 log-softmax of B x T x V
    assert a.logits_forward_extra_per_token >= 4 * v


def test_chunked_loss_upcasts_one_chunk_at_a_time():
    std, s = coeffs("llama-3.1-8b", method="lora")
    ch, _ = coeffs("llama-3.1-8b", method="lora", loss="chunked")
    v = s.model.arch.vocab_size
    # every chunk's bf16 logits and the fp32 log-softmax its eager cross-entropy saves (a torchtune 0.6.1 trace)
    assert ch.logits_saved_per_token == (2 + 4) * v
    assert ch.logits_forward_extra_per_token == pytest.approx(4 * v / LOSS_CHUNKS)
    assert ch.logits_backward_extra_per_token < std.logits_backward_extra_per_token
    # blocks are unaffected by the loss
    assert ch.saved_per_token == std.saved_per_token


def test_compiled_chunked_loss_keeps_the_logits_and_writes_only_their_gradient():
    """torchtune's compile_loss: Inductor saves each chunk's bf16 logits and per-row statistics, fuses the fp32
    upcast away, and its backward writes only the bf16 logits gradient (benchmarks/compiled_ce_saved.py)."""
    eager, s = coeffs("llama-3.1-8b", method="lora", loss="chunked")
    compiled, _ = coeffs("llama-3.1-8b", method="lora", loss="chunked", compile=True)
    v = s.model.arch.vocab_size
    assert compiled.logits_saved_per_token == 2 * v
    assert compiled.logits_forward_extra_per_token == 0.0
    assert compiled.logits_backward_extra_per_token == pytest.approx(2 * v / LOSS_CHUNKS)
    assert eager.logits_backward_extra_per_token == pytest.approx((4 + 2) * v / LOSS_CHUNKS)


def test_fused_loss_keeps_the_compute_dtype_logits_and_no_fp32_copy():
    std, s = coeffs("llama-3.1-8b", method="full", precision="bf16")
    fu, _ = coeffs("llama-3.1-8b", method="full", precision="bf16", loss="fused")
    v = s.model.arch.vocab_size
    assert fu.logits_saved_per_token == 2 * v
    assert fu.logits_forward_extra_per_token == 0
    assert fu.logits_backward_extra_per_token == 2 * v < std.logits_backward_extra_per_token
    assert fu.saved_per_token == std.saved_per_token


# --- 4-bit inputs a k-bit matmul keeps under non-reentrant checkpointing (recipe kbit_matmul_keeps_input) -----

def held(model="llama-2-7b", framework="llama-factory-2024", **mix):
    d = {"model": model, "framework": framework, "hardware": {"gpu": "a40"},
         "mix": {"method": "qlora", "gradient_checkpointing": True, "attention": "flash", **mix},
         "workload": {"micro_batch_size": 1, "seq_len": 512}}
    s = ftscope.load_scenario(d)
    return activation_coefficients(s.model, s.mix, s.top_k, s.recipe), s


def test_block_inputs_list_each_linear_once():
    for name in ("llama-2-7b", "mixtral-8x7b", "qwen1.5-moe-a2.7b", "deepseek-v2-lite", "blackmamba-2.8b"):
        s = scn(name)
        for layer, _ in s.model.layer_groups:
            listed = [id(lin) for g in block_inputs(layer, s.model, s.top_k) for lin in g.linears]
            assert len(listed) == len(set(listed)), name
            for g in block_inputs(layer, s.model, s.top_k):
                assert {lin.in_features for lin in g.linears} == {g.width}, (name, g.key)


def test_dense_qlora_holds_every_4bit_input_after_the_first_block():
    a, s = held(lora_targets="all-linear")
    arch, layers = s.model.arch, s.model.num_layers
    h, o, inter = arch.hidden_size, arch.num_heads * arch.head_dim, arch.intermediate_size
    # block 0: the q/k/v input is the frozen embeddings' normed output (no grad); o, gate/up and down follow adapters
    first = o + h + inter
    rest = h + o + h + inter
    assert a.kbit_inputs_per_token == 2 * (first + (layers - 1) * rest)
    assert a.checkpoint_per_token == 2 * h * layers + a.kbit_inputs_per_token


def test_first_block_holds_only_inputs_downstream_of_its_adapters():
    mlp, s = held(lora_targets=["gate_proj", "up_proj"])
    arch, layers = s.model.arch, s.model.num_layers
    h, o, inter = arch.hidden_size, arch.num_heads * arch.head_dim, arch.intermediate_size
    assert mlp.kbit_inputs_per_token == 2 * (inter + (layers - 1) * (h + o + h + inter))


def test_mixtral_term_is_the_measured_formula():
    for k in (2, 8):
        a, s = held("mixtral-8x7b", lora_targets=["w1", "w2", "w3", "gate"], experts_top_k=k, experts_backend="modules")
        arch, layers = s.model.arch, s.model.num_layers
        h, inter, o = arch.hidden_size, arch.moe_intermediate_size, arch.num_heads * arch.head_dim
        assert a.kbit_inputs_per_token == 2 * (k * inter + (layers - 1) * (h + o + h + k * (h + inter)))


# trl-sft-0.4: bitsandbytes 0.39 keeps the inputs too, but transformers 4.30 checkpoints reentrantly (frees them)
@pytest.mark.parametrize("change", [{"framework": "hf-trainer"}, {"framework": "llama-factory"},
                                    {"framework": "trl-sft-0.4"},
                                    {"gradient_checkpointing": False}, {"method": "lora"}])
def test_no_held_inputs_without_the_fact_non_reentrant_checkpointing_and_4bit(change):
    framework = change.pop("framework", "llama-factory-2024")
    a, _ = held(framework=framework, lora_targets="all-linear", **change)
    assert a.kbit_inputs_per_token == 0


def test_fused_experts_are_not_4bit():
    modules, _ = held("mixtral-8x7b", lora_targets="all-linear", experts_backend="modules")
    fused, s = held("mixtral-8x7b", lora_targets="all-linear", experts_backend="grouped_mm")
    arch, layers = s.model.arch, s.model.num_layers
    assert 0 < fused.kbit_inputs_per_token < modules.kbit_inputs_per_token
    # only attention is 4-bit: q/k/v's input from the second block on, o's input in every block
    assert fused.kbit_inputs_per_token == 2 * (arch.num_heads * arch.head_dim * layers + arch.hidden_size * (layers - 1))


def test_held_inputs_shrink_the_max_batch():
    def max_batch(framework):
        d = {"model": "mixtral-8x7b", "framework": framework, "hardware": {"gpu": "a40"},
             "mix": {"method": "qlora", "lora_targets": ["w1", "w2", "w3", "gate"], "gradient_checkpointing": True,
                     "experts_backend": "modules", "attention": "flash"},
             "workload": {"micro_batch_size": 1, "seq_len": 512}}
        return ftscope.estimate(ftscope.load_scenario(d), with_time=False).max_micro_batch_size
    assert max_batch("llama-factory-2024") * 4 < max_batch("hf-trainer")
