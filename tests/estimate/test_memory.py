"""Per-GPU memory model (estimate/memory.py): phases, categories, sharding, offload, and the effect of each
optimization. Expected byte counts are derived from parameter counts and dtype sizes, not from the code."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

import ftscope
from ftscope.estimate.memory import memory_model

GIB = 2**30
# NF4 with double quantization (QLoRA paper): 4 bits per weight + one fp8 absmax per 64 weights
# + one fp32 second-level absmax per 256 blocks of 64.
NF4 = 0.5 + 1 / 64 + 4 / (64 * 256)


def scn(model="llama-3.2-1b", gpu="a100-80gb", mix=None, wl=None, hw=None):
    d = {"model": model, "hardware": {"gpu": gpu, **(hw or {})},
         "mix": {"attention": "flash", **(mix or {})},
         "workload": {"micro_batch_size": 1, "seq_len": 512, **(wl or {})}}
    return ftscope.load_scenario(d)


def peak(s, b, seq):
    return memory_model(s).breakdown(b, seq).peak_bytes


VARIETY = [
    dict(model="llama-3.2-1b", mix={"method": "full"}),
    dict(model="llama-3.2-1b", mix={"method": "full", "zero_stage": 3}, hw={"gpus_per_node": 4}),
    dict(model="llama-3.2-1b", mix={"method": "full", "fsdp": "full_shard"}, hw={"gpus_per_node": 2}),
    dict(model="llama-2-7b", mix={"method": "lora", "gradient_checkpointing": True}),
    dict(model="llama-2-7b", mix={"method": "qlora", "attention": "eager"}),
    dict(model="mixtral-8x7b", mix={"method": "qlora", "gradient_checkpointing": True}),
    dict(model="qwen1.5-moe-a2.7b", mix={"method": "lora"}, wl={"gradient_accumulation": 4}),
    dict(model="blackmamba-2.8b", mix={"method": "full", "precision": "bf16"}),
]


# --- phases and categories ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", VARIETY)
@pytest.mark.parametrize("b,seq", [(1, 128), (4, 2048)])
def test_peak_is_max_over_phases_not_sum(kw, b, seq):
    bd = memory_model(scn(**kw)).breakdown(b, seq)
    assert set(bd.phases) == {"forward", "backward", "optimizer"}
    assert bd.phase in bd.phases
    top = max(bd.phases.values())
    overhead = bd.categories["overhead"]
    # reserved = allocated + allocator overhead at the peak phase; never below any phase's allocated bytes
    assert bd.peak_bytes == pytest.approx(bd.allocated_bytes + overhead, rel=1e-12)
    assert top <= bd.peak_bytes * (1 + 1e-12)
    assert bd.peak_bytes <= top + overhead + 1
    assert bd.allocated_bytes <= bd.phases[bd.phase] * (1 + 1e-12)
    # not a sum over phases: every phase holds the weights, so the sum is far larger
    assert bd.peak_bytes < sum(bd.phases.values())


@pytest.mark.parametrize("kw", VARIETY)
def test_categories_sum_to_peak(kw):
    bd = memory_model(scn(**kw)).breakdown(2, 1024)
    assert set(bd.categories) == {"weights", "gradients", "optimizer", "activations", "temporary", "overhead"}
    assert all(v >= 0 for v in bd.categories.values())
    assert sum(bd.categories.values()) == pytest.approx(bd.peak_bytes, rel=1e-9)


def test_optimizer_phase_holds_no_activations():
    # full fine-tuning with tiny activations peaks in the optimizer step (weights + grads + states + temporaries)
    bd = memory_model(scn(mix={"method": "full"})).breakdown(1, 16)
    assert bd.phase == "optimizer"
    assert bd.categories["activations"] == 0


def test_large_activations_peak_in_backward():
    bd = memory_model(scn("llama-2-7b", mix={"method": "lora"})).breakdown(8, 4096)
    assert bd.phase == "backward"
    assert bd.categories["activations"] > bd.categories["weights"]


# --- monotonicity -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", VARIETY)
def test_monotone_in_micro_batch(kw):
    m = memory_model(scn(**kw))
    peaks = [m.breakdown(b, 512).peak_bytes for b in range(1, 33)]
    assert all(b2 >= b1 for b1, b2 in zip(peaks, peaks[1:]))
    assert peaks[-1] > peaks[0]


@pytest.mark.parametrize("kw", VARIETY)
def test_monotone_in_seq_len(kw):
    m = memory_model(scn(**kw))
    peaks = [m.breakdown(2, s).peak_bytes for s in (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)]
    assert all(b2 >= b1 for b1, b2 in zip(peaks, peaks[1:]))
    assert peaks[-1] > peaks[0]


@settings(max_examples=60, deadline=None)
@given(kw=st.sampled_from(VARIETY), b1=st.integers(1, 64), b2=st.integers(1, 64),
       s1=st.integers(1, 32768), s2=st.integers(1, 32768))
def test_monotone_property(kw, b1, b2, s1, s2):
    m = memory_model(scn(**kw))
    lo_b, hi_b = sorted((b1, b2))
    lo_s, hi_s = sorted((s1, s2))
    assert m.breakdown(lo_b, lo_s).peak_bytes <= m.breakdown(hi_b, hi_s).peak_bytes * (1 + 1e-12)


# --- optimizations ------------------------------------------------------------------------------------------

def test_gradient_checkpointing_lowers_memory():
    base = dict(model="llama-2-7b", mix={"method": "lora"})
    off = memory_model(scn(**base)).breakdown(4, 2048)
    on = memory_model(scn(model="llama-2-7b", mix={"method": "lora", "gradient_checkpointing": True})).breakdown(4, 2048)
    assert on.peak_bytes < off.peak_bytes
    assert on.categories["activations"] < off.categories["activations"]
    assert on.categories["weights"] == off.categories["weights"]


@pytest.mark.parametrize("fused", ["flash", "sdpa"])
def test_eager_attention_keeps_quadratic_scores(fused):
    eager = scn(mix={"attention": "eager"})
    fast = scn(mix={"attention": fused})
    assert peak(eager, 1, 8192) > peak(fast, 1, 8192)
    # the extra memory of eager grows with s^2: doubling the length roughly quadruples it
    d1 = peak(eager, 1, 4096) - peak(fast, 1, 4096)
    d2 = peak(eager, 1, 8192) - peak(fast, 1, 8192)
    assert d1 > 0
    assert d2 / d1 > 3.5


def test_lora_below_full_and_qlora_below_lora():
    full = scn("llama-2-7b", mix={"method": "full"})
    lora = scn("llama-2-7b", mix={"method": "lora"})
    qlora = scn("llama-2-7b", mix={"method": "qlora"})
    assert peak(qlora, 1, 512) < peak(lora, 1, 512) < peak(full, 1, 512)
    assert memory_model(qlora).weights < memory_model(lora).weights


def test_lora_weight_bytes():
    s = scn("llama-2-7b", mix={"method": "lora", "lora_rank": 16})
    m = memory_model(s)
    total = s.model.total_params
    lora = s.model.lora_params(16, "all-linear")
    # 7B at rank 16 on all linears: A (r x in) + B (out x r) per matrix, per layer
    h, inter, layers = 4096, 11008, 32
    assert lora == 16 * layers * (4 * (h + h) + 2 * (h + inter) + (inter + h))
    # frozen bf16 base + fp32 adapters (PEFT upcasts trainable adapters)
    assert m.weights == pytest.approx(2 * total + 4 * lora, rel=1e-9)
    assert m.trainable_params == lora
    # AdamW with fp32 states: 8 bytes per trainable parameter
    assert m.optimizer == pytest.approx(8 * lora, rel=1e-9)


def test_qlora_weight_bytes_nf4_double_quant():
    s = scn("llama-2-7b", mix={"method": "qlora"})
    m = memory_model(s)
    mdl = s.model
    not_quantized = mdl.embedding_params + mdl.lm_head_params + mdl.final_norm_params + sum(
        layer.other_params * n for layer, n in mdl.layer_groups)
    quantized = mdl.total_params - not_quantized
    expected = quantized * NF4 + not_quantized * 2 + 4 * mdl.lora_params(16, "all-linear")
    assert m.weights == pytest.approx(expected, rel=1e-3)
    assert m.weights < 0.35 * memory_model(scn("llama-2-7b", mix={"method": "lora"})).weights


def test_qlora_without_nested_quant_adds_its_fp32_absmax_to_weights_and_peak():
    nested = memory_model(scn("llama-2-7b", mix={"method": "qlora"}))
    plain = memory_model(scn("llama-2-7b", mix={"method": "qlora", "nested_quant": False}))
    quantized = scn("llama-2-7b", mix={"method": "qlora"}).model.quantizable_params()
    extra = quantized * (4 / 64 - (1 / 64 + 4 / 16384))
    assert plain.weights - nested.weights == pytest.approx(extra)
    assert plain.peak_bytes(1, 512) - nested.peak_bytes(1, 512) == pytest.approx(extra)


@pytest.mark.parametrize("precision,per_param", [("bf16", 2 + 2 + 4), ("fp32", 4 + 4 + 8), ("bf16-mixed", 4 + 4 + 8)])
def test_full_finetune_bytes_per_param(precision, per_param):
    s = scn("llama-3.2-1b", mix={"method": "full", "precision": precision, "attention": "sdpa"})
    m = memory_model(s)
    p = s.model.total_params
    assert m.trainable_params == p
    assert m.weights + m.gradients + m.optimizer == pytest.approx(per_param * p, rel=1e-9)


def test_optimizer_state_bytes_by_optimizer():
    p = scn("llama-3.2-1b").model.total_params
    got = {o: memory_model(scn(mix={"method": "full", "precision": "bf16", "optimizer": o})).optimizer
           for o in ("adamw", "adamw_8bit", "sgd")}
    assert got["sgd"] == 0
    assert 0 < got["adamw_8bit"] < got["adamw"]
    assert got["adamw_8bit"] == pytest.approx(2 * p, rel=1e-9)  # two 1-byte moments


def test_paged_optimizer_pages_the_states_of_large_tensors_only():
    """bitsandbytes keeps the states of tensors under 1e5 elements in torch memory (get_state_buffer)."""
    full = memory_model(scn("llama-2-7b", mix={"method": "full", "precision": "bf16", "optimizer": "paged_adamw_8bit"}))
    assert full.optimizer * 0.999 < full.paged_optimizer < full.optimizer  # all but the norms
    small = memory_model(scn("llama-2-7b", mix={"method": "lora", "lora_rank": 8, "lora_targets": ["q_proj", "v_proj"],
                                                "optimizer": "paged_adamw_8bit"}))
    assert small.paged_optimizer == 0  # 8 x 4096 = 32,768 elements per matrix
    wide = memory_model(scn("llama-2-7b", mix={"method": "lora", "lora_rank": 64, "lora_targets": ["q_proj", "v_proj"],
                                               "optimizer": "paged_adamw_8bit"}))
    assert wide.paged_optimizer == pytest.approx(wide.optimizer)  # 64 x 4096 = 262,144
    assert memory_model(scn("llama-2-7b", mix={"method": "full", "optimizer": "adamw_8bit"})).paged_optimizer == 0


def test_zero_stage_ordering_full_finetune_4_gpus():
    peaks = {z: peak(scn("llama-2-7b", mix={"method": "full", "zero_stage": z}, hw={"gpus_per_node": 4}), 1, 512)
             for z in (0, 1, 2, 3)}
    assert peaks[3] < peaks[2] < peaks[1] < peaks[0]


def test_zero_partitions_what_each_stage_says():
    n = 4
    ms = {z: memory_model(scn("llama-2-7b", mix={"method": "full", "zero_stage": z}, hw={"gpus_per_node": n}))
          for z in (1, 2, 3)}
    p = scn("llama-2-7b").model.total_params
    # DeepSpeed mixed precision: bf16 weights (2) + bf16 grads (2) + fp32 master, m, v (12)
    assert ms[1].optimizer == pytest.approx(12 * p / n, rel=1e-9)
    assert ms[1].weights == pytest.approx(2 * p, rel=1e-9)
    assert ms[1].gradients == pytest.approx(2 * p, rel=1e-9)
    assert ms[2].weights == pytest.approx(2 * p, rel=1e-9)
    assert ms[2].gradients == pytest.approx(2 * p / n, rel=0.03)  # + a reduce-scatter bucket
    assert ms[3].weights == pytest.approx(2 * p / n, rel=1e-9)
    assert ms[3].optimizer == ms[2].optimizer == ms[1].optimizer


def test_zero3_memory_falls_with_more_gpus():
    peaks = [peak(scn("llama-2-7b", mix={"method": "full", "zero_stage": 3}, hw={"gpus_per_node": n}), 1, 512)
             for n in (1, 2, 4, 8)]
    assert all(b < a for a, b in zip(peaks, peaks[1:]))


def test_fsdp_full_shard_shards_weights():
    one = memory_model(scn(mix={"method": "full", "fsdp": "full_shard"}, hw={"gpus_per_node": 1}))
    four = memory_model(scn(mix={"method": "full", "fsdp": "full_shard"}, hw={"gpus_per_node": 4}))
    op = memory_model(scn(mix={"method": "full", "fsdp": "shard_grad_op"}, hw={"gpus_per_node": 4}))
    assert four.weights == pytest.approx(one.weights / 4, rel=1e-9)
    # FSDP2 shards the fp32 parameters under both strategies (measured on gloo, world 2); shard_grad_op keeps the
    # gathered bf16 copy until backward ends instead of resharding after forward
    assert op.weights == pytest.approx(four.weights, rel=1e-9)
    assert four.weight_transient < op.weight_transient
    assert four.breakdown(1, 512).peak_bytes < op.breakdown(1, 512).peak_bytes


def test_optimizer_offload_moves_state_to_cpu():
    base = dict(mix={"method": "full", "zero_stage": 2}, hw={"gpus_per_node": 2})
    on_gpu = ftscope.estimate(scn(**base))
    off = ftscope.estimate(scn(mix={"method": "full", "zero_stage": 2, "offload": "optimizer"}, hw={"gpus_per_node": 2}))
    d_gpu, d_off = on_gpu.to_dict()["memory"], off.to_dict()["memory"]
    assert d_gpu["cpu_offload_gib"] == 0
    assert d_off["breakdown_gib"]["optimizer"] == 0
    assert off.model_memory.cpu_bytes >= on_gpu.model_memory.optimizer
    assert d_off["cpu_offload_gib"] >= d_gpu["breakdown_gib"]["optimizer"]
    assert d_off["peak_gib"] < d_gpu["peak_gib"]


def test_optimizer_and_params_offload_moves_weights_too():
    s = scn(mix={"method": "full", "zero_stage": 3, "offload": "optimizer+params"}, hw={"gpus_per_node": 2})
    m = memory_model(s)
    assert m.weights == 0 and m.optimizer == 0
    only_opt = memory_model(scn(mix={"method": "full", "zero_stage": 3, "offload": "optimizer"}, hw={"gpus_per_node": 2}))
    assert m.cpu_bytes > only_opt.cpu_bytes


def test_moe_activations_grow_with_top_k():
    peaks = {k: peak(scn("mixtral-8x7b", mix={"method": "qlora", "experts_top_k": k}), 1, 1024) for k in (2, 4, 8)}
    assert peaks[2] < peaks[4] < peaks[8]
    weights = {k: memory_model(scn("mixtral-8x7b", mix={"method": "qlora", "experts_top_k": k})).weights for k in (2, 8)}
    assert weights[2] == weights[8]  # top-k changes what runs, not what is stored


def test_chunked_loss_saves_memory_at_large_vocab():
    std = scn("llama-3.1-8b", mix={"method": "lora"})
    chunked = scn("llama-3.1-8b", mix={"method": "lora", "loss": "chunked"})
    assert std.model.arch.vocab_size > 100_000
    small = peak(std, 1, 256) - peak(chunked, 1, 256)
    big = peak(std, 4, 2048) - peak(chunked, 4, 2048)
    assert small > 0
    assert big > 20 * small  # the saving is per token of logits
    # at least the fp32 upcast of B x T x V logits that the standard loss keeps for backward
    assert big >= 4 * 4 * 2048 * std.model.arch.vocab_size


def test_gradient_accumulation_keeps_gradients_through_forward():
    m1 = memory_model(scn(mix={"method": "full", "precision": "bf16"}, wl={"gradient_accumulation": 1}))
    m4 = memory_model(scn(mix={"method": "full", "precision": "bf16"}, wl={"gradient_accumulation": 4}))
    f1 = m1.breakdown(2, 512).phases["forward"]
    f4 = m4.breakdown(2, 512).phases["forward"]
    assert f4 - f1 == pytest.approx(m1.gradients, rel=1e-9)


def test_capacity_is_below_device_memory_and_fits_matches_peak():
    s = scn("llama-2-7b", mix={"method": "lora"})
    m = memory_model(s)
    assert 0 < m.capacity_bytes < s.cluster.gpu.memory_bytes
    for b in (1, 8, 32, 128):
        assert m.fits(b, 1024) == (m.breakdown(b, 1024).peak_bytes <= m.capacity_bytes)
        assert m.fits(b, 1024, 0.1) == (m.breakdown(b, 1024).peak_bytes <= 0.9 * m.capacity_bytes)


def test_dynamic_padding_peak_uses_longest_batch_capped_by_cutoff():
    ds = {"num_samples": 1000, "mean_tokens": 187, "median_tokens": 174, "p99_tokens": 411, "max_tokens": 1470}
    capped = ftscope.estimate(scn(wl={"dataset": ds, "seq_len": 1024, "padding": "dynamic"}))
    uncapped = ftscope.estimate(scn(wl={"dataset": ds, "seq_len": None, "padding": "dynamic"}))
    assert capped.seq_len == 1024
    assert uncapped.seq_len == 1470
    assert capped.memory.peak_bytes < uncapped.memory.peak_bytes


# ---- framework recipes -------------------------------------------------------------------------------------

def _fw(framework, method="qlora", model="llama-3.1-8b", **mix):
    return ftscope.load_scenario({"model": model, "framework": framework, "hardware": {"gpu": "h100-80gb"},
                                  "mix": {"method": method, "gradient_checkpointing": True, **mix},
                                  "workload": {"micro_batch_size": 2, "seq_len": 1024}})


def test_kbit_preparation_keeps_non_4bit_weights_in_fp32():
    from ftscope.estimate.memory import memory_model

    plain, kbit = memory_model(_fw("hf-trainer")), memory_model(_fw("peft-kbit"))
    m = _fw("hf-trainer").model
    non4 = m.embedding_params + m.lm_head_params + m.final_norm_params + sum(l.other_params * n for l, n in m.layer_groups)
    assert kbit.weights - plain.weights == pytest.approx(2.0 * non4)
    # autocast's bf16 copy of the fp32 LM head lives from the head's forward to its backward
    assert kbit.weight_transient - plain.weight_transient == pytest.approx(2.0 * m.lm_head_params)
    # the fp32 embedding output makes the residual stream fp32: checkpointed block inputs double
    assert kbit.acts.checkpoint_per_token == pytest.approx(2 * plain.acts.checkpoint_per_token)


def test_bf16_adapters_halve_adapter_state():
    from ftscope.estimate.memory import memory_model

    fp32, bf16 = memory_model(_fw("hf-trainer", loss="standard")), memory_model(_fw("trl-sft", loss="standard"))
    assert bf16.optimizer == pytest.approx(fp32.optimizer / 2)
    assert bf16.acts.saved_per_token < fp32.acts.saved_per_token  # no per-adapter fp32 -> bf16 input copies


def test_fp32_loaded_lora_base_stays_fp32_except_under_deepspeed():
    """peft-sft-2024 loads a LoRA base without torch_dtype: fp32 frozen weights and (PEFT 0.10) fp32 adapters;
    DeepSpeed's bf16 engine casts the module; a QLoRA base's adapters follow its bf16 quant storage."""
    from ftscope.estimate.memory import frozen_weight_bytes, memory_model

    peft, hf = _fw("peft-sft-2024", method="lora"), _fw("hf-trainer", method="lora")
    assert frozen_weight_bytes(peft) == pytest.approx(2 * frozen_weight_bytes(hf))
    assert memory_model(peft).optimizer == pytest.approx(memory_model(hf).optimizer)  # fp32 adapters either way
    z3 = dict(method="lora", zero_stage=3)
    assert frozen_weight_bytes(_fw("peft-sft-2024", **z3)) == frozen_weight_bytes(_fw("hf-trainer", **z3))
    q_peft, q_hf = memory_model(_fw("peft-sft-2024")), memory_model(_fw("hf-trainer"))
    assert q_peft.optimizer == pytest.approx(q_hf.optimizer / 2)  # bf16 adapters: bf16 AdamW states


def test_fused_linear_loss_keeps_no_logits_and_its_tile_stops_growing():
    std = ftscope.estimate(_fw("hf-trainer", loss="standard"), with_time=False)
    fused = ftscope.estimate(_fw("hf-trainer", loss="fused_linear"), with_time=False)
    assert fused.memory.allocated_bytes < std.memory.allocated_bytes
    a = fused.model_memory.acts
    assert a.logits_saved_per_token < 100 and a.loss_tile_tokens == 4096
    from dataclasses import replace

    mm = fused.model_memory
    uncapped = replace(mm, acts=replace(a, loss_tile_tokens=float("inf")))
    start_of_backward = lambda model, s: model.phase_points(1, s)[2].allocated  # noqa: E731
    extra = start_of_backward(uncapped, 8192) - start_of_backward(mm, 8192)
    assert extra == pytest.approx(a.loss_tile_per_token * (8192 - 4096))
    assert start_of_backward(uncapped, 2048) == start_of_backward(mm, 2048)


def test_lora_dropout_adds_a_copy_and_mask_per_adapter():
    base = _fw("trl-sft", method="lora", gradient_checkpointing=False)
    drop = _fw("trl-sft", method="lora", gradient_checkpointing=False, lora_dropout=0.05)
    from ftscope.estimate.memory import memory_model

    assert memory_model(drop).acts.saved_per_token > memory_model(base).acts.saved_per_token


# --- recipe facts about the loss and FSDP1 ---------------------------------------------------------------------

def _with_recipe(s, **facts):
    import dataclasses
    return dataclasses.replace(s, recipe=dataclasses.replace(s.recipe, **facts))


def test_loss_recipe_facts_add_their_logits_copies():
    s = scn(model="llama-2-7b", mix={"method": "lora", "gradient_checkpointing": True})
    v, t = s.model.arch.vocab_size, 4 * 1024
    base = memory_model(s).breakdown(4, 1024).phases
    shifted = memory_model(_with_recipe(s, loss_upcast_in_forward=True, loss_shift_copy=True)).breakdown(4, 1024).phases
    # transformers 4.40: fp32 logits + a shifted fp32 copy beside the log-softmax (12 V) instead of bf16 + fp32 (10 V)
    assert shifted["forward"] - base["forward"] == pytest.approx(2 * v * t)
    held = memory_model(_with_recipe(s, loss_upcast_in_forward=True, loss_logits_held=True)).breakdown(4, 1024).phases
    assert held["backward"] - base["backward"] == pytest.approx(4 * v * t)  # fp32 logits kept through backward


def test_fsdp1_root_unit_stays_gathered():
    s = scn(model="llama-2-7b", mix={"method": "lora", "fsdp": "full_shard", "precision": "bf16"}, hw={"gpus_per_node": 2})
    m = s.model
    extra = memory_model(_with_recipe(s, fsdp_root_gathered=True)).weight_transient - memory_model(s).weight_transient
    # the all-gather writes the whole unit into a buffer of its own beside the rank's shard (FSDP1's padded
    # unsharded flat parameter): the full unit, not the (n - 1) / n other ranks' part
    assert extra == pytest.approx((m.embedding_params + m.lm_head_params + m.final_norm_params) * 2)


def test_compiled_torchao_dequantization_keeps_a_block_of_bf16_weights():
    """Compiled, a recipe with compiled_dequant_saved holds a whole block's weights at 2 B, not one matrix at 14."""
    qlora = {"method": "qlora", "lora_targets": "all-linear", "gradient_checkpointing": True}
    d = {"model": "llama-2-7b", "framework": "torchtune", "hardware": {"gpu": "a100-80gb"},
         "mix": {**qlora, "attention": "sdpa"}, "workload": {"micro_batch_size": 1, "seq_len": 512}}
    tt = memory_model(ftscope.load_scenario(d))
    m = ftscope.load_scenario(d).model
    assert tt.block_transient == pytest.approx(m.largest_linear_params() * 14)
    compiled = memory_model(ftscope.load_scenario({**d, "mix": {**d["mix"], "compile": True}}))
    assert compiled.block_transient == pytest.approx(m.largest_layer_params() * 2.0)
    hf = memory_model(scn("llama-2-7b", mix={**qlora, "compile": True}))  # bitsandbytes: not known to be saved
    assert hf.block_transient == pytest.approx(m.largest_linear_params() * 2.0)


