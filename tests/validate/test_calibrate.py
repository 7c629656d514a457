"""Calibration (validate/calibrate.py): deterministic, and it recovers known efficiency parameters from
synthetic measurements generated with them."""
from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pytest

import ftscope
from ftscope.estimate.efficiency import Calibration, Efficiency
from ftscope.validate.calibrate import (FIT_PARAMS, MIN_PER_GPU_POINTS, TimePoint, abs_pct_errors, calibrate,
                                        cross_validate, cross_validate_per_gpu, fit, time_points)
from ftscope.validate.cases import load_cases
from ftscope.validate.compare import Check, all_checks

TRUTH = dataclasses.replace(Efficiency(), matmul=0.6, matmul_half_rows=120.0, attention=0.55, bandwidth=0.7,
                            dequant_bandwidth=0.5, kernel_floor_us=10.0, step_overhead_s=0.05,
                            expert_dispatch_us=300.0)


def d(model="llama-3.2-1b", gpu="a100-80gb", mix=None, b=1, seq=512):
    return {"model": model, "hardware": {"gpu": gpu}, "mix": {"attention": "flash", **(mix or {})},
            "workload": {"micro_batch_size": b, "seq_len": seq}}


MOE = {"method": "qlora", "experts_backend": "eager", "gradient_checkpointing": True,
       "lora_targets": ["w1", "w2", "w3", "gate"]}


def synthetic_specs():
    """Points that pin each parameter: short GEMMs at several row counts (matmul, half rows), small steps
    (kernel floor, step overhead), long contexts (attention), optimizer steps of two sizes (bandwidth),
    QLoRA forward passes (dequantization) and the eager MoE loop at top-2 and top-8 (dispatch)."""
    out = []
    for b in (1, 2, 4, 8, 16):
        out += [(d(mix={"method": "lora"}, b=b, seq=64), m) for m in ("step_s", "forward_s")]
    for b in (1, 4):
        out.append((d("llama-2-7b", mix={"method": "lora"}, b=b, seq=1024), "forward_s"))
        out.append((d("llama-2-7b", mix={"method": "qlora"}, b=b, seq=256), "forward_s"))
    for seq in (16384, 32768):
        out.append((d(mix={"method": "lora"}, seq=seq), "forward_s"))
    for model in ("llama-3.2-1b", "llama-2-7b"):
        out.append((d(model, mix={"method": "full"}, seq=128), "optimizer_s"))
    for b in (1, 2, 4):
        for k in (2, 8):
            for metric in ("step_s", "forward_s"):
                out.append((d("mixtral-8x7b", "a40", {**MOE, "experts_top_k": k}, b, 256), metric))
    return out


@pytest.fixture(scope="module")
def synthetic_points():
    checks = [Check(f"syn-{i}", "syn", metric, 1.0, ftscope.load_scenario(sc))
              for i, (sc, metric) in enumerate(synthetic_specs())]
    pts = time_points(checks)
    assert len(pts) == len(checks)
    return [dataclasses.replace(p, check=dataclasses.replace(p.check, measured=p.predict(TRUTH))) for p in pts]


def test_synthetic_measurements_are_not_the_default_predictions(synthetic_points):
    # the start point is far enough from the truth that recovering it means something
    errs = abs_pct_errors(synthetic_points, Efficiency())
    assert max(errs) > 20


RECOVERED = ("matmul", "bandwidth", "dequant_bandwidth", "kernel_floor_us", "step_overhead_s", "expert_dispatch_us")


def test_fit_recovers_known_parameters(synthetic_points):
    eff, rms = fit(synthetic_points, base=Efficiency())
    for name in RECOVERED:
        assert getattr(eff, name) == pytest.approx(getattr(TRUTH, name), rel=0.07), name
    assert rms < 0.01
    assert max(abs_pct_errors(synthetic_points, eff)) < 1.0
    # parameters the fit does not touch stay as they were
    fitted = {p[0] for p in FIT_PARAMS}
    for f in dataclasses.fields(Efficiency):
        if f.name not in fitted:
            assert getattr(eff, f.name) == getattr(Efficiency(), f.name)


def test_fit_respects_bounds(synthetic_points):
    eff, _ = fit(synthetic_points)
    for name, lo, hi in FIT_PARAMS:
        assert lo * (1 - 1e-9) <= getattr(eff, name) <= hi * (1 + 1e-9), name


