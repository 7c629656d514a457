"""A run's trained state per GPU (estimate/state_memory.py): bytes per trainable parameter by precision and engine,
and how ZeRO / FSDP shard them and offload moves them."""
from __future__ import annotations

import pytest

import ftscope
from ftscope.estimate.state_memory import sharded_states, state_bytes


def scn(model="llama-3.2-1b", mix=None, gpus=1):
    return ftscope.load_scenario({"model": model, "hardware": {"gpu": "a100-80gb", "gpus_per_node": gpus},
                                  "mix": {"attention": "flash", **(mix or {})},
                                  "workload": {"micro_batch_size": 1, "seq_len": 512}})


@pytest.mark.parametrize("mix, gpus, expected", [
    ({"method": "full"}, 1, (4.0, 4.0, 8.0, False)),                                  # torch AMP: fp32 params
    ({"method": "full", "zero_stage": 2}, 2, (2.0, 2.0, 12.0, False)),                # bf16 copy, fp32 master
    ({"method": "full", "precision": "bf16"}, 1, (2.0, 2.0, 4.0, True)),              # pure bf16: bf16 moments
    ({"method": "full", "precision": "fp32"}, 1, (4.0, 4.0, 8.0, False)),
    ({"method": "full", "precision": "bf16", "optimizer": "adamw_8bit"}, 1, (2.0, 2.0, 2.0, False)),
])
def test_state_bytes_by_precision_and_engine(mix, gpus, expected):
    b = state_bytes(scn(mix=mix, gpus=gpus))
    assert (b.weight, b.gradient, b.optimizer, b.low_states) == expected


@pytest.mark.parametrize("stage, shards", [(0, (1, 1, 1)), (1, (1, 1, 4)), (2, (1, 4, 4)), (3, (4, 4, 4))])
def test_zero_stages_shard_optimizer_then_gradients_then_weights(stage, shards):
    s = scn(mix={"method": "full", "zero_stage": stage}, gpus=4)
    per, p = state_bytes(s), s.model.total_params
    w, g, o, cpu = sharded_states(s.mix, 4, 0.0, p, per)
    assert (w, g, o, cpu) == pytest.approx((p * per.weight / shards[0], p * per.gradient / shards[1],
                                            p * per.optimizer / shards[2], 0.0))


def test_offload_moves_states_and_then_parameters_to_the_host():
    s = scn(mix={"method": "full", "zero_stage": 3, "offload": "optimizer+params"}, gpus=4)
    per, p = state_bytes(s), s.model.total_params
    w, g, o, cpu = sharded_states(s.mix, 4, 0.0, p, per)
    assert w == 0 and o == 0 and g == pytest.approx(p * per.gradient / 4)
    assert cpu == pytest.approx(p * per.optimizer / 4 + p * 4.0 / 4 + p * per.weight / 4)


def test_replicated_bytes_stay_whole_on_the_gpu_when_the_rest_is_sharded_or_offloaded():
    """bitsandbytes' quantization state (weight_memory.kbit_state_bytes) is neither sharded nor offloaded."""
    s = scn("llama-2-70b", mix={"method": "qlora", "fsdp": "full_shard"}, gpus=4)
    per, frozen, r = state_bytes(s), 36e9, 1e9
    w, *_ = sharded_states(s.mix, 4, frozen, 0, per, r)
    assert w == pytest.approx((frozen - r) / 4 + r)
    assert sharded_states(s.mix, 1, frozen, 0, per, r)[0] == pytest.approx(frozen)  # one GPU: the same bytes
    off = scn("llama-2-70b", mix={"method": "qlora", "fsdp": "full_shard", "offload": "optimizer+params"}, gpus=4)
    w, _, _, cpu = sharded_states(off.mix, 4, frozen, 0, per, r)
    assert w == pytest.approx(r) and cpu == pytest.approx((frozen - r) / 4)