def test_an_init_that_keeps_its_cache_is_a_floor_under_reserved_only():
    """torchtune 0.1 quantizes on the GPU at init (torchao 0.1: 68 B per weight of the matrix in flight; one layer
    built, cloned per layer, every weight quantized again by load_state_dict: replayed) and never empties the cache:
    the reserved peak reads at least that, the allocated peak does not."""
    from ftscope.estimate.reserved_floor import clone_init_cache, clone_init_groups
    d = {"model": "llama-2-7b", "framework": "torchtune-0.1", "hardware": {"gpu": "a100-80gb"},
         "mix": {"method": "qlora", "lora_targets": "all-linear"}, "workload": {"micro_batch_size": 1, "seq_len": 256}}
    s = ftscope.load_scenario(d)
    mm = memory_model(s)
    assert mm.reserved_floor == pytest.approx(mm.weights + clone_init_cache(*clone_init_groups(s)))
    assert mm.reserved_floor > mm.weights + s.model.largest_linear_params() * 68  # the one-matrix closed form
    b = mm.breakdown(1, 256)
    # the adapters' gradients and states need small-pool segments beside what init left cached
    assert mm.small_pool_step > 0
    assert b.peak_bytes == pytest.approx(mm.reserved_floor + mm.small_pool_step) == mm.peak_bytes(1, 256)
    assert b.allocated_bytes < mm.reserved_floor
    lora = memory_model(ftscope.load_scenario({**d, "mix": {"method": "lora", "lora_targets": "all-linear"}}))
    assert lora.reserved_floor == 0


