"""estimate/shared.py: a sweep's shared work gives every candidate the estimate the unshared path gives."""
from __future__ import annotations

import json

import pytest

import ftscope
from ftscope.estimate import estimate
from ftscope.estimate.efficiency import load_calibration
from ftscope.estimate.shared import Shared, shared_for
from ftscope.spec.hardware import gpu_from_catalog

GPUS = ("a40", "a100-80gb", "h100-80gb", "l4", "t4", "mi300x")
DS = {"num_samples": 2000, "mean_tokens": 187, "median_tokens": 174, "p99_tokens": 411, "max_tokens": 1024}
CASES = {
    "dense LoRA, ZeRO-2": ("llama-2-7b", {"method": "lora", "zero_stage": 2}, {"seq_len": 1024, "dataset": DS}),
    "dense full, eager attention, ZeRO-3": ("llama-2-7b", {"method": "full", "zero_stage": 3, "attention": "eager"},
                                            {"seq_len": 512}),
    "MoE QLoRA, expert modules": ("mixtral-8x7b", {"method": "qlora", "gradient_checkpointing": True,
                                                   "attention": "flash", "experts_backend": "modules"},
                                  {"seq_len": 1024, "dataset": DS}),
    "layouts: TP 2 + SP, 2 pipeline stages, ZeRO-1": ("llama-2-70b", {"method": "full", "tensor_parallel": 2,
                                                                      "sequence_parallel": True,
                                                                      "pipeline_parallel": 2, "zero_stage": 1},
                                                      {"seq_len": 2048, "gradient_accumulation": 4}),
}


def _scenario(model: str, mix: dict, wl: dict):
    gpus = mix.get("tensor_parallel", 1) * mix.get("pipeline_parallel", 1)
    return ftscope.load_scenario({"model": model, "hardware": {"gpu": "a40", "gpus_per_node": gpus}, "mix": mix,
                                  "workload": {"micro_batch_size": "max", **wl}})


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("margin", [0.0, 0.05])
def test_shared_estimates_equal_unshared_ones(case, margin):
    base = _scenario(*CASES[case])
    cal = load_calibration()
    shared = Shared(base)
    for key in GPUS:
        gpu = gpu_from_catalog(key)
        for count, nodes in ((1, 1), (2, 1), (4, 1), (8, 1), (8, 4)):  # one node, then a multi-node cluster
            if count % base.mix.model_parallel:
                continue
            cand = base.with_(gpu=gpu, gpus_per_node=count, nodes=nodes)
            alone = estimate(cand, margin=margin, strict=False, calibration=cal)
            swept = estimate(cand, margin=margin, strict=False, calibration=cal, shared=shared)
            assert json.dumps(swept.to_dict(), default=str) == json.dumps(alone.to_dict(), default=str), (key, count)


def test_a_scenario_the_memo_does_not_cover_takes_the_unshared_path():
    base = _scenario(*CASES["dense LoRA, ZeRO-2"]).with_(gpus_per_node=4)
    shared = Shared(base)
    assert shared_for(shared, base.with_(gpus_per_node=4)) is shared  # only the cluster changed
    other = base.with_(zero_stage=3)                                  # another mix: its own estimate
    assert shared_for(shared, other) is None
    cal = load_calibration()
    estimate(base, strict=False, calibration=cal, shared=shared)      # fills the memo with ZeRO-2's numbers
    swept = estimate(other, strict=False, calibration=cal, shared=shared)
    alone = estimate(other, strict=False, calibration=cal)
    assert swept.to_dict() == alone.to_dict()
    assert swept.memory.peak_bytes != estimate(base, strict=False, calibration=cal).memory.peak_bytes


def test_a_full_memo_starts_over_and_still_answers(monkeypatch):
    import importlib

    monkeypatch.setattr(importlib.import_module("ftscope.estimate.shared"), "MEMO_LIMIT", 3)
    memo = Shared(_scenario(*CASES["dense LoRA, ZeRO-2"]))
    assert [memo.get(("k", i), lambda i=i: i * i) for i in range(10)] == [i * i for i in range(10)]
    assert len(memo._memo) <= 3
