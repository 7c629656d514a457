"""Collectives (estimate/comm.py): ring volumes, which compute hides them, and model-parallel traffic."""
from __future__ import annotations

import pytest

import ftscope
from ftscope.estimate.comm import Transfer, collectives, exposed, gather_passes, ring_s
from ftscope.estimate.efficiency import Efficiency
from ftscope.estimate.layout import layout
from ftscope.estimate.weight_memory import (NF4_BYTES, NF4_DATA_BYTES, gathered_bytes_per_weight, gathered_weight_bytes,
                                            quantized_params)

E = Efficiency()


def scn(per=8, nodes=1, model="llama-2-7b", wl=None, **mix):
    return ftscope.load_scenario({"model": model, "hardware": {"gpu": "h100-80gb", "gpus_per_node": per, "nodes": nodes},
                                  "mix": {"method": "full", **mix},
                                  "workload": {"micro_batch_size": 1, "seq_len": 4096, "gradient_accumulation": 8,
                                               **(wl or {})}})


def by_window(s):
    out = {}
    for t in collectives(s, E, s.model.total_params, 1, 4096):
        out[t.window] = out.get(t.window, 0.0) + t.seconds
    return out


def test_ring_volume():
    assert ring_s(1e9, 1, 100, E) == 0
    assert ring_s(1e9, 4, 100, E) == pytest.approx(0.75 * 1e9 / (100e9 * E.communication))
    assert ring_s(1e9, 4, 100, E, 2.0) == pytest.approx(2 * ring_s(1e9, 4, 100, E))


def test_data_parallel_windows():
    ddp = by_window(scn(zero_stage=0))
    assert set(ddp) == {"last_bwd"}                    # one all-reduce, behind the last backward
    z2 = by_window(scn(zero_stage=2))
    assert z2["bwd"] > 0 and z2["none"] > 0            # reduce-scatter per micro-batch, gather after the step
    fsdp = by_window(scn(fsdp="full_shard"))
    assert fsdp["fwd_bwd"] > z2["bwd"]                  # weights gathered every pass
    # FSDP recomputes a checkpointed block while it is gathered: no third gather
    gc = by_window(scn(fsdp="full_shard", gradient_checkpointing=True))
    assert gc["fwd_bwd"] == pytest.approx(fsdp["fwd_bwd"])
    ds = by_window(scn(zero_stage=3, gradient_checkpointing=True))
    assert ds["fwd_bwd"] > by_window(scn(zero_stage=3))["fwd_bwd"]


def test_model_parallel_traffic_is_exposed():
    tp = by_window(scn(tensor_parallel=8))
    assert tp["none"] > 0
    overlapped = by_window(scn(tensor_parallel=8, tp_comm_overlap=True))
    assert overlapped.get("none", 0.0) < tp["none"] and overlapped["fwd_bwd"] > 0
    ring = by_window(scn(context_parallel=8))
    assert ring["attention"] > 0                         # passed around while attention computes
    ulysses = by_window(scn(context_parallel=8, context_parallel_impl="all_to_all"))
    assert ulysses["none"] > 0 and "attention" not in ulysses
    moe = by_window(scn(model="mixtral-8x7b", expert_parallel=8, per=8))
    assert moe["none"] > 0
    assert by_window(scn(pipeline_parallel=2))["none"] > 0
    # Megatron's interleaved schedule sends while the next chunk computes
    interleaved = by_window(scn(pipeline_parallel=2, pipeline_schedule="interleaved", virtual_stages=2))
    assert "none" not in interleaved and interleaved["fwd_bwd"] > 0


def test_exposed_respects_windows_and_their_overlap():
    eff = Efficiency(comm_overlap=0.5)
    ts = [Transfer(1.0, "fwd_bwd", 0.1), Transfer(2.0, "bwd"), Transfer(0.3, "none")]
    out, hidden = exposed(ts, {"fwd_bwd": 2.0, "bwd": 1.0}, eff)
    # fwd_bwd hides min(0.9, 1.0); bwd min(2, 0.5); together at most 0.5 x 2.0
    assert hidden == pytest.approx(1.0) and out == pytest.approx(3.3 - 1.0)
    assert exposed([], {}, eff) == (0.0, 0.0)