def test_fused_adamw_has_no_step_temporaries():
    """torchtune's configs run torch.optim.AdamW(fused=True): no foreach temporaries at the step."""
    d = {"model": "llama-3.2-1b", "hardware": {"gpu": "a100-80gb"}, "mix": {"method": "full", "precision": "bf16"},
         "workload": {"micro_batch_size": 1, "seq_len": 512}}
    foreach = memory_model(ftscope.load_scenario(d))
    fused = memory_model(ftscope.load_scenario({**d, "framework": "torchtune"}))
    assert foreach.optimizer_transient == pytest.approx(foreach.trainable_params * 2.0)  # bf16 states' temporaries
    assert fused.optimizer_transient == 0


# --- the model shared across GPU types ---------------------------------------------------------------------------

@pytest.mark.parametrize("kw", VARIETY)
def test_a_shared_memory_model_is_the_one_built_afresh(kw):
    """memory_model builds one model per mix and GPU count and hands out copies with each GPU's capacity: every
    copy equals the model built for that GPU, and so do its reserved curves (computed once for every copy)."""
    from ftscope.estimate.memory import DEFAULT_ALLOCATOR, build_memory_models
    from ftscope.estimate.solvers import reserved_curves
    for gpu in ("a100-80gb", "h200", "t4", "a100-80gb"):
        s = scn(gpu=gpu, **kw)
        shared, fresh = memory_model(s), build_memory_models([s], DEFAULT_ALLOCATOR)[0]
        assert shared == fresh
        assert reserved_curves(shared) == reserved_curves(fresh)
        assert shared.peak_bytes(3, 1000) == fresh.peak_bytes(3, 1000)


