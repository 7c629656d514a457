"""Run cost (estimate/cost.py): steps, hours, GPU-hours and dollars from dated prices or an override."""
from __future__ import annotations

import math

import pytest

import ftscope
from ftscope import catalog
from ftscope.estimate.cost import price_of


def scn(gpu="a100-80gb", wl=None, hw=None, price=None, mix=None):
    d = {"model": "llama-3.2-1b", "hardware": {"gpu": gpu, **(hw or {})},
         "mix": {"method": "lora", "attention": "sdpa", **(mix or {})},
         "workload": {"micro_batch_size": 2, "seq_len": 256, "num_samples": 1000, **(wl or {})}}
    if price is not None:
        d["price"] = {"usd_per_gpu_hour": price}
    return ftscope.load_scenario(d)


def run(s):
    e = ftscope.estimate(s, strict=False)
    return e, e.run


@pytest.mark.parametrize("b,ga,gpus,epochs,samples", [(2, 1, 1, 1, 1000), (3, 2, 4, 2.5, 1000), (7, 3, 2, 1, 99),
                                                      (64, 1, 8, 3, 10)])
def test_steps_hours_and_dollars(b, ga, gpus, epochs, samples):
    s = scn(wl={"micro_batch_size": b, "gradient_accumulation": ga, "epochs": epochs, "num_samples": samples},
            hw={"gpus_per_node": gpus})
    e, r = run(s)
    assert r.steps == math.ceil(samples * epochs / (b * ga * gpus))
    assert r.hours == pytest.approx(r.steps * e.time.step_s / 3600, rel=1e-12)
    assert r.gpu_hours == pytest.approx(r.hours * gpus, rel=1e-12)
    assert r.usd == pytest.approx(r.gpu_hours * r.usd_per_gpu_hour, rel=1e-12)


def test_dataset_num_samples_sets_the_epoch():
    ds = {"num_samples": 15000, "mean_tokens": 187, "median_tokens": 174, "p99_tokens": 411, "max_tokens": 1024}
    _, r = run(scn(wl={"dataset": ds, "seq_len": 1024, "micro_batch_size": 4, "epochs": 10, "num_samples": None}))
    assert r.steps == math.ceil(15000 * 10 / 4)


def test_catalog_price_is_a_listed_price_for_that_gpu():
    _, r = run(scn("a40"))
    listed = {p["usd_per_gpu_hour"] for p in catalog.price_list() if p["gpu"] == "a40"}
    assert r.usd_per_gpu_hour in listed
    assert r.usd_per_gpu_hour == min(p["usd_per_gpu_hour"] for p in catalog.prices_for("a40"))
    assert r.price_source and "catalog" not in r.price_source


def test_price_override_beats_the_catalog():
    base_e, base = run(scn("a40"))
    e, r = run(scn("a40", price=7.5))
    assert r.usd_per_gpu_hour == 7.5
    assert r.price_source == "scenario price.usd_per_gpu_hour"
    assert r.usd == pytest.approx(r.gpu_hours * 7.5, rel=1e-12)
    assert r.hours == pytest.approx(base.hours, rel=1e-12)  # price changes dollars only
    assert e.to_dict()["run"]["usd_per_gpu_hour"] == 7.5


def test_gpu_without_price_gives_no_dollars():
    custom = {"name": "lab-gpu", "memory_gib": 80, "fp16_tflops": 300, "fp32_tflops": 20, "memory_bandwidth_gbs": 2000}
    e, r = run(scn(custom))
    assert price_of(e.scenario) == (None, "inline GPU: set price.usd_per_gpu_hour")
    assert r.usd is None and r.usd_per_gpu_hour is None
    # a GPU derived from a catalog one is hypothetical too: it does not inherit the base's price
    e2, r2 = run(scn({"base": "a100-80gb", "bf16_tflops": 624}))
    assert r2.usd is None and price_of(e2.scenario)[0] is None
    assert r.hours > 0 and r.gpu_hours > 0
    assert e.to_dict()["run"]["usd"] is None
    # ... unless the scenario gives one
    _, priced = run(scn(custom, price=2.0))
    assert priced.usd == pytest.approx(priced.gpu_hours * 2.0)


def test_cost_scales_with_epochs():
    _, one = run(scn(wl={"epochs": 1, "num_samples": 4000}))
    _, three = run(scn(wl={"epochs": 3, "num_samples": 4000}))
    assert three.steps == 3 * one.steps
    assert three.usd == pytest.approx(3 * one.usd, rel=1e-9)


def test_data_parallel_splits_the_steps():
    _, one = run(scn(wl={"num_samples": 8000}))
    _, eight = run(scn(wl={"num_samples": 8000}, hw={"gpus_per_node": 8}))
    assert eight.steps == one.steps // 8
    assert eight.hours < one.hours
    assert eight.gpu_hours >= one.gpu_hours * 0.99  # same work, plus communication


@pytest.mark.parametrize("layout", [{"tensor_parallel": 4, "sequence_parallel": True}, {"pipeline_parallel": 2},
                                    {"context_parallel": 2, "tensor_parallel": 2}])
def test_model_parallel_ranks_share_a_micro_batch(layout):
    """A tensor, pipeline or context group runs one micro-batch: 8 GPUs at model-parallel degree m are 8 / m
    data-parallel replicas, and a step covers micro-batch x accumulation x replicas samples."""
    s = scn(wl={"num_samples": 8000, "gradient_accumulation": 2}, hw={"gpus_per_node": 8}, mix=layout)
    e, r = run(s)
    replicas = 8 // s.mix.model_parallel
    assert r.steps == math.ceil(8000 / (2 * 2 * replicas))
    assert e.time.samples_per_s == pytest.approx(2 * 2 * replicas / e.time.step_s, rel=1e-12)
