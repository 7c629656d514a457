"""probes: a search's probes evaluated together answer what one MemoryProbe (and the memory model) answers, and a
mix whose model does not read the gradient accumulation (reads_accumulation, only_forward_gradients) has one model.
"""
from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from ftscope.estimate.memory import memory_model
from ftscope.plan.memory_probe import MemoryProbe
from ftscope.plan.probes import Probes, only_forward_gradients, reads_accumulation
from ftscope.plan.space import SHARDING
from tests.plan.test_memory_probe import WORLDS, _on, _scn


def test_the_peak_at_micro_batch_one_keeps_the_allocator_floor():
    """What init left reserved bounds the peak at every micro-batch, 1 included: a probe (one at a time, or many
    together) answers the model's peak_bytes even where that floor is above every phase's total."""
    scn = _on(_scn("olmoe-1b-7b", "hf-trainer"), 8, "h200")
    model = memory_model(scn)
    high = replace(model, reserved_floor=2 * model.peak_bytes(1, 1024))
    assert high.peak_bytes(1, 1024) == high.least_reserved > max(high.reserved_totals(1, 1024))
    for mem in (model, high):
        one = MemoryProbe(scn, 1024, model=mem)
        assert one.peak_at_one == one.peak(1) == mem.peak_bytes(1, 1024)
        many = Probes(1024)
        many.add_models([scn], [mem])
        assert many.peaks_at_one(np).tolist() == [mem.peak_bytes(1, 1024)]


@pytest.mark.parametrize("model, framework", [("llama-3.2-1b", "hf-trainer"), ("olmoe-1b-7b", "hf-trainer"),
                                              ("mixtral-8x7b", "peft-kbit"), ("llama-3.2-1b", "peft-sft-2024")])
def test_a_mix_that_does_not_read_the_accumulation_has_one_model(model, framework):
    """reads_accumulation: a ZeRO mix's memory model is the same with and without accumulation (the probes then
    read its peaks for either), for every method (a trained head included), offload, optimizer, checkpointing and
    layout on 1 to 64 GPUs; a mix without ZeRO reads it (the test would pass vacuously otherwise), and where
    only_forward_gradients says so, only as its gradients in forward."""
    base = _scn(model, framework)
    equal = differ = dropped = 0
    for method, (zero, fsdp), offload, optimizer, ckpt, layout in itertools.product(
            ("full", "lora", "qlora"), SHARDING, ("none", "optimizer", "optimizer+params"),
            ("adamw", "paged_adamw_8bit"), (False, True),
            (dict(), dict(tensor_parallel=2, sequence_parallel=True, pipeline_parallel=2))):
        mix = replace(base.mix, method=method, zero_stage=zero, fsdp=fsdp, offload=offload, optimizer=optimizer,
                      gradient_checkpointing=ckpt, **layout)
        for world, gpu in WORLDS:
            if world % mix.model_parallel:
                continue
            one, four = (memory_model(_on(replace(base.with_(gradient_accumulation=ga), mix=mix), world, gpu))
                         for ga in (1, 4))
            if not reads_accumulation(mix):
                assert one == four, (method, zero, offload, optimizer, ckpt, layout, world)
                equal += 1
            else:
                differ += one != four
            if only_forward_gradients(mix):
                assert one == replace(four, gradients_in_forward=0.0), (method, zero, offload, optimizer, layout, world)
                dropped += four.gradients_in_forward > 0
    assert equal > 300 and differ > 100 and dropped > 100