@pytest.mark.parametrize("kw", VARIETY)
def test_a_shared_memory_model_is_the_one_built_afresh_on_every_gpu_count(kw):
    """memory_model keeps one mix_part per mix for all its GPU counts (it reads none): the model on each count and
    node layout, in any order, equals the one built afresh; capacity_free_model's equals it but for the capacity."""
    from ftscope.estimate.memory import DEFAULT_ALLOCATOR, build_memory_models, capacity_free_model
    from ftscope.spec.scenario import fast_replace
    hw = kw.get("hw", {})
    for per_node, nodes, gpu in ((1, 1, "h200"), (8, 4, "a100-80gb"), (2, 1, "t4"), (8, 1, "h200"), (8, 16, "t4"),
                                 (1, 1, "a100-80gb"), (8, 4, "h200")):
        if per_node * nodes % hw.get("gpus_per_node", 1):
            continue
        s = scn(gpu=gpu, **{**kw, "hw": {**hw, "gpus_per_node": per_node, "nodes": nodes}})
        free = capacity_free_model(s)  # first on some counts: built with no capacity
        assert memory_model(s) == build_memory_models([s], DEFAULT_ALLOCATOR)[0]
        assert fast_replace(free, capacity_bytes=memory_model(s).capacity_bytes) == memory_model(s)


