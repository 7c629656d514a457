"""When a training run's measurement and ftscope's estimate disagree by more than ftscope says it can be off.

The limits are the largest errors of the estimator on measured runs it was checked against, per metric, from the
README's table "Measured on an H200" (`ftscope validate --db data/measurements/gpu-*.sqlite`, 2026-12-01):

    tensor memory (max_memory_allocated)   84 points   median 0.9 %   max 14.9 %
    reserved memory (max_memory_reserved)  84 points   median 5.5 %   max 32.6 %
    forward + backward + optimizer time    18 points   median 8.1 %   max 23.9 %

The callbacks warn past the max, not the median: half of all runs are off by more than a median, which is no news;
a run off by more than anything validation has seen is. The medians are here to be quoted beside it. A CPU run is
compared for tensor memory only (its step time says nothing about a GPU), as `validate --db` does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..estimate.result import Estimate
from ..spec.scenario import Scenario
from ..validate.compare import memory_gib, time_metric

PUBLISHED_ERROR: dict[str, tuple[float, float]] = {
    "peak_gib:allocated": (0.009, 0.149),
    "peak_gib:reserved": (0.055, 0.326),
    "fwd_bwd_opt_s": (0.081, 0.239),
}
"""metric -> (median, max) absolute relative error of the estimate on the H200 store (see the module docstring)."""

LABELS = {"peak_gib:allocated": "peak tensor memory", "peak_gib:reserved": "peak reserved memory",
          "fwd_bwd_opt_s": "step time"}
UNITS = {"peak_gib:allocated": "GiB", "peak_gib:reserved": "GiB", "fwd_bwd_opt_s": "s"}


@dataclass(frozen=True)
class Deviation:
    """One metric of one step, measured against the estimate."""

    metric: str
    """A validate metric: peak_gib:allocated | peak_gib:reserved | fwd_bwd_opt_s."""
    measured: float
    predicted: float
    limit: float
    """The published max abs relative error of the metric."""

    @property
    def error(self) -> float:
        """predicted / measured - 1, as validate reports it."""
        return self.predicted / self.measured - 1 if self.measured else float("inf")

    @property
    def exceeds(self) -> bool:
        return abs(self.error) > self.limit

    def text(self) -> str:
        unit, scale, digits = UNITS[self.metric], 1.0, 3
        if unit == "GiB":  # a small model's memory in MiB, so the numbers say something
            unit, scale, digits = ("GiB", 1.0, 2) if self.measured >= 1 else ("MiB", 1024.0, 1)
        return (f"{LABELS[self.metric]} {self.measured * scale:.{digits}f} {unit} measured, "
                f"{self.predicted * scale:.{digits}f} estimated ({self.error * 100:+.1f} %, published max "
                f"{self.limit * 100:.1f} %)")


def measured_metrics(measurement: Mapping[str, Any], on_cuda: bool) -> dict[str, float]:
    """The metrics a stored step compares, as validate --db reads them: allocated (and on CUDA reserved) peak
    GiB; on CUDA the step time when its micro-batches had one padded length."""
    mem = measurement.get("memory") or {}
    out: dict[str, float] = {}
    if mem.get("peak_allocated_bytes"):
        out["peak_gib:allocated"] = mem["peak_allocated_bytes"] / 2**30
    if on_cuda and mem.get("peak_reserved_bytes"):
        out["peak_gib:reserved"] = mem["peak_reserved_bytes"] / 2**30
    if on_cuda and measurement.get("step_s") and measurement.get("uniform_shape", True):
        out["fwd_bwd_opt_s"] = float(measurement["step_s"])
    return out


def deviations(measured: Mapping[str, float], est: Estimate, scn: Scenario) -> list[Deviation]:
    """Each measured metric against the estimate's value for it."""
    out = []
    for metric, value in measured.items():
        if metric.startswith("peak_gib"):
            predicted = memory_gib(est, metric.split(":")[1])
        elif est.time is not None:
            predicted = time_metric(est.time, metric, scn)
        else:
            continue
        out.append(Deviation(metric, value, predicted, PUBLISHED_ERROR[metric][1]))
    return out


def warning_text(step: int, found: list[Deviation], store: str | None) -> str:
    """The one warning a run gets: what differed at which step, and where the run is kept."""
    parts = "; ".join(d.text() for d in found if d.exceeds)
    where = f" Every step is in {store}: `ftscope validate --db {store}` compares them all." if store else ""
    return (f"ftscope: at step {step} the run differs from ftscope's estimate by more than its published error: "
            f"{parts}.{where} (Warned once per run.)")


__all__ = ["PUBLISHED_ERROR", "Deviation", "measured_metrics", "deviations", "warning_text"]
