"""pass_bounds: one signature's micro-batch seconds on every GPU type at once equal bounds.micro_batch_seconds."""
from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

import ftscope
from ftscope.estimate.efficiency import load_calibration
from ftscope.plan.bounds import micro_batch_seconds
from ftscope.plan.pass_bounds import micro_batch_seconds_per_gpu
from ftscope.spec.hardware import gpu_from_catalog

GPUS = ["a100-80gb", "h100-80gb", "l40s", "mi300x", "rtx-4090", "b200"]


def _scn(model: str, **mix):
    return ftscope.load_scenario({"model": model, "hardware": {"gpu": "a100-80gb", "gpus_per_node": 2},
                                  "mix": {"method": "lora", **mix},
                                  "workload": {"micro_batch_size": 1, "seq_len": 2048, "gradient_accumulation": 4}})


@pytest.mark.parametrize("model", ["llama-3.2-1b", "olmoe-1b-7b"])
def test_micro_batch_seconds_per_gpu_are_each_gpus_own(model):
    """Dense and MoE; eager, sdpa and flash attention; checkpointing; QLoRA's dequantization; torch.compile's
    fused elementwise ops; grouped and per-expert matmuls; tensor parallelism; host-bound micro-batches of one
    short sequence and GPU-bound ones of 16 long ones."""
    cal = load_calibration()
    mixes = [dict(), dict(attention="eager"), dict(attention="flash", gradient_checkpointing=True),
             dict(method="qlora", gradient_checkpointing=True), dict(compile=True), dict(method="full"),
             dict(experts_backend="modules"), dict(tensor_parallel=2, sequence_parallel=True)]
    checked = 0
    for mix, (batch, length) in itertools.product(mixes, ((1, 37.0), (16, 2048.0))):
        if "experts_backend" in mix and model != "olmoe-1b-7b":
            continue
        base = _scn(model, **mix)
        scns = [replace(base, cluster=replace(base.cluster, gpu=gpu_from_catalog(g))) for g in GPUS]
        effs = [cal.for_gpu(g)[0] for g in GPUS]
        got = micro_batch_seconds_per_gpu(np, scns, effs, batch, length)
        want = [micro_batch_seconds(s, batch, length, e) for s, e in zip(scns, effs)]
        assert got.tolist() == pytest.approx(want, rel=1e-12, abs=0), (mix, batch)
        assert len(set(want)) > 1
        checked += 1
    assert checked >= 14
