"""memory_part: a mix's models built from its shared part (mix_part, then memory.models_of per cluster) are the
models memory_model builds one scenario at a time, field for field, and build_memory_models is the two together."""
from __future__ import annotations

from dataclasses import replace

import ftscope
from ftscope.estimate.allocator_model import device_capacity
from ftscope.estimate.memory import build_memory_models, memory_model, models_of, step_allocator
from ftscope.estimate.memory_part import mix_part
from ftscope.spec.hardware import gpu_from_catalog


def _scns(mix: dict) -> list:
    base = ftscope.load_scenario({"model": "olmoe-1b-7b", "hardware": {"gpu": "h100-80gb", "gpus_per_node": 8}, "mix": mix,
                                  "workload": {"micro_batch_size": 1, "seq_len": 1024, "num_samples": 1000}})
    out = []
    for world, gpu in ((1, "a100-80gb"), (2, "t4"), (8, "h200"), (16, "h100-80gb")):
        cluster = replace(base.cluster, gpu=gpu_from_catalog(gpu), gpus_per_node=min(world, 8),
                          nodes=max(1, world // 8))
        out.append(replace(base, cluster=cluster))
    return out


def test_a_mix_part_and_its_clusters_are_memory_model():
    for mix in ({"method": "lora"}, {"method": "full", "zero_stage": 3}, {"method": "qlora", "fsdp": "full_shard"},
                {"method": "lora", "fsdp": "shard_grad_op"},
                {"method": "lora", "fsdp": "full_shard", "offload": "optimizer+params"},
                {"method": "full", "tensor_parallel": 2, "sequence_parallel": True, "expert_parallel": 2}):
        scns = [s for s in _scns(mix) if s.cluster.world_size % s.mix.model_parallel == 0]
        allocator = step_allocator(scns[0])
        part = mix_part(scns[0], allocator)
        want = [memory_model(s) for s in scns]
        assert models_of(part, scns) == want == build_memory_models(scns, allocator), mix
        capacities = [device_capacity(s, allocator) for s in scns]
        assert models_of(part, scns, capacities) == want  # the capacities a caller passes are the models' own
