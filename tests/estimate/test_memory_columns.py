"""memory_columns: many mixes' models on many GPU counts made as arrays equal the arrays of the models built one by
one (memory.py's models_of), exactly (==), field by field; and a mix it cannot make (columnar False) is one whose
models read what it leaves out.

The mixes cover every branch of models_of and split_states it mirrors: each method, ZeRO stage and FSDP, offload
(FSDP's CPU offload of gradients included), plain and paged optimizers, checkpointing, accumulation, tensor x
pipeline (x expert) layouts, on 1 to 64 GPUs, for recipes with and without the fused AdamW and FP32 adapters.
"""
from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

import ftscope
from ftscope.estimate.memory import mix_part, models_of, step_allocator
from ftscope.estimate.memory_arrays import MODEL, ModelArrays
from ftscope.estimate.memory_columns import Columns, columnar
from ftscope.plan.space import SHARDING
from ftscope.spec.hardware import gpu_from_catalog

WORLDS = (1, 2, 8, 16, 64)


def _scenarios(model: str, framework: str):
    """Per mix: its scenarios on every GPU count its layout divides."""
    base = ftscope.load_scenario({"model": model, "hardware": {"gpu": "h100-80gb"}, "framework": framework,
                                  "mix": {"method": "lora"},
                                  "workload": {"micro_batch_size": 1, "seq_len": 1024, "num_samples": 1000}})
    for method, (zero, fsdp), offload, optimizer, ckpt, layout, ga in itertools.product(
            ("full", "lora", "qlora"), SHARDING, ("none", "optimizer", "optimizer+params"),
            ("adamw", "paged_adamw_8bit"), (False, True),
            ({}, dict(tensor_parallel=2, sequence_parallel=True, pipeline_parallel=2)), (1, 4)):
        mix = replace(base.mix, method=method, zero_stage=zero, fsdp=fsdp, offload=offload, optimizer=optimizer,
                      gradient_checkpointing=ckpt, **layout)
        if base.model.is_moe and layout:
            mix = replace(mix, expert_parallel=2)
        scn = replace(base.with_(gradient_accumulation=ga), mix=mix)
        scns = []
        for world in WORLDS:
            if world % mix.model_parallel:
                continue
            cluster = replace(scn.cluster, gpu=gpu_from_catalog("h100-80gb"), gpus_per_node=min(world, 8),
                              nodes=max(1, world // 8))
            scns.append(replace(scn, cluster=cluster))
        yield scns


@pytest.mark.parametrize("model, framework", [("llama-3.2-1b", "hf-trainer"), ("olmoe-1b-7b", "hf-trainer"),
                                              ("llama-3.2-1b", "torchtune-0.1"), ("llama-3.2-1b", "fsdp-qlora"),
                                              ("mixtral-8x7b", "peft-kbit"), ("llama-3.2-1b", "torchtitan"),
                                              ("llama-3.2-1b", "peft-sft-2024")])
def test_columns_are_the_models_arrays(model, framework):
    columns, models, refused = Columns(), [], 0
    for scns in _scenarios(model, framework):
        part = mix_part(scns[0], step_allocator(scns[0]))
        if not columnar(part):
            refused += 1
            continue
        columns.add(part, [s.cluster.world_size for s in scns])
        models += models_of(part, scns)
    assert len(models) > 100
    made, want = columns.arrays(np), ModelArrays(np, models)
    for name, value in want.__dict__.items():
        if name == "fragmentation":
            assert all((a == b).all() for a, b in zip(made.fragmentation, value))
        elif isinstance(value, np.ndarray):
            assert value.dtype == getattr(made, name).dtype and (getattr(made, name) == value).all(), name
    assert set(MODEL) <= set(want.__dict__)
    assert refused < len(models)  # most mixes are made as columns


def test_only_mixes_whose_models_read_more_are_left_out():
    """columnar refuses a mix whose models have an init floor, an FSDP1 stream's pool (but shard_grad_op's held
    units) or an optimizer fused into backward (what Columns does not compute), and accepts the others."""
    seen = {True: 0, False: 0}
    for model, framework in (("llama-3.2-1b", "fsdp-qlora"), ("llama-3.2-1b", "torchtune-0.1"),
                             ("mixtral-8x7b", "peft-kbit"), ("llama-3.2-1b", "hf-trainer")):
        for scns in _scenarios(model, framework):
            part = mix_part(scns[0], step_allocator(scns[0]))
            built = models_of(part, scns)
            held = scns[0].mix.fsdp == "shard_grad_op"  # its units on the all-gather's stream: Columns makes them
            reads = any(m.reserved_floor or m.gradient_pool or (m.stream_pool or m.stream_gathered) and not held
                        for m in built)
            if reads:
                assert not columnar(part)
            seen[columnar(part)] += 1
    assert seen[True] and seen[False]


def test_joined_arrays_keep_each_row():
    scns = next(_scenarios("llama-3.2-1b", "hf-trainer"))
    models = models_of(mix_part(scns[0], step_allocator(scns[0])), scns)
    whole = ModelArrays(np, models)
    odd, even = list(range(1, len(models), 2)), list(range(0, len(models), 2))
    joined = ModelArrays(np, [models[i] for i in odd]).joined(np.array(odd), ModelArrays(np, [models[i] for i in even]),
                                                              np.array(even))
    assert (joined.totals(3, 1024) == whole.totals(3, 1024)).all() and joined.n == whole.n
