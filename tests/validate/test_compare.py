"""Predicted vs measured (validate/compare.py): checks per case, predictions, error summary."""
from __future__ import annotations

import math

import pytest

import ftscope
from ftscope.validate.cases import Case, load_cases
from ftscope.validate.compare import (MEMORY_FIELD, TIME_METRICS, Check, CheckResult, all_checks, case_checks,
                                      metric_family, run_validation, summary)


@pytest.fixture(scope="module")
def results():
    return run_validation(load_cases())


def test_validation_predicts_every_check(results):
    cases = load_cases()
    assert len(results) == len(all_checks(cases))
    assert {r.case_id for r in results} == {c.id for c in cases}
    for r in results:
        assert math.isfinite(r.predicted), (r.case_id, r.metric)
        assert r.predicted >= 0
        assert math.isfinite(r.error_pct)
        assert r.error_pct == pytest.approx((r.predicted - r.measured) / r.measured * 100)


def test_summary_has_median_and_max_per_metric(results):
    s = summary(results)
    families = {metric_family(r.metric) for r in results}
    assert set(s) == families
    assert {"samples_per_s", "peak_gib", "max_micro_batch_size"} <= families
    for fam, v in s.items():
        errs = sorted(abs(r.error_pct) for r in results if metric_family(r.metric) == fam)
        assert v["n"] == len(errs)
        assert v["max"] == pytest.approx(errs[-1])
        assert v["median"] == pytest.approx((errs[(len(errs) - 1) // 2] + errs[len(errs) // 2]) / 2)
        assert 0 <= v["median"] <= v["max"]


def test_results_serialise(results):
    d = results[0].to_dict()
    assert set(d) >= {"case", "group", "metric", "predicted", "measured", "error_pct", "note"}


def test_metric_family():
    assert metric_family("peak_gib:allocated") == metric_family("peak_gib:smi") == "peak_gib"
    assert metric_family("samples_per_s") == "samples_per_s"


def test_error_pct_and_nan_skipped_in_summary():
    over = CheckResult("a", "g", "step_s", 1.5, 1.0, "")
    under = CheckResult("b", "g", "step_s", 0.5, 1.0, "")
    nan = CheckResult("c", "g", "step_s", float("nan"), 1.0, "")
    assert over.error_pct == pytest.approx(50.0) and under.error_pct == pytest.approx(-50.0)
    s = summary([over, under, nan])
    assert s["step_s"]["n"] == 2 and s["step_s"]["median"] == pytest.approx(50.0)


def case(measured, scenario=None):
    scenario = scenario or {"model": "mixtral-8x7b", "hardware": {"gpu": "a40"},
                            "mix": {"method": "qlora", "gradient_checkpointing": True, "experts_backend": "eager"},
                            "workload": {"seq_len": 256, "micro_batch_size": 1}}
    return Case(id="t-1", scenario=scenario, measured=measured, source="test", confidence="high", group="t")


def test_samples_by_batch_become_one_check_per_batch():
    checks = case_checks(case({"samples_per_s_by_batch": {1: 0.3, 4: 1.0}, "max_micro_batch_size": 8}))
    by_metric = {}
    for c in checks:
        by_metric.setdefault(c.metric, []).append(c)
    assert sorted(c.scenario.workload.micro_batch_size for c in by_metric["samples_per_s"]) == [1, 4]
    (mb,) = by_metric["max_micro_batch_size"]
    assert mb.measured == 8
    assert mb.predict() == ftscope.estimate(mb.scenario, strict=False).max_micro_batch_size


def test_stage_times_by_top_k():
    stages = {"forward": 1.0, "backward": 2.0, "optimizer": 0.1}
    checks = case_checks(case({"step_s_by_top_k_and_batch": {"top8": {2: stages}},
                               "max_micro_batch_size_by_top_k": {"top2": 9}}))
    steps = [c for c in checks if c.metric == "fwd_bwd_opt_s"]
    assert len(steps) == 1 and steps[0].measured == pytest.approx(3.1)
    assert steps[0].scenario.mix.experts_top_k == 8 and steps[0].scenario.workload.micro_batch_size == 2
    assert {c.metric for c in checks} == {"fwd_bwd_opt_s", "forward_s", "backward_s", "optimizer_s", "max_micro_batch_size"}
    mb = [c for c in checks if c.metric == "max_micro_batch_size"][0]
    assert mb.scenario.mix.experts_top_k == 2
    # stage predictions partition the synchronized step (one GPU, bf16: no dequant or communication), and the
    # training loop's step adds host overhead on top
    pred = {c.metric: c.predict() for c in checks if c.metric in TIME_METRICS}
    assert pred["forward_s"] + pred["backward_s"] + pred["optimizer_s"] == pytest.approx(pred["fwd_bwd_opt_s"])
    step = ftscope.estimate(steps[0].scenario, strict=False).time
    assert step.step_s > pred["fwd_bwd_opt_s"] and step.breakdown_s["other"] > 0
    assert pred["backward_s"] > pred["forward_s"]


@pytest.mark.parametrize("metric_name", ["allocated", "reserved", "smi", "unknown"])
def test_memory_compared_in_the_measured_metric(metric_name):
    (chk,) = case_checks(case({"peak_gib": 30.0, "memory_metric": metric_name}))
    assert chk.metric == f"peak_gib:{metric_name}"
    mem = ftscope.estimate(chk.scenario, strict=False).to_dict()["memory"]
    assert chk.predict() == pytest.approx(mem[MEMORY_FIELD[metric_name]], abs=0.0005)  # the JSON rounds to 3 decimals
    assert mem["allocated_gib"] <= mem["peak_gib"] < mem["device_gib"]


def test_memory_is_compared_unrounded():
    """Exactly the estimate's bytes, not the JSON's three decimals (a tiny CPU model's few MiB read as 0.001 GiB)."""
    (chk,) = case_checks(case({"peak_gib": 0.001, "memory_metric": "allocated"},
                              {"model": "llama-3.2-1b", "mix": {"method": "lora"},
                               "workload": {"micro_batch_size": 1, "seq_len": 8}}))
    est = ftscope.estimate(chk.scenario, strict=False)
    assert chk.predict() == est.memory.allocated_bytes / 2**30


def test_paged_optimizer_states_are_outside_torchs_counters():
    """bitsandbytes pages them through cudaMallocManaged: allocated and reserved never see them, nvidia-smi does."""
    sc = {"model": "llama-3.2-1b", "hardware": {"gpu": "a100-80gb"},
          "mix": {"method": "full", "precision": "bf16", "optimizer": "paged_adamw_8bit"}, "workload": {"seq_len": 512}}
    by_kind = {}
    for kind in ("allocated", "reserved", "smi"):
        (chk,) = case_checks(case({"peak_gib": 30.0, "memory_metric": kind}, sc))
        by_kind[kind] = chk.predict()
    est = ftscope.estimate(chk.scenario, strict=False)
    paged = est.model_memory.paged_optimizer / 2**30
    assert paged > 0.9 * est.memory.categories["optimizer"] / 2**30
    assert by_kind["allocated"] == pytest.approx(est.memory.allocated_bytes / 2**30 - paged)
    assert by_kind["reserved"] == pytest.approx(est.memory.peak_bytes / 2**30 - paged)
    assert by_kind["smi"] > est.memory.peak_bytes / 2**30


def test_setups_override_the_scenario():
    sc = {"model": "llama-3.2-1b", "hardware": {"gpu": "a100-80gb"}, "mix": {"method": "lora"},
          "workload": {"seq_len": 512}}
    checks = case_checks(case({"memory_metric": "smi", "peak_by_setup_gib": {
        "full_1gpu": 20.0, "lora_zero3_2gpu": 5.0, "not_a_setup": 1.0}}, sc))
    assert len(checks) == 2
    full = [c for c in checks if "full_1gpu" in c.note][0]
    z3 = [c for c in checks if "lora_zero3_2gpu" in c.note][0]
    assert full.scenario.mix.method == "full"
    assert z3.scenario.mix.zero_stage == 3 and z3.scenario.cluster.world_size == 2


def test_check_predict_uses_the_given_calibration():
    from dataclasses import replace
    from ftscope.estimate.efficiency import Calibration, load_calibration
    (chk,) = [c for c in case_checks(case({"samples_per_s_by_batch": {2: 0.5}}))]
    base = load_calibration()
    slow = Calibration(replace(base.shared, step_overhead_s=base.shared.step_overhead_s + 10), {}, {})
    assert chk.predict(slow) < chk.predict(base)


def test_check_is_what_run_validation_reports():
    chk = Check("x", "x", "tokens_per_s", 1000.0,
                ftscope.load_scenario({"model": "llama-3.2-1b", "workload": {"seq_len": 512}}))
    assert chk.predict() == ftscope.estimate(chk.scenario, strict=False).time.tokens_per_s


def test_ladder_steps_add_their_changes_cumulatively():
    from ftscope.validate.compare import skipped_measurements
    sc = {"model": "llama-3.2-1b", "framework": "torchtune", "hardware": {"gpu": "a100-80gb"},
          "mix": {"method": "full", "loss": "standard", "gradient_checkpointing": False},
          "workload": {"seq_len": 512, "padding": "packed"}}
    c = case({"ladder_peak_active_gib_and_tokens_per_s": {
        "baseline": [1.0, 1.0], "plus_packing": [2.0, 2.0], "plus_chunked_cross_entropy": [3.0, 3.0],
        "plus_adamw_8bit": [4.0, 4.0], "plus_something_new": [5.0, 5.0]}}, sc)
    mem = {chk.note.split(";")[0]: chk.scenario.mix for chk in case_checks(c) if chk.metric == "peak_gib:allocated"}
    assert set(mem) == {"plus_packing", "plus_chunked_cross_entropy", "plus_adamw_8bit"}
    assert mem["plus_packing"].loss == "standard" and not mem["plus_packing"].compile
    # a later step keeps every earlier change: compile and the chunked loss are still on at the 8-bit AdamW row
    last = mem["plus_adamw_8bit"]
    assert last.compile and last.loss == "chunked" and last.gradient_checkpointing
    assert last.optimizer_in_backward and last.activation_offload and last.optimizer == "adamw_8bit"
    why = dict(skipped_measurements(c))
    assert "padded lengths" in why[f"{c.id}: baseline"] and f"{c.id}: plus_something_new" in why
