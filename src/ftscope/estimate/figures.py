"""The figures a ranking reads of one estimate (fits, tight, hours, dollars), without building the estimate.

A plan ranks every candidate but shows a few: `rank_figures` runs the stages `estimate` runs (memory_stage,
step_parts, run_steps: the same functions, so the same numbers) and stops before the Estimate, TimeEstimate and
RunCost objects, the breakdown per layer, the MFU and the result checks, which plan/search.py builds only for the
rows that are read. A candidate that does not fit needs no time at all (it ranks last whatever it is).
"""
from __future__ import annotations

import math
from typing import NamedTuple

from ..spec.scenario import Scenario
from . import memory_stage
from .cost import price_of, run_steps
from .efficiency import Calibration
from .shared import Shared
from .time import step_parts


class Figures(NamedTuple):
    """What Estimate would say of one candidate, as far as a ranking reads it."""

    fits: bool
    """Estimate.fits."""
    tight: bool
    """Estimate.status == "tight" (given fits)."""
    hours: float | None
    """run.hours when it fits (None otherwise: the estimate's time is not needed to rank it)."""
    usd: float | None
    """run.usd when it fits and its GPU has a price."""
    does_not_fit: bool
    """The estimate's reason starts with "does not fit" (estimate_with_margin then retries without the margin)."""


def figures(scn: Scenario, margin: float, cal: Calibration, tight_margin: float,
            shared: Shared | None) -> Figures | None:
    """The ranking figures of estimate(scn, margin, strict=False, calibration=cal, tight_margin, shared); None when
    one of them is not a finite, non-negative number (the caller builds the estimate, whose checks say which)."""
    sh, reason, mem, seq, max_b, batch, bd = memory_stage(scn, margin, False, tight_margin, shared)
    peak, cap = bd.fit_bytes, mem.capacity_bytes  # what must fit (MemoryBreakdown.fit_bytes), as Estimate.fits
    if not _memory_sane(bd, sh, scn.cluster.world_size, batch):
        return None
    dnf = reason is None and peak > cap * (1 - margin)
    if not (reason is None and peak <= cap * (1 - margin)):  # Estimate.fits
        return Figures(False, False, None, None, dnf or (reason is not None and reason.startswith("does not fit")))
    eff, _ = cal.for_gpu(scn.cluster.gpu.key)
    parts = step_parts(scn, batch, eff, mem.trainable_params, shared=sh)[0]
    step = sum(parts.values())
    if not (math.isfinite(step) and step > 0 and min(parts.values()) >= 0):
        return None
    hours = run_steps(scn, batch) * step / 3600.0
    price = sh.per_gpu("price", scn, lambda: price_of(scn)) if sh is not None else price_of(scn)
    usd = None if price[0] is None else hours * scn.cluster.world_size * price[0]
    if not (math.isfinite(hours) and hours >= 0) or (usd is not None and not (math.isfinite(usd) and usd >= 0)):
        return None
    return Figures(True, peak > cap * (1.0 - tight_margin), hours, usd, False)


def rank_figures(scn: Scenario, margin: float, cal: Calibration, shared: Shared | None) -> Figures | None:
    """figures of plan/search.py's estimate_with_margin(scn, margin, cal, shared): the largest batch that leaves
    the margin free, else the scenario as it is (tight when it eats into the margin)."""
    if margin and scn.workload.solve_batch:
        f = figures(scn, margin, cal, margin, shared)
        if f is None or f.fits or not f.does_not_fit:
            return f
    return figures(scn, 0.0, cal, margin, shared)


def _memory_sane(bd, sh: Shared | None, world: int, batch: int) -> bool:
    """The breakdown's figures are finite and not negative (estimate's result check, once per breakdown)."""
    def check() -> bool:
        values = [bd.peak_bytes, bd.allocated_bytes, *bd.categories.values()]
        return min(values) >= 0 and math.isfinite(sum(values))
    return sh.get(("sane", world, batch), check) if sh is not None else check()