@pytest.mark.parametrize("kw", VARIETY + [
    dict(model="llama-2-7b", mix={"method": "full", "gradient_checkpointing": True, "checkpointing": "selective",
                                  "tensor_parallel": 2, "sequence_parallel": True}, hw={"gpus_per_node": 4}),
    dict(model="olmoe-1b-7b", mix={"method": "lora", "expert_parallel": 2, "experts_backend": "modules",
                                   "offload": "optimizer", "zero_stage": 2}, hw={"gpus_per_node": 2}),
    dict(model="llama-3.2-1b", mix={"method": "full", "activation_offload": True, "compile": True,
                                    "loss": "chunked"}),
])
def test_memory_mix_leaves_out_only_what_the_memory_model_does_not_read(kw):
    """Every fused attention kernel gives the model eager's sibling memory_mix maps it to, field for field;
    eager keeps its own (its saved scores)."""
    from typing import get_args, get_type_hints

    from ftscope.estimate.memory import build_memory_models, memory_mix
    from ftscope.spec.mix import Mix
    from ftscope.spec.scenario import fast_replace
    base = scn(**kw)
    built = {}
    for attention in get_args(get_type_hints(Mix)["attention"]):  # every choice, whatever the GPU supports
        s = fast_replace(base, mix=fast_replace(base.mix, attention=attention))
        built[attention] = (memory_mix(s.mix), build_memory_models([s], memory_model(s).allocator)[0])
    assert len(built) >= 5
    for attention, (mix, model) in built.items():
        assert (mix.attention == "eager") == (attention == "eager")
        assert model == built[mix.attention][1], attention
    if kw["model"] != "blackmamba-2.8b":  # no attention layers there
        assert built["eager"][1] != built["sdpa"][1]


