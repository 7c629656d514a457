"""Memory under a parallel layout and activation policies (estimate/memory_layout.py, through memory_model)."""
from __future__ import annotations

import pytest

import ftscope
from ftscope.estimate.memory import memory_model
from ftscope.estimate.memory_layout import elementwise_saved_per_token, state_split


def scn(model="llama-2-7b", per=8, nodes=1, attention="flash", wl=None, **mix):
    return ftscope.load_scenario({"model": model, "hardware": {"gpu": "h100-80gb", "gpus_per_node": per, "nodes": nodes},
                                  "mix": {"method": "full", "attention": attention, **mix},
                                  "workload": {"micro_batch_size": 1, "seq_len": 4096, "gradient_accumulation": 8,
                                               **(wl or {})}})


def test_tensor_and_pipeline_parallel_split_the_model_states():
    dp = memory_model(scn(per=2))
    tp = memory_model(scn(per=2, tensor_parallel=2))
    assert tp.weights == pytest.approx(dp.weights / 2) and tp.optimizer == pytest.approx(dp.optimizer / 2)
    pp = memory_model(scn(per=4, pipeline_parallel=4))
    assert pp.weights == pytest.approx(memory_model(scn(per=4)).weights / 4)


def test_zero_shards_over_data_parallel_ranks_only():
    z1 = memory_model(scn(per=8, zero_stage=1))
    z1_tp = memory_model(scn(per=8, zero_stage=1, tensor_parallel=2))
    # 8 ranks of ZeRO-1 vs tp 2 x 4 ranks: the same shard of the optimizer per GPU
    assert z1_tp.optimizer == pytest.approx(z1.optimizer)


def test_expert_parallel_splits_only_the_experts():
    s = scn("mixtral-8x7b", expert_parallel=8)
    f = state_split(s)
    experts = sum(lin.params * n for lin, n in s.model.linears() if lin.group == "experts")
    assert f == pytest.approx((s.model.total_params - experts * 7 / 8) / s.model.total_params)


def test_sequence_and_context_parallel_split_activations():
    base = memory_model(scn(per=2)).activation_bytes(1, 4096)[0]
    sp = memory_model(scn(per=2, tensor_parallel=2, sequence_parallel=True)).activation_bytes(1, 4096)[0]
    no_sp = memory_model(scn(per=2, tensor_parallel=2)).activation_bytes(1, 4096)[0]
    cp = memory_model(scn(per=2, context_parallel=2)).activation_bytes(1, 4096)[0]
    assert sp < no_sp < base and cp < base


def test_checkpointing_policies_order_memory():
    act = {name: memory_model(s).activation_bytes(1, 4096)[0] for name, s in {
        "none": scn(attention="eager"),
        "selective": scn(attention="eager", gradient_checkpointing=True, checkpointing="selective"),
        "per-op": scn(attention="eager", gradient_checkpointing=True, checkpointing="per-op"),
        "every2": scn(attention="eager", gradient_checkpointing=True, checkpoint_every=2),
        "full": scn(attention="eager", gradient_checkpointing=True)}.items()}
    assert act["full"] < act["every2"] < act["per-op"] < act["none"]
    assert act["selective"] < act["none"]   # eager attention's scores are dropped
    assert elementwise_saved_per_token(scn().model, scn().mix) > 0


def test_compile_recomputes_the_norms_and_one_mlp_intermediate():
    """A traced compiled torchtune block (benchmarks/compiled_layer_saved.py: eager 24 h + 8 f, compiled 14 h + 6 f
    bytes per token) drops 10 h + 2 f per layer; per-op checkpointing drops the norms' fp32 copies and two of the
    gated MLP's intermediates (8 h + 4 f)."""
    s = scn(per=1)
    a, layers = s.model.arch, sum(n for _, n in s.model.layer_groups)
    h, f = a.hidden_size, a.intermediate_size
    assert elementwise_saved_per_token(s.model, s.mix, compiled=True) == 10 * h * layers + 2 * f * layers
    assert elementwise_saved_per_token(s.model, s.mix) == 8 * h * layers + 4 * f * layers


def test_compile_offload_and_optimizer_in_backward_save_memory():
    s = scn(per=1, wl={"gradient_accumulation": 1})
    base = memory_model(s)
    assert memory_model(s.with_(compile=True)).activation_bytes(1, 4096)[0] < base.activation_bytes(1, 4096)[0]
    assert memory_model(s.with_(activation_offload=True)).activation_bytes(1, 4096)[0] < base.activation_bytes(1, 4096)[0]
    assert memory_model(s.with_(optimizer_in_backward=True)).gradients < base.gradients / 4


def test_fsdp_cpu_offload_keeps_only_blocks_in_flight_of_gradients():
    """torch's CPUOffloadPolicy copies each sharded gradient to the host in backward."""
    on_gpu = memory_model(scn(fsdp="full_shard"))
    offload = memory_model(scn(fsdp="full_shard", offload="optimizer+params"))
    m = scn().model
    two_blocks = 2 * m.largest_layer_params() * on_gpu.gradients * 8 / m.total_params  # unsharded, per GPU
    assert offload.gradients == pytest.approx(two_blocks) and offload.gradients_in_forward == 0
    assert offload.gradients < on_gpu.gradients


def test_offloading_checkpointed_blocks_keeps_two_block_inputs():
    """Under checkpointing the offloaded tensors are the block inputs: two stay (in flight and prefetched)."""
    s = scn(per=1, wl={"gradient_accumulation": 1}, gradient_checkpointing=True)
    base, off = memory_model(s), memory_model(s.with_(activation_offload=True))
    a = base.acts
    head = a.head_per_token * 4096 + a.logits_saved_per_token * 4096
    assert base.activation_bytes(1, 4096)[0] == pytest.approx(a.checkpoint_per_token * 4096 + head)
    assert off.activation_bytes(1, 4096)[0] == pytest.approx(2 * a.checkpoint_layer_per_token * 4096 + head)
    assert a.checkpoint_layer_per_token * s.model.num_layers == pytest.approx(a.checkpoint_per_token)
