"""Step time (estimate/time.py) and efficiency parameters (estimate/efficiency.py): conservation and the
directions every change must move the answer in."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

import ftscope
from ftscope import FtscopeError
from ftscope.estimate.efficiency import Calibration, Efficiency, calibration_from_dict, load_calibration
from ftscope.estimate.time import communication_s, step_time
from ftscope.spec.hardware import gpu_from_catalog

DS = {"num_samples": 1000, "mean_tokens": 187, "median_tokens": 174, "p99_tokens": 411, "max_tokens": 1024}
PARTS = {"forward", "backward", "recompute", "optimizer", "communication", "dequant", "other"}


def scn(model="llama-2-7b", gpu="a100-80gb", mix=None, wl=None, hw=None):
    d = {"model": model, "hardware": {"gpu": gpu, **(hw or {})}, "mix": {"attention": "flash", **(mix or {})},
         "workload": {"micro_batch_size": 4, "seq_len": 512, **(wl or {})}}
    return ftscope.load_scenario(d)


def est(s):
    return ftscope.estimate(s, strict=False)


def t(s):
    return est(s).time


VARIETY = [
    dict(mix={"method": "lora"}),
    dict(mix={"method": "qlora", "gradient_checkpointing": True}, wl={"gradient_accumulation": 4}),
    dict(model="llama-3.2-1b", mix={"method": "full"}, hw={"gpus_per_node": 4}),
    dict(model="llama-3.2-1b", mix={"method": "full", "zero_stage": 3}, hw={"gpus_per_node": 4, "nodes": 2}),
    dict(model="llama-3.2-1b", mix={"method": "full", "zero_stage": 2, "offload": "optimizer"}, hw={"gpus_per_node": 2}),
    dict(model="mixtral-8x7b", gpu="a40", mix={"method": "qlora", "experts_backend": "eager"}, wl={"micro_batch_size": 1}),
    dict(model="blackmamba-2.8b", gpu="a40", mix={"method": "full", "precision": "bf16"}, wl={"dataset": DS}),
]


@pytest.mark.parametrize("kw", VARIETY)
def test_breakdown_sums_to_step_time(kw):
    te = t(scn(**kw))
    assert set(te.breakdown_s) == PARTS
    assert all(v >= 0 and math.isfinite(v) for v in te.breakdown_s.values())
    assert sum(te.breakdown_s.values()) == pytest.approx(te.step_s, rel=1e-9)
    # per-layer time covers the compute parts (forward, backward, recompute, dequant)
    compute = sum(te.breakdown_s[k] for k in ("forward", "backward", "recompute", "dequant"))
    assert sum(te.by_layer_s.values()) == pytest.approx(compute, rel=1e-9)
    assert 0 < te.mfu <= 1


def test_more_gpu_flops_is_not_slower():
    steps = [t(scn(gpu=g, mix={"method": "lora"})).step_s for g in ("a40", "a100-80gb", "h100-80gb")]
    assert steps[0] >= steps[1] >= steps[2]
    assert steps[0] > steps[2]


@pytest.mark.parametrize("field,scale", [("bf16_tflops", 2.0), ("memory_bandwidth_gbs", 2.0)])
def test_faster_inline_gpu_is_not_slower(field, scale):
    base = t(scn(mix={"method": "qlora"}))
    value = getattr(gpu_from_catalog("a100-80gb"), field) * scale
    faster = t(scn(gpu={"base": "a100-80gb", field: value}, mix={"method": "qlora"}))
    assert faster.step_s <= base.step_s
    assert faster.step_s < base.step_s  # both matter for a QLoRA step (matmuls and dequantization)


@pytest.mark.parametrize("wl", [{"seq_len": 512}, {"dataset": DS, "seq_len": 1024, "padding": "dynamic"}])
def test_bigger_batch_does_not_lower_throughput(wl):
    """The padded tokens the GPU works through per second never drop with a bigger micro-batch. Under dynamic
    padding samples/s may: a batch pads to its longest sample, which grows with the batch, so once the matmuls
    are near their peak a larger batch spends more of its time on padding (real runs show the same dip)."""
    s = scn(mix={"method": "lora"}, wl=wl)
    max_b = est(s.with_(micro_batch_size="max")).max_micro_batch_size
    assert max_b >= 4
    rates = [t(s.with_(micro_batch_size=b)).samples_per_s for b in range(1, max_b + 1)]
    padded = [r * s.workload.mean_padded_len(b) for b, r in enumerate(rates, start=1)]
    assert all(r2 >= r1 for r1, r2 in zip(padded, padded[1:]))
    if wl.get("padding") != "dynamic":
        assert all(r2 >= r1 for r1, r2 in zip(rates, rates[1:]))
    # ... and grows sub-linearly (small matmuls run below peak, fixed costs amortize)
    assert rates[-1] < max_b * rates[0]


def test_gradient_checkpointing_is_slower_and_smaller():
    off = est(scn(mix={"method": "lora"}))
    on = est(scn(mix={"method": "lora", "gradient_checkpointing": True}))
    assert off.time.breakdown_s["recompute"] == 0
    assert on.time.breakdown_s["recompute"] > 0
    assert on.time.step_s > off.time.step_s
    assert on.memory.peak_bytes < off.memory.peak_bytes


def mixtral(k, b=2):
    # the IISWC stack: transformers 4.x per-expert modules, quantized and adapted one by one
    return scn("mixtral-8x7b", "a40", {"method": "qlora", "experts_top_k": k, "experts_backend": "modules",
                                       "gradient_checkpointing": True, "lora_targets": ["w1", "w2", "w3", "gate"]},
               {"micro_batch_size": b, "dataset": DS, "seq_len": 1024})


@pytest.mark.parametrize("b", [1, 2, 4])
def test_sparse_top2_faster_per_sample_than_dense_top8(b):
    assert t(mixtral(2, b)).samples_per_s > t(mixtral(8, b)).samples_per_s


@pytest.mark.parametrize("k", [2, 8])
def test_moe_experts_dominate_mixtral_step(k):
    by = t(mixtral(k)).by_layer_s
    assert max(by, key=by.get) == "experts"
    assert by["experts"] > 0.5 * sum(by.values())


def test_single_gpu_has_no_communication():
    s = scn(mix={"method": "lora"})
    eff = load_calibration().shared
    assert communication_s(s, eff, est(s).model_memory.trainable_params) == (0.0, 0.0)
    assert t(s).breakdown_s["communication"] == 0


def comm_total(s):
    eff = load_calibration().shared
    return sum(communication_s(s, eff, est(s).model_memory.trainable_params))


def small_full(z=0, gpus=4, nodes=1, gpu="a40"):
    # a small batch on PCIe GPUs: collectives cannot hide behind backward
    return scn("llama-3.2-1b", gpu, {"method": "full", "zero_stage": z}, {"micro_batch_size": 1, "seq_len": 128},
               {"gpus_per_node": gpus, "nodes": nodes})


def test_ddp_adds_communication():
    assert comm_total(small_full(0, 4)) > 0
    one, four = t(small_full(0, 1)), t(small_full(0, 4))
    assert four.breakdown_s["communication"] > 0
    assert four.step_s > one.step_s
    # ring all-reduce moves 2 (n-1)/n of the bf16 gradients over the link (plus small per-bucket latencies)
    s = small_full(0, 4)
    grads = 2 * s.model.total_params
    eff = load_calibration().shared
    expected = 2 * 3 / 4 * grads / (s.cluster.gpu.intra_node_gbs * 1e9 * eff.communication)
    assert expected * (1 - 1e-9) <= comm_total(s) <= 1.25 * expected


def test_zero3_communicates_more_than_zero2():
    for kw in ({}, {"gpu": "a100-80gb"}):
        assert comm_total(small_full(3, **kw)) > comm_total(small_full(2, **kw))
    assert t(small_full(3)).breakdown_s["communication"] > t(small_full(2)).breakdown_s["communication"]


@pytest.mark.parametrize("model,method,gpu,b,seq", [("llama-2-7b", "full", "a100-80gb", 4, 512),
                                                   ("llama-2-7b", "lora", "h100-80gb", 1, 128),
                                                   ("llama-3.2-1b", "full", "a40", 8, 1024)])
def test_zero3_moves_more_than_zero2(model, method, gpu, b, seq):
    # ZeRO-3 gathers every weight in forward and backward on top of ZeRO-2's collectives (Singh et al.: slower)
    z2 = scn(model, gpu, {"method": method, "zero_stage": 2}, {"micro_batch_size": b, "seq_len": seq},
             {"gpus_per_node": 4})
    z3 = scn(model, gpu, {"method": method, "zero_stage": 3}, {"micro_batch_size": b, "seq_len": seq},
             {"gpus_per_node": 4})
    assert comm_total(z3) > comm_total(z2)
    tz2, tz3 = t(z2), t(z3)
    total = lambda x: x.breakdown_s["communication"] + x.communication_hidden_s  # noqa: E731
    assert total(tz3) > total(tz2)
    if b * seq <= 128:   # nothing to hide behind: ZeRO-3's gathers show
        assert tz3.step_s > tz2.step_s


def test_lora_zero3_gathers_the_frozen_weights():
    lora2 = scn(mix={"method": "lora", "zero_stage": 2}, hw={"gpus_per_node": 4})
    lora3 = scn(mix={"method": "lora", "zero_stage": 3}, hw={"gpus_per_node": 4})
    assert comm_total(lora3) > 50 * comm_total(lora2)


def test_inter_node_link_slower_than_intra_node():
    one_node = small_full(3, gpus=4, nodes=1, gpu="h100-80gb")
    two_nodes = small_full(3, gpus=2, nodes=2, gpu="h100-80gb")
    assert one_node.cluster.world_size == two_nodes.cluster.world_size
    assert comm_total(two_nodes) > comm_total(one_node)
    assert t(two_nodes).step_s > t(one_node).step_s


def test_optimizer_offload_adds_optimizer_time():
    kw = dict(model="llama-3.2-1b", hw={"gpus_per_node": 2})
    gpu = t(scn(mix={"method": "full", "zero_stage": 2}, **kw))
    cpu = t(scn(mix={"method": "full", "zero_stage": 2, "offload": "optimizer"}, **kw))
    assert cpu.breakdown_s["optimizer"] > gpu.breakdown_s["optimizer"]
    assert cpu.step_s > gpu.step_s


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_parameter_offload_copies_each_gathers_shard_from_the_host(method):
    """Under parameter offload each all-gather first copies the rank's shard from the host: the gathered bytes
    (a QLoRA base's 4-bit data, not bf16) / the ranks, once per gather pass (FSDP two, DeepSpeed three under
    checkpointing; ftscope refuses QLoRA with ZeRO-3 parameter offload)."""
    from ftscope.estimate.comm import gather_passes
    from ftscope.estimate.layout import layout
    from ftscope.estimate.time import optimizer_s
    from ftscope.estimate.weight_memory import gathered_weight_bytes
    eff = Efficiency()
    for sharding in ({"fsdp": "full_shard"}, {"zero_stage": 3})[:1 if method == "qlora" else 2]:
        mix = {"method": method, "gradient_checkpointing": True, **sharding}
        on, off = (scn(mix={**mix, "offload": o}, hw={"gpus_per_node": 2}) for o in ("optimizer", "optimizer+params"))
        trainable = 1_000_000
        copy = optimizer_s(off, eff, trainable, layout(off)) - optimizer_s(on, eff, trainable, layout(on))
        link = off.cluster.gpu.host_link_gbs * 1e9 * eff.communication
        assert gather_passes(off) == (2.0 if "fsdp" in sharding else 3.0)
        assert copy == pytest.approx(gathered_weight_bytes(off) / 2 * gather_passes(off) / link, rel=1e-9)
    assert gathered_weight_bytes(off) < (1.0 if method == "qlora" else 2.1) * off.model.total_params


def test_qlora_has_dequant_time():
    assert t(scn(mix={"method": "lora"})).breakdown_s["dequant"] == 0
    assert t(scn(mix={"method": "qlora"})).breakdown_s["dequant"] > 0


def test_tokens_per_s_counts_non_padding_tokens():
    te = t(scn(mix={"method": "lora"}, wl={"dataset": DS, "seq_len": 1024, "padding": "dynamic"}))
    assert te.tokens_per_s == pytest.approx(te.samples_per_s * DS["mean_tokens"], rel=1e-9)
    # truncation at a cutoff below the longest sample lowers the mean tokens per sample
    te_cut = t(scn(mix={"method": "lora"}, wl={"dataset": DS, "seq_len": 256, "padding": "dynamic"}))
    assert te_cut.tokens_per_s < te_cut.samples_per_s * DS["mean_tokens"]
    assert te_cut.tokens_per_s > te_cut.samples_per_s * 100


def test_packed_tokens_are_full_sequences():
    s = scn(mix={"method": "lora"}, wl={"padding": "packed", "seq_len": 2048, "micro_batch_size": 2},
            hw={"gpus_per_node": 2})
    te = t(s)
    assert te.tokens_per_s == pytest.approx(2 * 2 * 2048 / te.step_s, rel=1e-9)


def test_gradient_accumulation_repeats_micro_batches():
    one = t(scn(mix={"method": "lora"}))
    four = t(scn(mix={"method": "lora"}, wl={"gradient_accumulation": 4}))
    for k in ("forward", "backward"):
        assert four.breakdown_s[k] == pytest.approx(4 * one.breakdown_s[k], rel=1e-9)
    assert four.breakdown_s["optimizer"] == pytest.approx(one.breakdown_s["optimizer"], rel=1e-9)
    assert four.samples_per_s >= one.samples_per_s


def test_data_parallel_raises_throughput_for_lora():
    one = t(scn(mix={"method": "lora"}))
    four = t(scn(mix={"method": "lora"}, hw={"gpus_per_node": 4}))
    assert four.samples_per_s > 3 * one.samples_per_s


# --- efficiency parameters ----------------------------------------------------------------------------------

def test_step_time_follows_efficiencies():
    s = scn(mix={"method": "qlora"})
    e = est(s)
    eff = Efficiency()
    base = step_time(s, 4, eff, e.model_memory.trainable_params).step_s
    for change in ({"gemm_ampere": eff.gemm_ampere / 2}, {"bandwidth": eff.bandwidth / 2},
                   {"dequant_bandwidth": eff.dequant_bandwidth / 2}, {"kernel_floor_us": eff.kernel_floor_us * 4},
                   {"host_us_per_kernel": eff.host_us_per_kernel * 20}, {"step_overhead_s": eff.step_overhead_s + 1}):
        slower = step_time(s, 4, replace(eff, **change), e.model_memory.trainable_params).step_s
        assert slower > base, change
    over = step_time(s, 4, replace(eff, step_overhead_s=eff.step_overhead_s + 1), e.model_memory.trainable_params)
    assert over.step_s == pytest.approx(base + 1, rel=1e-9)


def test_bundled_calibration_loads_and_is_used_by_default():
    cal = load_calibration()
    assert isinstance(cal.shared, Efficiency)
    s = scn(mix={"method": "lora"})
    default = est(s).time.step_s
    assert ftscope.estimate(s, calibration=cal).time.step_s == pytest.approx(default, rel=1e-12)
    halved = Calibration(replace(cal.shared, gemm_ampere=cal.shared.gemm_ampere / 2), {}, {})
    assert ftscope.estimate(s, calibration=halved).time.step_s > default


def test_per_gpu_calibration_marks_estimate_calibrated():
    shared = Efficiency()
    cal = Calibration(shared, {"a40": replace(shared, gemm_ampere=0.3)}, {})
    assert cal.for_gpu("a40") == (replace(shared, gemm_ampere=0.3), True)
    assert cal.for_gpu("a40*")[1] is True  # an inline GPU based on a40
    assert cal.for_gpu("h100-80gb") == (shared, False)
    s = scn(gpu="a40", mix={"method": "lora"})
    assert ftscope.estimate(s, calibration=cal).time.calibrated is True
    assert ftscope.estimate(s, calibration=cal).time.step_s > ftscope.estimate(
        s, calibration=Calibration(shared, {}, {})).time.step_s


def test_calibration_round_trip_and_errors(tmp_path):
    cal = calibration_from_dict({"shared": {"gemm_ampere": 0.5}, "per_gpu": {"a40": {"bandwidth": 0.4}}})
    assert cal.shared.gemm_ampere == 0.5
    assert cal.per_gpu["a40"].gemm_ampere == 0.5 and cal.per_gpu["a40"].bandwidth == 0.4
    assert calibration_from_dict(cal.to_dict()).per_gpu == cal.per_gpu
    with pytest.raises(FtscopeError):
        calibration_from_dict({"shared": {"no_such_param": 1}})
    with pytest.raises(FtscopeError):
        load_calibration(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(FtscopeError):
        load_calibration(str(bad))
    good = tmp_path / "cal.json"
    good.write_text(json.dumps({"shared": {"step_overhead_s": 5.0}}))
    s = scn(mix={"method": "lora"})
    assert ftscope.estimate(s, calibration=str(good)).time.step_s > 5.0


# --- layouts, kernels and host: directions and bounds -------------------------------------------------------

def big(mix=None, hw=None, wl=None, model="llama-2-7b", gpu="h100-80gb"):
    return scn(model, gpu, {"method": "full", **(mix or {})}, {"micro_batch_size": 1, "seq_len": 4096,
                                                               "gradient_accumulation": 8, **(wl or {})},
               {"gpus_per_node": 8, **(hw or {})})


LAYOUTS = [
    {}, {"tensor_parallel": 2, "sequence_parallel": True}, {"pipeline_parallel": 4, "zero_stage": 1},
    {"pipeline_parallel": 2, "pipeline_schedule": "interleaved", "virtual_stages": 4},
    {"context_parallel": 2}, {"context_parallel": 4, "context_parallel_impl": "all_to_all"},
    {"fp8": True}, {"fp8": True, "tensor_parallel": 4, "pipeline_parallel": 2},
    {"compile": True, "gradient_checkpointing": True, "checkpointing": "selective"},
    {"fsdp": "full_shard", "gradient_checkpointing": True, "checkpointing": "per-op"},
    {"attention": "flash3"}, {"attention": "flash1", "activation_offload": True},
]


@pytest.mark.parametrize("mix", LAYOUTS)
def test_every_layout_conserves_time_and_keeps_mfu_physical(mix):
    te = t(big(mix))
    assert sum(te.breakdown_s.values()) == pytest.approx(te.step_s, rel=1e-9)
    assert 0 < te.mfu <= 1
    d = est(big(mix)).to_dict()["time"]["breakdown_s"]
    assert d["communication_exposed"] == d["communication"] and d["communication_hidden"] >= 0


def test_mfu_stays_below_one_even_at_perfect_efficiency():
    perfect = replace(Efficiency(), gemm_hopper=1.0, attention_hopper=1.0, bandwidth=1.0, kernel_floor_us=0.0,
                      host_us_per_kernel=0.0, step_overhead_s=0.0, microbatch_overhead_s=0.0, fp8_gemm=1.0,
                      communication=1.0, comm_overlap=1.0)
    for mix in LAYOUTS:
        s = big(mix)
        assert step_time(s, 1, perfect, est(s).model_memory.trainable_params).mfu <= 1.0, mix


def test_fp8_speeds_up_matmuls_on_hopper_only():
    assert t(big({"fp8": True})).step_s < t(big()).step_s
    assert "FP8 tensor cores" in est(big({"fp8": True}, gpu="a100-80gb")).reason


def test_pipeline_bubble_costs_micro_batches():
    one = t(big({"pipeline_parallel": 4, "zero_stage": 1}, wl={"gradient_accumulation": 4}))
    many = t(big({"pipeline_parallel": 4, "zero_stage": 1}, wl={"gradient_accumulation": 32}))
    assert one.tokens_per_s < many.tokens_per_s   # (p - 1) / m of idle stages amortized over more micro-batches


def test_selective_checkpointing_recomputes_attention_only():
    none, sel, full = (t(big(m)) for m in ({}, {"gradient_checkpointing": True, "checkpointing": "selective"},
                                          {"gradient_checkpointing": True}))
    assert 0 < sel.breakdown_s["recompute"] < full.breakdown_s["recompute"]
    assert none.step_s < sel.step_s < full.step_s


def test_compile_fuses_elementwise_work():
    assert t(big({"compile": True})).step_s < t(big()).step_s


def test_tiny_lora_steps_are_host_bound():
    s = scn("llama-3.2-1b", "h200", {"method": "lora"}, {"micro_batch_size": 1, "seq_len": 64})
    eff = Efficiency()
    fast_host = step_time(s, 1, replace(eff, host_us_per_kernel=1.0), est(s).model_memory.trainable_params)
    slow_host = step_time(s, 1, replace(eff, host_us_per_kernel=100.0), est(s).model_memory.trainable_params)
    assert slow_host.breakdown_s["forward"] > 5 * fast_host.breakdown_s["forward"]


def test_eager_expert_loop_pays_a_sync_per_expert():
    s = mixtral(2)
    eff = Efficiency()
    tp = est(s).model_memory.trainable_params
    a, b = step_time(s, 2, replace(eff, sync_us=0.0), tp), step_time(s, 2, replace(eff, sync_us=100.0), tp)
    assert b.step_s > a.step_s and b.by_layer_s["experts"] > a.by_layer_s["experts"]


def _pass_times_by_definition(ops, s, eff):
    """pass_times written plainly: per pass the GPU seconds, kernels, dequantization and syncs summed op by op."""
    from ftscope.estimate.compute import recomputed
    from ftscope.estimate.time import PASSES, op_time, rates
    r = rates(s, eff)
    gpu, kern, deq, syncs, layers, attention = [0.0] * 3, [0.0] * 3, [0.0] * 3, [0.0] * 3, {}, 0.0
    for op in ops:
        rec = recomputed(op, s.mix) if s.mix.gradient_checkpointing else 0.0
        acc = layers.setdefault(op.layer, [0.0] * 4)
        if op.kind == "dispatch":
            t = op.kernels * r.sync
            syncs[0] += t
            syncs[2] += t * rec
            acc[3] += t * (1 + rec)
            continue
        t, k = op_time(op, r), op.kernels * (r.compile_kernels if op.fusible else 1.0)
        back = 1.0 if op.kind == "dequant" else op.backward
        for i, f in enumerate((1.0, back, rec)):
            gpu[i] += t * f if i else t
            kern[i] += k * f if i else k
            if op.kind == "dequant":
                deq[i] += t * f if i else t
            acc[i] += t * f if i else t
        if op.kind == "attention":
            attention += t * (1 + back)
    scale = [max(kern[i] * r.host / gpu[i], 1.0) if gpu[i] > 0 else 1.0 for i in range(3)]
    parts = {p: (gpu[i] - deq[i]) * scale[i] + syncs[i] for i, p in enumerate(PASSES)}
    parts["dequant"] = sum(deq[i] * scale[i] for i in range(3))
    return parts, {n: v[0] * scale[0] + v[1] * scale[1] + v[2] * scale[2] + v[3] for n, v in layers.items()}, attention


@pytest.mark.parametrize("model,mix", [
    ("llama-2-7b", {"method": "full"}), ("llama-2-7b", {"method": "qlora", "gradient_checkpointing": True}),
    ("mixtral-8x7b", {"method": "qlora", "gradient_checkpointing": True}),
    ("mixtral-8x7b", {"method": "lora", "experts_backend": "eager", "checkpointing": "selective",
                      "gradient_checkpointing": True}),
    ("llama-2-7b", {"method": "lora", "compile": True, "gradient_checkpointing": True, "checkpointing": "per-op"}),
])
def test_pass_times_are_their_definition_op_by_op(model, mix):
    """pass_times (its sums kept in locals for speed) equals the plain per-pass sums, ==."""
    from ftscope.estimate.compute import micro_batch_ops
    from ftscope.estimate.time import pass_times
    s = scn(model, mix=mix)
    eff = load_calibration().for_gpu(s.cluster.gpu.key)[0]
    for batch, seq in ((1, 128.0), (3, 700.0), (16, 4096.0)):
        ops = micro_batch_ops(s, batch, seq)
        assert pass_times(ops, s, eff) == _pass_times_by_definition(ops, s, eff)


def test_shared_rates_are_rates_and_read_only_their_mix_fields():
    """time.shared_rates equals rates() on GPU types of every architecture and each precision, attention and compile
    setting; mixes that differ in no RATE_FIELDS field (method, sharding, checkpointing, FP8, layout) share one
    object, whose rates equal each mix's own rates()."""
    from dataclasses import fields

    from ftscope.estimate.time import RATE_FIELDS, gpu_rates, rates, shared_rates
    cal = load_calibration()
    others = [{"method": "full", "zero_stage": 3}, {"method": "qlora", "gradient_checkpointing": True},
              {"method": "lora", "fp8": True, "checkpointing": "selective", "gradient_checkpointing": True},
              {"method": "full", "tensor_parallel": 2, "optimizer": "sgd", "loss": "fused"}]
    for gpu in ("t4", "a40", "l40s", "h100-80gb", "b200", "mi300x"):
        base = scn(gpu=gpu, hw={"gpus_per_node": 2})  # one GPU object: the memo knows a GPU type by it
        for rate_mix in ({"precision": "bf16-mixed", "attention": "flash"}, {"precision": "fp32", "attention": "eager"},
                         {"precision": "bf16", "attention": "sdpa", "compile": True},
                         {"precision": "fp16-mixed", "attention": "flash3"}):
            made = []
            for other in others:
                s = base.with_(**other, **rate_mix)
                eff = cal.for_gpu(s.cluster.gpu.key)[0]
                r = shared_rates(s.cluster.gpu, s.mix, eff)
                assert r == rates(s, eff) == gpu_rates(s.cluster.gpu, s.mix, eff)
                made.append(r)
            assert all(r is made[0] for r in made)
    assert set(RATE_FIELDS) <= {f.name for f in fields(scn().mix)}