@pytest.mark.parametrize("kw", VARIETY)
def test_activation_coefficients_do_not_read_the_fields_activation_mix_leaves_out(kw):
    """Each ACTIVATION_FREE field at other values (and all of them at once) gives the coefficients of the mix
    activation_mix maps to: the cache key memory_model uses drops nothing the coefficients read."""
    from ftscope.estimate.activations import activation_coefficients
    from ftscope.estimate.activations import ACTIVATION_FREE, activation_mix
    from ftscope.spec.scenario import fast_replace
    base = scn(**kw)
    other = dict(offload="optimizer+params", optimizer="adamw_8bit", tensor_parallel=4, sequence_parallel=True,
                 tp_comm_overlap=True, pipeline_parallel=4, pipeline_schedule="interleaved", virtual_stages=2,
                 context_parallel=2, context_parallel_impl="all_to_all", expert_parallel=8)
    assert set(other) == set(ACTIVATION_FREE)
    for changes in [{k: v} for k, v in other.items()] + [other]:
        mix = fast_replace(base.mix, **changes)
        assert activation_mix(mix) == activation_mix(base.mix)
        got = activation_coefficients(base.model, mix, base.top_k, base.recipe)
        assert got == activation_coefficients(base.model, activation_mix(mix), base.top_k, base.recipe), changes