def test_calibration_of_synthetic_checks(synthetic_points):
    cal = calibrate([p.check for p in synthetic_points], ["synthetic"])
    counts = Counter(p.check.scenario.cluster.gpu.key for p in synthetic_points)
    assert isinstance(cal, Calibration)
    assert set(cal.per_gpu) == {g for g, n in counts.items() if n >= MIN_PER_GPU_POINTS} != set()
    for gpu, eff in cal.per_gpu.items():  # one truth behind every point: the own refit finds it too
        assert cal.provenance["per_gpu"][gpu]["in_sample_median_abs_pct_error_own"] < 1.0
        assert eff.matmul == pytest.approx(TRUTH.matmul, rel=0.07)
    assert calibrate([p.check for p in synthetic_points], ["synthetic"], min_per_gpu_points=10**6).per_gpu == {}
    prov = cal.provenance
    assert prov["points"] == len(synthetic_points)
    assert prov["sources"] == ["synthetic"]
    assert set(prov["gpus"]) == {"a100-80gb", "a40"}
    assert prov["in_sample_median_abs_pct_error"] < 1.0
    for name in RECOVERED:
        assert getattr(cal.shared, name) == pytest.approx(getattr(TRUTH, name), rel=0.07), name


def test_cross_validation_predicts_held_out_groups(synthetic_points):
    small = [p for p in synthetic_points if p.check.scenario.model.name == "llama-3.2-1b"]
    cv = cross_validate(small, lambda p: p.check.metric)
    assert set(cv) == {"step_s", "forward_s", "optimizer_s"}
    for g, v in cv.items():
        assert v["n"] == sum(1 for p in small if p.check.metric == g)
        assert 0 <= v["median"] <= v["max"] and math.isfinite(v["max"])
    assert cross_validate(small, lambda p: "all") == {}  # nothing left to fit on


def test_per_gpu_cross_validation_leaves_each_case_out_of_both_fits(synthetic_points):
    small = [p for p in synthetic_points if p.check.scenario.model.name == "llama-3.2-1b"]
    cv = cross_validate_per_gpu(small, min_points=5)
    assert set(cv) == {p.check.scenario.cluster.gpu.key for p in small}
    (v,) = cv.values()
    assert v["n"] == len(small) and v["median"] < 5.0  # noiseless truth: held-out cases are predicted
    assert cross_validate_per_gpu(small, min_points=len(small) + 1) == {}


@pytest.fixture(scope="module")
def bundled_subset():
    cases = [c for c in load_cases() if c.id in ("iiswc-a40-mixtral-math-sparse", "iiswc-a40-blackmamba-cs-sparse",
                                                   "llamafactory-llama2-7b-lora-a100")]
    assert len(cases) == 3
    return all_checks(cases)


def test_calibrate_is_deterministic(bundled_subset):
    a = calibrate(bundled_subset, ["subset"]).to_dict()
    b = calibrate(bundled_subset, ["subset"]).to_dict()
    assert a == b
    assert a["provenance"]["points"] == sum(1 for c in bundled_subset if c.metric in
                                            ("samples_per_s", "tokens_per_s", "step_s", "forward_s", "backward_s",
                                             "optimizer_s"))


def test_calibration_fits_better_than_the_start(bundled_subset):
    pts = time_points(bundled_subset)
    eff, _ = fit(pts)
    before = sum(math.log(p.predict(Efficiency()) / p.check.measured) ** 2 for p in pts)
    after = sum(math.log(p.predict(eff) / p.check.measured) ** 2 for p in pts)
    assert after <= before


def test_time_point_predicts_what_check_predicts(bundled_subset):
    cal = Calibration(TRUTH, {}, {})
    for p in time_points(bundled_subset):
        assert p.predict(TRUTH) == pytest.approx(p.check.predict(cal), rel=1e-9)


def test_source_of_groups_the_same_runs_together():
    from ftscope.validate.calibrate import DEV_CASE_SOURCES, source_of
    scn = ftscope.load_scenario(d())
    tp = lambda case, group: TimePoint(Check(case, group, "step_s", 1.0, scn), 1, 1)  # noqa: E731
    assert source_of(tp("iiswc-a40-x", "iiswc")) == "iiswc"
    assert source_of(tp("torchtune-llama31-8b-lora-4090", "torchtune")) == DEV_CASE_SOURCES["torchtune"]
    assert source_of(tp("torchtune-2409-x", "torchtune-readme-and-tutorials")) == DEV_CASE_SOURCES["torchtune"]
    assert source_of(tp("db:gpu-timing.sqlite:run3", "profile-cuda")) == "profile stores (a100-80gb)"


def test_mfu_is_not_fitted_twice():
    from ftscope.validate.calibrate import FIT_METRICS
    scn = ftscope.load_scenario(d())
    pts = time_points([Check("a", "g", "mfu", 0.5, scn), Check("a", "g", "tokens_per_s_per_gpu", 1e4, scn)])
    assert [p.check.metric for p in pts] == ["tokens_per_s_per_gpu"] and "mfu" not in FIT_METRICS
