"""trace: one fake-tensor training step of the real implementation, checked against independent counts.

Weight bytes come from the config (ModelSpec's parameter count x dtype size), optimizer bytes from the trainable
count (AdamW: two fp32 states per parameter plus one fp32 step counter per tensor), gradients from the trainable
count, forward FLOPs from 2 x parameters x tokens plus causal attention. The models are shrunk (2 layers, hidden
256) so the whole file runs in seconds; one slow test traces the full-size Llama-2-7B of the acceptance criterion.
"""
from __future__ import annotations

import json
import time

import pytest

import ftscope
from ftscope import FtscopeError
from ftscope.estimate.memory import NF4_BYTES
from ftscope.estimate.weight_memory import NF4_STATE_BYTES, NF4_STATE_BYTES_PLAIN
from ftscope.spec.resolve import model_from_config

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from ftscope.measure.trace.tracer import CATEGORIES, PHASES, trace  # noqa: E402

pytestmark = [pytest.mark.slow,  # every test here traces a real model
              pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::RuntimeWarning", "ignore::UserWarning")]

SHRINK = {"layers": 2, "hidden": 256, "vocab": 1024, "experts": 4}
B, S = 2, 64


def run(model: str = "llama-2-7b", batch: int = B, seq: int = S, **mix):
    scn = ftscope.load_scenario({"model": model, "mix": {"lora_rank": 8, **mix},
                                 "workload": {"micro_batch_size": batch, "seq_len": seq}})
    return trace(scn, shrink=SHRINK)


def rope_buffer_bytes(cfg: dict) -> int:
    """Llama's rotary embedding keeps inv_freq and original_inv_freq: head_dim / 2 fp32 values each."""
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * (head_dim // 2) * 4


def attention_flops(cfg: dict, batch: int, seq: int) -> float:
    """Causal sdpa forward: QK^T and PV over the lower triangle (diagonal included), all layers."""
    heads, layers = cfg["num_attention_heads"], cfg["num_hidden_layers"]
    d = cfg["hidden_size"] // heads
    return layers * 2 * batch * heads * seq * seq * 2 * d * (seq + 1) / (2 * seq)


@pytest.fixture(scope="module")
def lora():
    return run(method="lora")


@pytest.fixture(scope="module")
def full_fp32():
    return run(method="full", precision="fp32")


# ---- memory against independent counts ---------------------------------------------------------------------

def test_lora_weights_are_the_config_count_at_dtype_size(lora):
    spec = model_from_config(lora.build.config)
    trainable = spec.lora_params(8, "all-linear")
    assert lora.trainable_params == trainable and lora.total_params == spec.total_params
    expected = spec.total_params * 2 + trainable * 4 + rope_buffer_bytes(lora.build.config)  # bf16 base, fp32 adapters
    for phase in PHASES:
        assert lora.phase_categories[phase]["weights"] == expected


def test_lora_optimizer_and_gradients_from_the_trainable_count(lora):
    n_tensors = 2 * 7 * 2  # A and B on 7 matrices in 2 layers
    states = 2 * 4 * lora.trainable_params + 4 * n_tensors  # AdamW exp_avg, exp_avg_sq (fp32) + step counters
    for phase in PHASES:
        assert lora.phase_categories[phase]["optimizer"] == states
    assert lora.phase_categories["optimizer"]["gradients"] == 4 * lora.trainable_params
    assert lora.phase_categories["forward"]["gradients"] == 0  # zero_grad(set_to_none) before the step


def test_full_fp32_counts(full_fp32):
    r = full_fp32
    spec = model_from_config(r.build.config)
    total = spec.total_params
    assert r.trainable_params == total
    opt = r.phase_categories["optimizer"]
    assert opt["weights"] == 4 * total + rope_buffer_bytes(r.build.config)
    assert opt["gradients"] == 4 * total
    n_tensors = 2 * 9 + 3  # 7 matrices + 2 norms per layer; embedding, lm_head, final norm
    assert opt["optimizer"] == 8 * total + 4 * n_tensors
    assert opt["temporary"] >= 4 * total  # foreach AdamW: one fp32 temporary per parameter
    assert r.peak_phase == "optimizer"


def test_peak_is_the_largest_phase_and_categories_add_up(lora):
    assert lora.peak_bytes == max(lora.phases.values()) == lora.phases[lora.peak_phase]
    for phase in PHASES:
        assert sum(lora.phase_categories[phase].values()) == lora.phases[phase]
    assert set(lora.categories) == set(CATEGORIES)
    assert 0 < lora.saved_bytes <= lora.phase_categories["forward"]["activations"]


def test_qlora_weights_are_packed_nf4():
    r = run(method="qlora")
    spec = model_from_config(r.build.config)
    quantized = spec.quantizable_params()
    expected = ((spec.total_params - quantized) * 2 + quantized * NF4_BYTES + r.trainable_params * 4
                + rope_buffer_bytes(r.build.config))
    weights = r.phase_categories["forward"]["weights"]
    assert weights == pytest.approx(expected, rel=0.02)  # + per-layer NF4/dynamic code tables and offsets
    assert r.trainable_params == spec.lora_params(8, "all-linear")
    # backward dequantizes each 4-bit weight to bf16 for the input gradient: a weight-sized temporary
    assert r.flops["total"] > 0


def test_qlora_without_nested_quant_keeps_fp32_absmax():
    """mix.nested_quant false builds bitsandbytes' plain state: one fp32 absmax per 64 weights, 4/64 - (1/64 +
    4/16384) B per 4-bit weight more than the nested one (the estimate's kbit_state_bytes_per_weight), less what
    only the nested state holds per tensor: state2's 256-entry fp32 code table and the fp32 offset (1028 B, which
    the estimate leaves out: 0.2 MB over a 7B model's 224 matrices)."""
    nested, plain = run(method="qlora"), run(method="qlora", nested_quant=False)
    quantized = model_from_config(plain.build.config).quantizable_params()
    grown = plain.phase_categories["forward"]["weights"] - nested.phase_categories["forward"]["weights"]
    per_tensor = 256 * 4 + 4
    expected = quantized * (NF4_STATE_BYTES_PLAIN - NF4_STATE_BYTES) - len(plain.build.quantized_modules) * per_tensor
    assert grown == pytest.approx(expected, rel=0.01)


def test_gradient_checkpointing_recomputes_and_saves_less(lora):
    gc = run(method="lora", gradient_checkpointing=True)
    assert gc.saved_bytes < lora.saved_bytes
    assert 0 < gc.flops["recompute"] < gc.flops["forward"]
    assert gc.flops["forward"] == lora.flops["forward"]


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_saved_activations_match_a_real_cpu_step(attention):
    """The same shrunk model and mix run for real on the CPU: the bytes autograd saves (saved_tensors_hooks,
    weights excluded) equal the trace's activations alive after forward plus the autocast copies of the fp32
    adapters (which the trace books as temporary weight copies)."""
    from ftscope.measure.runtime.build import build_model

    r = run(method="lora", attention=attention)
    model, _ = build_model(r.scenario, device="cpu", shrink=SHRINK)
    weights = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in weights:
            saved[st.data_ptr()] = st.nbytes()
        return t

    ids = torch.randint(0, SHRINK["vocab"], (B, S))
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids).loss
    adapter_copies = 2 * r.trainable_params
    assert sum(saved.values()) - adapter_copies == pytest.approx(r.saved_bytes, rel=0.01)


def test_eager_attention_keeps_the_attention_probabilities(lora):
    eager = run(method="lora", attention="eager")
    cfg = eager.build.config
    probs = cfg["num_hidden_layers"] * B * cfg["num_attention_heads"] * S * S * 2  # bf16 probabilities
    lse = cfg["num_hidden_layers"] * B * cfg["num_attention_heads"] * S * 4     # what sdpa keeps instead
    assert eager.saved_bytes - lora.saved_bytes == probs - lse


# ---- FLOPs ---------------------------------------------------------------------------------------------------

def test_forward_flops_are_2_params_tokens_plus_attention(full_fp32):
    r = full_fp32
    cfg = r.build.config
    spec = model_from_config(cfg)
    tokens = B * S
    matmul = 2 * tokens * (spec.total_params - spec.embedding_params - spec.final_norm_params
                           - sum(layer.other_params * n for layer, n in spec.layer_groups))
    assert r.flops["forward"] == pytest.approx(matmul + attention_flops(cfg, B, S), rel=1e-6)
    assert r.flops["forward"] == pytest.approx(2 * tokens * (spec.total_params - spec.embedding_params), rel=0.05)
    assert r.flops_by_phase_layer["forward"]["lm_head"] == 2 * tokens * cfg["hidden_size"] * cfg["vocab_size"]


def test_backward_flops_full_is_twice_the_matmuls(full_fp32):
    r = full_fp32
    attn = attention_flops(r.build.config, B, S)
    fwd_linear = r.flops["forward"] - attn
    assert r.flops["backward"] == pytest.approx(2 * fwd_linear + 2.5 * attn, rel=0.01)


def test_lora_flops_by_layer(lora):
    cfg = lora.build.config
    fwd = lora.flops_by_phase_layer["forward"]
    lora_fwd = 2 * B * S * lora.trainable_params  # x A and (x A) B: 2 FLOPs per adapter weight per token
    assert fwd["lora"] == pytest.approx(lora_fwd, rel=1e-6)
    assert fwd["attention"] > 0 and fwd["mlp"] > 0 and fwd["experts"] == 0
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    assert fwd["mlp"] == 2 * B * S * 3 * h * i * cfg["num_hidden_layers"]
    # frozen base: backward computes input gradients only (1x); adapters train (2x), except that the first
    # layer's q/k/v adapters need no input gradient (their input, the frozen embedding, has none)
    bwd = lora.flops_by_phase_layer["backward"]
    first_layer_inputs = 3 * 2 * B * S * 8 * h
    assert bwd["mlp"] == fwd["mlp"] and bwd["lora"] == 2 * fwd["lora"] - first_layer_inputs


@pytest.mark.parametrize("backend", ["grouped_mm", "eager"])
def test_moe_expert_flops_are_top_k_tokens(backend):
    r = run("mixtral-8x7b", method="lora", lora_targets="attention", experts_backend=backend)
    cfg = r.build.config
    h, i, k = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_experts_per_tok"]
    expected = 2 * B * S * k * 3 * h * i * cfg["num_hidden_layers"]
    assert r.flops_by_phase_layer["forward"]["experts"] == pytest.approx(expected, rel=1e-6)
    assert r.flops_by_phase_layer["forward"]["router"] == 2 * B * S * h * cfg["num_local_experts"] * cfg["num_hidden_layers"]
    if backend == "eager":
        assert any("balanced routing" in n for n in r.build.notes)


def test_mla_attention_runs_the_kernel_cuda_would():
    """DeepSeek's MLA has q/k heads of 192 and v heads of 128: CPU sdpa would take its math path (fp32 S x S
    scores, no causal skipping); the trace routes it to the memory-efficient kernel CUDA picks."""
    small, big = (run("deepseek-v2-lite", seq=seq, method="lora", lora_targets="attention") for seq in (64, 128))
    cfg = small.build.config
    heads, layers = cfg["num_attention_heads"], cfg["num_hidden_layers"]
    d_qk, d_v = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"], cfg["v_head_dim"]

    def core(seq):  # causal QK^T + PV, lower triangle with the diagonal
        return layers * 2 * B * heads * seq * seq * (d_qk + d_v) * (seq + 1) / (2 * seq)

    # attention FLOPs beyond the projections grow with the causal core, nothing else quadratic
    extra = big.flops_by_phase_layer["forward"]["attention"] - 2 * small.flops_by_phase_layer["forward"]["attention"]
    assert extra == pytest.approx(core(128) - 2 * core(64), rel=1e-6)
    # saved activations double with the sequence (no S x S tensor kept)
    assert big.saved_bytes / small.saved_bytes == pytest.approx(2.0, rel=0.05)


# ---- output and errors ---------------------------------------------------------------------------------------

def test_to_dict_has_the_estimate_shape(lora):
    d = json.loads(json.dumps(lora.to_dict()))
    mem = d["memory"]
    assert set(mem["breakdown_gib"]) == set(CATEGORIES)
    assert set(mem["phases_gib"]) == set(PHASES) and mem["peak_phase"] in PHASES
    assert mem["allocated_gib"] == max(mem["phases_gib"].values())
    # reserved (the caching-allocator replay) holds at least the tensors and at most the rounding and splits
    # a 2-layer model's few hundred storages can add
    assert mem["allocated_gib"] <= mem["peak_gib"] <= mem["allocated_gib"] * 3 + 0.1
    assert {"forward", "backward", "total", "by_layer"} <= set(d["flops"])
    assert d["model"]["trainable_params"] == lora.trainable_params
    assert d["scenario"]["workload"]["seq_len"] == S


def test_trace_is_deterministic(lora):
    again = run(method="lora")
    assert again.peak_bytes == lora.peak_bytes and again.phase_categories == lora.phase_categories
    assert again.flops == lora.flops


@pytest.mark.parametrize("mix, match", [
    ({"method": "full", "zero_stage": 2}, "one GPU"),
    ({"method": "full", "experts_backend": "grouped_mm"}, "bf16 weights only"),
    ({"method": "lora", "optimizer": "adamw_8bit"}, "not traceable"),
])
def test_untraceable_mixes_say_why(mix, match):
    model = "mixtral-8x7b" if "experts_backend" in mix else "llama-2-7b"
    with pytest.raises(FtscopeError, match=match):
        run(model, **mix)


def test_sgd_keeps_no_optimizer_state():
    r = run(method="lora", optimizer="sgd")
    assert all(c["optimizer"] == 0 for c in r.phase_categories.values())
    assert r.phase_categories["optimizer"]["gradients"] == 4 * r.trainable_params


def test_max_batch_needs_an_explicit_batch():
    scn = ftscope.load_scenario({"model": "llama-2-7b", "mix": {"method": "lora"},
                                 "workload": {"micro_batch_size": "max", "seq_len": 64}})
    with pytest.raises(FtscopeError, match="batch"):
        trace(scn, shrink=SHRINK)


def test_blackmamba_is_not_traceable():
    scn = ftscope.load_scenario({"model": "blackmamba-2.8b", "mix": {"method": "lora"}, "workload": {"seq_len": 64}})
    with pytest.raises(FtscopeError, match="not traceable"):
        trace(scn)


@pytest.mark.slow
def test_full_size_llama2_7b_lora_acceptance():
    """Issue 5's acceptance case: Llama-2-7B, LoRA r16 on all linear layers, batch 1, seq 512, at full size."""
    scn = ftscope.load_scenario({"model": "llama-2-7b", "mix": {"method": "lora", "lora_rank": 16},
                                 "workload": {"micro_batch_size": 1, "seq_len": 512}})
    cpu0 = time.process_time()
    r = trace(scn)
    cpu_s = time.process_time() - cpu0
    assert r.total_params == 6_738_415_616 and r.trainable_params == 39_976_960
    assert r.phase_categories["forward"]["weights"] == 6_738_415_616 * 2 + 39_976_960 * 4 + rope_buffer_bytes(
        r.build.config)
    # 10-20 s on a 2-core laptop; counted in CPU seconds (all threads), which a busy machine does not inflate
    # the way it inflates wall time (147 s wall on a machine shared by 7 jobs)
    assert cpu_s < 60