# --- the caching allocator's overhead ---------------------------------------------------------------------------

@pytest.mark.parametrize("checkpointing", [False, True])
def test_overhead_is_workspace_plus_the_step_kinds_fraction_of_the_churn(checkpointing):
    from ftscope.estimate.memory import AllocatorModel

    s = scn(model="llama-2-7b", mix={"method": "lora", "gradient_checkpointing": checkpointing})
    for al in (AllocatorModel(fragmentation=0.1, fragmentation_checkpointed=0.5),
               AllocatorModel(fragmentation=0.5, fragmentation_checkpointed=0.1)):
        bd = memory_model(s, al).breakdown(4, 1024)
        frac = al.fragmentation_checkpointed if checkpointing else al.fragmentation
        c = bd.categories
        assert c["overhead"] == pytest.approx(al.workspace_gib * GIB + frac * (c["activations"] + c["temporary"]))


def test_a_recipe_with_a_replayed_fraction_sets_the_checkpointed_one():
    from ftscope.estimate.memory import DEFAULT_ALLOCATOR
    from ftscope.spec.recipe import load_recipe

    own = load_recipe("fsdp-qlora").allocator_fragmentation_checkpointed
    assert own is not None and own != DEFAULT_ALLOCATOR.fragmentation_checkpointed
    mix = {"method": "lora", "gradient_checkpointing": True, "fsdp": "none"}
    framework = ftscope.load_scenario({"model": "llama-2-7b", "framework": "fsdp-qlora", "hardware": {"gpu": "a100-80gb"},
                                       "mix": mix, "workload": {"micro_batch_size": 4, "seq_len": 1024}})
    al = memory_model(framework).allocator
    assert al.fragmentation_checkpointed == own and al.fragmentation == DEFAULT_ALLOCATOR.fragmentation
    assert memory_model(scn(model="llama-2-7b", mix=mix)).allocator == DEFAULT_ALLOCATOR


