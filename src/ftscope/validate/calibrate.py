"""Fit the time model's efficiency parameters to measured times (scipy least squares on log ratios).

Shared parameters are fitted on every case at once, so a GPU nobody measured still gets the physics (its
datasheet peaks) times efficiencies learned elsewhere. Per-GPU refits are optional (`per_gpu=True`) and only
for GPUs with enough points. Cross-validation refits without one case, GPU or model and predicts it.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, replace
from typing import Callable, Sequence

from ..estimate import estimate
from ..estimate.efficiency import Calibration, Efficiency
from ..estimate.compute import micro_batch_ops
from ..estimate.time import step_time
from .compare import TIME_METRICS, Check, time_metric

# (name, lower, upper): bounds keep every parameter physical
FIT_PARAMS: tuple[tuple[str, float, float], ...] = (
    ("gemm_ampere", 0.3, 0.98),
    ("gemm_ada", 0.3, 0.98),
    ("gemm_hopper", 0.3, 0.98),
    ("fp8_gemm", 0.3, 1.0),
    ("attention", 0.1, 0.95),
    ("attention_hopper", 0.1, 0.95),
    ("bandwidth", 0.3, 0.95),
    ("dequant_bandwidth", 0.1, 0.95),
    ("kernel_floor_us", 1.0, 50.0),
    ("host_us_per_kernel", 2.0, 200.0),
    ("sync_us", 5.0, 5000.0),
    ("step_overhead_s", 0.001, 2.0),
    ("communication", 0.1, 1.0),
    ("comm_overlap", 0.05, 1.0),
)


@dataclass(frozen=True)
class TimePoint:
    """A measured time metric with the pieces needed to recompute it fast for any Efficiency: the micro-batch
    ops do not depend on the efficiencies, so they are computed once."""

    check: Check
    batch: int
    trainable: int
    ops: tuple = ()

    def predict(self, eff: Efficiency) -> float:
        t = step_time(self.check.scenario, self.batch, eff, self.trainable, self.ops or None)
        return time_metric(t, self.check.metric, self.check.scenario)


FIT_METRICS = tuple(m for m in TIME_METRICS if m != "mfu")
"""Metrics the fit uses: a published MFU is the same measurement as its throughput, counted once."""


def time_points(checks: Sequence[Check]) -> list[TimePoint]:
    out = []
    for c in checks:
        if c.metric not in FIT_METRICS:
            continue
        est = estimate(c.scenario, strict=False, with_time=False)
        seq = c.scenario.workload.mean_padded_len(est.micro_batch_size)
        ops = tuple(micro_batch_ops(c.scenario, est.micro_batch_size, seq))
        out.append(TimePoint(c, est.micro_batch_size, est.model_memory.trainable_params, ops))
    return out


def _to_x(eff: Efficiency, names: Sequence[str]) -> list[float]:
    return [math.log(getattr(eff, n)) for n in names]


def _from_x(x: Sequence[float], base: Efficiency, names: Sequence[str]) -> Efficiency:
    return replace(base, **{n: math.exp(v) for n, v in zip(names, x)})


PRIOR_WEIGHT = 0.2
"""Per-GPU refits: a parameter's log distance from the shared value costs this much per unit, like a point's
log error. It keeps what one GPU's points cannot see (attention without long contexts, grouped GEMMs without
MoE runs) at the shared value instead of letting it drift to a bound."""


SHARED_PRIOR_WEIGHT = 0.05
"""Shared fit: a parameter's log distance from its documented default (Efficiency()) costs this much, a weak
prior: a parameter no training point constrains (a held-out source's only kind of run) stays near its physical
default instead of drifting to a bound."""
LOSS_SCALE = 0.15
"""Robust loss scale on log errors: points off by more than ~15 % weigh less than quadratically."""
LOSS = "cauchy"
"""Robust loss: Cauchy's pull on a parameter fades as a point's error grows past LOSS_SCALE, so a few runs the model
cannot describe (Answer.AI's RTX 6000 Ada rows, which run 2.4x slower than predicted; a dropless-routing
NeMo row at +143 %) do not drag every parameter. Soft L1, used before, still pulled with a constant force: with the
IISWC series held out those two Ada rows set the 4-bit dequantization bandwidth for everyone."""


def _weights(points: Sequence[TimePoint]) -> list[float]:
    """1 / sqrt(points of its source) per point, normalized to mean 1: a 200-point table counts more than a
    3-point one, but not 70 times more."""
    counts: dict[str, int] = {}
    for p in points:
        counts[source_of(p)] = counts.get(source_of(p), 0) + 1
    raw = [1.0 / math.sqrt(counts[source_of(p)]) for p in points]
    mean = sum(raw) / len(raw) if raw else 1.0
    return [w / mean for w in raw]


def fit(points: Sequence[TimePoint], base: Efficiency = Efficiency(),
        params: Sequence[tuple[str, float, float]] = FIT_PARAMS, prior: Efficiency | None = None,
        default_weight: float = SHARED_PRIOR_WEIGHT) -> tuple[Efficiency, float]:
    """Robust least-squares fit of the parameters on log(predicted / measured), each source weighted, pulled
    towards `prior` (per-GPU refits) or weakly towards the defaults; returns (efficiency, rms log error)."""
    import numpy as np
    from scipy.optimize import least_squares

    names = [p[0] for p in params]
    lo = np.log([p[1] for p in params])
    hi = np.log([p[2] for p in params])
    x0 = np.clip(np.array(_to_x(base, names)), lo + 1e-9, hi - 1e-9)
    anchor, weight = (prior, PRIOR_WEIGHT) if prior is not None else (Efficiency(), default_weight)
    x_prior = np.clip(np.array(_to_x(anchor, names)), lo + 1e-9, hi - 1e-9)
    w = np.array(_weights(points))

    def residuals(x):
        eff = _from_x(x, base, names)
        r = w * np.array([math.log(max(p.predict(eff), 1e-12) / p.check.measured) for p in points])
        return np.concatenate([r, weight * (x - x_prior)])

    res = least_squares(residuals, x0, bounds=(lo, hi), method="trf", x_scale="jac", max_nfev=400,
                        loss=LOSS, f_scale=LOSS_SCALE)
    eff = _from_x(res.x, base, names)
    point_res = res.fun[:len(points)] / w if len(points) else res.fun[:0]
    rms = float(np.sqrt(np.mean(point_res ** 2))) if len(point_res) else 0.0
    return eff, rms


def abs_pct_errors(points: Sequence[TimePoint], eff: Efficiency) -> list[float]:
    return [abs(p.predict(eff) / p.check.measured - 1) * 100 for p in points]


MIN_PER_GPU_POINTS = 12
"""A GPU gets its own refit only with at least this many time points (8 parameters are fitted)."""


def _gpu(p: TimePoint) -> str:
    return p.check.scenario.cluster.gpu.key


def per_gpu_fits(points: Sequence[TimePoint], shared: Efficiency,
                 min_points: int = MIN_PER_GPU_POINTS) -> dict[str, Efficiency]:
    """Refit every parameter on one GPU's own points, starting from and pulled towards the shared fit, for GPUs
    with enough points."""
    out = {}
    for gpu in sorted({_gpu(p) for p in points}):
        own = [p for p in points if _gpu(p) == gpu]
        if len(own) >= min_points:
            out[gpu] = fit(own, base=shared, prior=shared)[0]
    return out


def calibrate(checks: Sequence[Check], sources: Sequence[str], min_per_gpu_points: int = MIN_PER_GPU_POINTS,
              default_weight: float = SHARED_PRIOR_WEIGHT) -> Calibration:
    """The shared fit over every time measurement, per-GPU refits where a GPU has enough points, with provenance."""
    pts = time_points(checks)
    eff, rms = fit(pts, default_weight=default_weight)
    per_gpu = {k: _rounded(v) for k, v in per_gpu_fits(pts, eff, min_per_gpu_points).items()}
    errs = abs_pct_errors(pts, eff)
    prov = {
        "method": f"scipy least_squares ({LOSS} loss, scale {LOSS_SCALE}) on log(predicted/measured), points weighted 1/sqrt(points "
                  "of their source), weakly pulled to the documented defaults; shared across GPUs; per-GPU refits "
                  f"from the shared values for GPUs with >= {min_per_gpu_points} points",
        "sources": list(sources),
        "points": len(pts),
        "gpus": sorted({_gpu(p) for p in pts}),
        "fitted_parameters": [p[0] for p in FIT_PARAMS],
        "in_sample_median_abs_pct_error": round(statistics.median(errs), 2) if errs else None,
        "rms_log_error": round(rms, 4),
    }
    for gpu, g_eff in per_gpu.items():
        own = [p for p in pts if _gpu(p) == gpu]
        prov.setdefault("per_gpu", {})[gpu] = {
            "points": len(own),
            "in_sample_median_abs_pct_error_shared": round(statistics.median(abs_pct_errors(own, eff)), 2),
            "in_sample_median_abs_pct_error_own": round(statistics.median(abs_pct_errors(own, g_eff)), 2),
        }
    return Calibration(shared=_rounded(eff), per_gpu=per_gpu, provenance=prov)


def _rounded(eff: Efficiency) -> Efficiency:
    return replace(eff, **{k: float(f"{v:.4g}") for k, v in asdict(eff).items()})


DEV_CASE_SOURCES = {"llamafactory": "llamafactory-wiki-performance-comparison",
                    "torchtune": "torchtune-readme-and-tutorials", "peft": "peft-docs-and-readme-memory"}
"""Bundled-case groups that measured the same runs as a corpus source: held out together with it, so a source's
numbers never sit on both sides of a split."""


def source_of(p: TimePoint) -> str:
    """The public source (or measurement campaign) a time point comes from: the unit leave-one-source-out holds out.
    Bundled cases by their source (the IISWC series is one), profile stores by GPU, corpus points by source id."""
    c = p.check
    if c.case_id.startswith("db:"):
        return f"profile stores ({c.scenario.cluster.gpu.key})"
    return DEV_CASE_SOURCES.get(c.group, c.group)


def cross_validate(points: Sequence[TimePoint], key: Callable[[TimePoint], str]) -> dict[str, dict[str, float]]:
    """Leave-one-group-out: fit without a group, predict it. Returns per group the median/max abs % error."""
    groups: dict[str, list[TimePoint]] = {}
    for p in points:
        groups.setdefault(key(p), []).append(p)
    out = {}
    for g, held in sorted(groups.items()):
        train = [p for p in points if key(p) != g]
        if not train:
            continue
        eff, _ = fit(train)
        errs = abs_pct_errors(held, eff)
        out[g] = {"n": len(held), "median": statistics.median(errs), "max": max(errs)}
    return out


def cross_validate_per_gpu(points: Sequence[TimePoint], min_points: int = MIN_PER_GPU_POINTS) -> dict[str, dict[str, float]]:
    """For each GPU with its own refit: leave one of its cases out of both fits (shared and own), predict it.
    Says what measuring a GPU buys: compare with the same GPU under leave-one-GPU-out."""
    out = {}
    for gpu in sorted({_gpu(p) for p in points}):
        own = [p for p in points if _gpu(p) == gpu]
        if len(own) < min_points:
            continue
        errs = []
        for case in sorted({p.check.case_id for p in own}):
            shared, _ = fit([p for p in points if p.check.case_id != case])
            train = [p for p in own if p.check.case_id != case]
            eff = fit(train, base=shared, prior=shared)[0] if len(train) >= min_points else shared
            errs += abs_pct_errors([p for p in own if p.check.case_id == case], eff)
        out[gpu] = {"n": len(errs), "median": statistics.median(errs), "max": max(errs)}
    return out


def cross_validations(points: Sequence[TimePoint], kind: str) -> dict[str, dict[str, dict[str, float]]]:
    """Leave-one-out errors by `kind`: source | case | gpu | model | all (all of them plus the per-GPU refits)."""
    keys: dict[str, Callable[[TimePoint], str]] = {
        "source": source_of,
        "case": lambda p: p.check.case_id,
        "gpu": lambda p: p.check.scenario.cluster.gpu.key,
        "model": lambda p: p.check.scenario.model.name,
    }
    out = {f"leave_one_{k}_out": cross_validate(points, f) for k, f in keys.items() if kind in (k, "all")}
    if kind == "all":
        out["per_gpu_leave_one_case_out"] = cross_validate_per_gpu(points)
    return out
