"""memory_arrays: many memory models' reserved bytes at once equal each model's own, exactly (==).

The models cover every branch of memory.py's phase points: checkpointing or not, activation offload, eager
attention's quadratic scores, a frozen, trained, tied or chunked LM head, fused and chunked losses, FSDP's
gathered stream, post-backward gradient pool, accumulation, paged optimizers and init floors, on one to 64 GPUs; at batch shapes from empty to
twice the solver's cap, one for all models or one per model.
"""
from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

import ftscope
from ftscope.estimate.memory import memory_model
from ftscope.estimate.memory_arrays import ModelArrays
from ftscope.estimate.solvers import BATCH_CAP
from ftscope.plan.space import SHARDING
from ftscope.spec.hardware import gpu_from_catalog


def _models(model: str, framework: str) -> list:
    base = ftscope.load_scenario({"model": model, "hardware": {"gpu": "h100-80gb"}, "framework": framework,
                                  "mix": {"method": "lora"},
                                  "workload": {"micro_batch_size": 1, "seq_len": 2048, "num_samples": 1000}})
    out = []
    for method, (zero, fsdp), ckpt, attention, loss, extra, ga, world in itertools.product(
            ("full", "lora", "qlora"), SHARDING[::2] + SHARDING[5:], (False, True), ("eager", "sdpa"),
            ("standard", "chunked", "fused"), ({}, {"activation_offload": True}, {"optimizer": "paged_adamw_8bit"}),
            (1, 4), (1, 8, 64)):
        mix = replace(base.mix, method=method, zero_stage=zero, fsdp=fsdp, gradient_checkpointing=ckpt,
                      attention=attention, loss=loss, **extra)
        cluster = replace(base.cluster, gpu=gpu_from_catalog("h100-80gb"), gpus_per_node=min(world, 8),
                          nodes=max(1, world // 8))
        try:
            out.append(memory_model(replace(base.with_(gradient_accumulation=ga), mix=mix, cluster=cluster)))
        except ftscope.FtscopeError:
            continue  # a combination the rules refuse
    return out


CASES = [("llama-3.2-1b", "hf-trainer"), ("llama-3.2-1b", "torchtune-0.1"), ("olmoe-1b-7b", "hf-trainer"),
         ("llama-3.2-1b", "fsdp-qlora"), ("mixtral-8x7b", "peft-kbit"), ("llama-3.2-1b", "torchtitan")]


@pytest.fixture(scope="module")
def models():
    return [m for case in CASES for m in _models(*case)]


def test_the_models_cover_every_branch(models):
    assert len(models) > 2000
    assert {m.checkpointing for m in models} == {False, True} and any(m.offload_activations for m in models)
    assert any(m.head_grad.weight and m.head_grad.chunks > 1 for m in models)
    assert any(m.head_grad.weight and m.head_grad.chunks == 1 for m in models)
    assert any(m.head_grad.at_embedding for m in models) and any(not m.head_grad.weight for m in models)
    assert any(m.stream_gathered for m in models) and any(m.reserved_floor for m in models)
    assert any(m.gradient_pool and not m.gradients_in_forward for m in models)
    assert any(m.acts.loss_tile_tokens for m in models) and any(m.acts.saved_per_token_quadratic for m in models)


@pytest.mark.parametrize("batch", [0, 1, 3, 17, BATCH_CAP, 2 * BATCH_CAP])
@pytest.mark.parametrize("seq", [1, 512, 2048.0, 8192])
def test_reserved_totals_and_peaks_equal_each_models_own(models, batch, seq):
    arrays = ModelArrays(np, models)
    totals, reserved, peaks = arrays.totals(batch, seq), arrays.totals(batch, seq, held=False), arrays.peaks(batch, seq)
    for i, m in enumerate(models):
        assert totals[:, i].tolist() == m.reserved_totals(batch, seq), (i, m)
        assert reserved[:, i].tolist() == m._reserved_of(m._points(batch, seq)), (i, m)
        assert peaks[i] == m.peak_bytes(batch, seq), (i, m)
    # the points' maximum taken a point at a time is the stacked array's, bit for bit
    assert peaks.tobytes() == np.maximum(arrays.least_reserved, totals.max(axis=0)).tobytes()


def test_one_batch_per_model(models):
    batches = np.array([(7 * i) % 300 + 1 for i in range(len(models))], np.int64)
    peaks = ModelArrays(np, models).peaks(batches, 1024)
    assert [float(p) for p in peaks] == [m.peak_bytes(int(b), 1024) for m, b in zip(models, batches)]