def test_a_reserve_above_the_device_stops_at_it_while_what_the_cache_cannot_return_fits():
    # torch's allocator frees its cached segments and retries a failed cudaMalloc, so a checkpointed run fits while
    # allocated + workspace + the pinned share of the churn fits, and its reserved peak then reads the capacity
    s = scn(model="llama-2-7b", mix={"method": "lora", "gradient_checkpointing": True})
    mm = memory_model(s)
    al, seq = mm.allocator, 2048
    assert al.pinned < al.fragmentation_checkpointed
    capped = False
    for b in range(1, 200):
        bd = mm.breakdown(b, seq)
        c = bd.categories
        churn = c["activations"] + c["temporary"]
        natural = bd.allocated_bytes + al.workspace_gib * GIB + al.fragmentation_checkpointed * churn
        assert bd.fit_bytes == pytest.approx(mm.peak_bytes(b, seq))
        assert bd.fit_bytes <= natural * (1 + 1e-12)
        if bd.fit_bytes > mm.capacity_bytes:
            assert bd.peak_bytes == pytest.approx(natural) and not mm.fits(b, seq)
            break
        assert mm.fits(b, seq)
        assert bd.peak_bytes == pytest.approx(min(natural, mm.capacity_bytes))
        capped = capped or natural > mm.capacity_bytes
    assert capped  # some batch reserved more than the device and still fit
    est = ftscope.estimate(s.with_(micro_batch_size="max"))
    assert est.fits and est.memory.fit_bytes <= mm.capacity_bytes