def test_collectives_through_host_memory_hide_their_own_share():
    eff = Efficiency(comm_overlap=0.8, comm_overlap_host=0.0)
    ts = [Transfer(1.0, "fwd_bwd")]
    assert exposed(ts, {"fwd_bwd": 2.0}, eff) == (0.0, 1.0)
    assert exposed(ts, {"fwd_bwd": 2.0}, eff, host_staged=True) == (1.0, 0.0)


def _gather_seconds(s):
    """Seconds of the ZeRO-3 / FSDP weight all-gathers of one step, no per-collective latency or hook."""
    no_latency = Efficiency(collective_latency_us=0.0, zero3_hook_us=0.0)
    return sum(t.seconds for t in collectives(s, no_latency, s.model.total_params, 1, 4096) if t.window == "fwd_bwd")


@pytest.mark.parametrize("framework,mix,per_weight", [
    ("hf-trainer", {"zero_stage": 3}, NF4_DATA_BYTES),                           # bitsandbytes: the data alone
    ("hf-trainer", {"zero_stage": 3, "nested_quant": False}, NF4_DATA_BYTES),    # whatever its state's size
    ("torchtune", {"fsdp": "full_shard"}, NF4_BYTES),                            # torchao: the scalers too
])
def test_zero3_qlora_gathers_the_bytes_per_weight_the_memory_model_gathers(framework, mix, per_weight):
    """The time model's all-gathers move what the memory model's gathered units hold: each 4-bit weight at
    gathered_bytes_per_weight, what stays bf16 (embeddings, norms, LM head) and the LoRA adapters at 2 bytes."""
    s = ftscope.load_scenario({"model": "llama-2-7b", "framework": framework,
                               "hardware": {"gpu": "h100-80gb", "gpus_per_node": 8},
                               "mix": {"method": "qlora", "gradient_checkpointing": True, **mix},
                               "workload": {"micro_batch_size": 1, "seq_len": 4096, "gradient_accumulation": 8}})
    assert gathered_bytes_per_weight(s) == per_weight
    quantized = quantized_params(s)
    adapters = s.model.lora_params(s.mix.lora_rank, s.mix.lora_targets) * 2.0  # gathered with their blocks
    want = quantized * per_weight + (s.model.total_params - quantized) * 2.0 + adapters
    assert 0.07 < (s.model.total_params - quantized) * 2.0 / want < 0.2  # Llama-2-7B's embeddings and head: 14 %
    assert gathered_weight_bytes(s) == want
    passes = 2.0 if s.mix.fsdp else 3.0   # DeepSpeed fetches again for the recompute
    assert gather_passes(s) == passes
    assert _gather_seconds(s) == pytest.approx(8 * passes * ring_s(want, 8, layout(s).dp_gbs, E), rel=1e-12)


def test_fsdp_gathers_the_dtype_it_computes_in_and_shard_grad_op_the_4bit_data_once():
    """fp32 runs gather fp32 weights (4 bytes), mixed and bf16 runs the bf16 ones; FSDP shard_grad_op gathers every
    weight once per step, a QLoRA base as its 4-bit data (gathered_weight_bytes), like full_shard's passes."""
    fp32, bf16 = scn(fsdp="full_shard", precision="fp32"), scn(fsdp="full_shard", precision="bf16-mixed")
    assert gathered_weight_bytes(fp32) == 2 * gathered_weight_bytes(bf16) == 4.0 * fp32.model.total_params
    assert _gather_seconds(fp32) == pytest.approx(2 * _gather_seconds(bf16), rel=1e-12)
    for method in ("qlora", "lora"):
        s = scn(method=method, fsdp="shard_grad_op")
        assert _gather_seconds(s) == pytest.approx(ring_s(gathered_weight_bytes(s), 8, layout(s).dp_gbs, E), rel=1e-12)
    assert gathered_weight_bytes(scn(method="qlora", fsdp="shard_grad_op")) < 0.3 * gathered_weight_bytes(scn(
        method="lora", fsdp="shard_grad_op"))
