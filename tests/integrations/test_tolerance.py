"""The published error per metric, and when a measured step goes past it."""
from __future__ import annotations

import pytest

import ftscope
from ftscope.integrations.tolerance import PUBLISHED_ERROR, Deviation, deviations, measured_metrics, warning_text


def test_a_step_is_flagged_past_the_published_max_not_the_median():
    median, worst = PUBLISHED_ERROR["peak_gib:allocated"]
    assert median < worst
    inside = Deviation("peak_gib:allocated", 10.0, 10.0 * (1 + (median + worst) / 2), worst)
    outside = Deviation("peak_gib:allocated", 10.0, 10.0 * (1 - worst - 0.01), worst)
    assert not inside.exceeds and outside.exceeds
    assert outside.text().startswith("peak tensor memory 10.00 GiB measured, 8.41 estimated (-15.9 %")
    assert Deviation("peak_gib:allocated", 0.5, 0.25, worst).text().startswith("peak tensor memory 512.0 MiB measured, 256.0")


def test_cpu_steps_compare_tensor_memory_only_cuda_steps_time_too():
    step = {"memory": {"peak_allocated_bytes": 2**30, "peak_reserved_bytes": 2**31}, "step_s": 0.5, "uniform_shape": True}
    assert measured_metrics(step, on_cuda=False) == {"peak_gib:allocated": 1.0}
    assert measured_metrics(step, on_cuda=True) == {"peak_gib:allocated": 1.0, "peak_gib:reserved": 2.0, "fwd_bwd_opt_s": 0.5}
    assert "fwd_bwd_opt_s" not in measured_metrics({**step, "uniform_shape": False}, on_cuda=True)


def test_deviations_read_the_estimate_as_validate_does():
    scn = ftscope.load_scenario({"model": "llama-3.2-1b", "hardware": {"gpu": "h200"}, "mix": {"method": "lora"},
                                 "workload": {"micro_batch_size": 2, "seq_len": 1024, "padding": "max_length"}})
    est = ftscope.estimate(scn, strict=False)
    found = {d.metric: d for d in deviations({"peak_gib:allocated": 5.0, "fwd_bwd_opt_s": 0.2}, est, scn)}
    assert found["peak_gib:allocated"].predicted == est.memory.allocated_bytes / 2**30
    assert found["fwd_bwd_opt_s"].predicted == pytest.approx(est.time.step_s - est.time.breakdown_s["other"])
    text = warning_text(7, list(found.values()), "/runs/x.sqlite")
    assert text.count("measured") == sum(d.exceeds for d in found.values())
    assert "at step 7" in text and "ftscope validate --db /runs/x.sqlite" in text
