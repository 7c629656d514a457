"""The figures a ranking reads of one estimate (fits, tight, hours, dollars), without building the estimate.

A plan ranks every candidate but shows a few: `rank_figures` runs the stages `estimate` runs (memory_stage,
step_parts, run_steps: the same functions, so the same numbers) and stops before the Estimate, TimeEstimate and
RunCost objects, the breakdown per layer, the MFU and the result checks, which plan/search.py builds only for the
rows that are read. A candidate that does not fit needs no time at all (it ranks last whatever it is).
"""
from __future__ import annotations

import math
from typing import NamedTuple

from ..spec.scenario import Scenario, fast_replace
from . import memory_stage, unsupported_reason
from .cost import price_of, run_steps
from .efficiency import Calibration
from .memory import MemoryModel, memory_model, usable_bytes
from .shared import Shared, shared_for
from .solvers import BatchSolver
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
    if not _memory_sane(bd, sh, scn.cluster.world_size, batch):
        return None
    # what must fit (MemoryBreakdown.fit_bytes), as Estimate.fits
    return _ranked(scn, sh, reason, bd.fit_bytes, mem.capacity_bytes, margin, tight_margin, batch,
                   mem.trainable_params, cal)


def _ranked(scn: Scenario, sh: Shared | None, reason: str | None, peak: float, cap: float, margin: float,
            tight_margin: float, batch: int, trainable: int, cal: Calibration) -> Figures | None:
    """figures once the memory is known: `peak` bytes must fit in `cap` at micro-batch `batch`."""
    dnf = reason is None and peak > cap * (1 - margin)
    if not (reason is None and peak <= cap * (1 - margin)):  # Estimate.fits
        return Figures(False, False, None, None, dnf or (reason is not None and reason.startswith("does not fit")))
    eff, _ = cal.for_gpu(scn.cluster.gpu.key)
    parts = step_parts(scn, batch, eff, trainable, shared=sh)[0]
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
    return sh.get(("sane", world, batch), lambda: _breakdown_sane(bd)) if sh is not None else _breakdown_sane(bd)


def _breakdown_sane(bd) -> bool:
    values = [bd.peak_bytes, bd.allocated_bytes, *bd.categories.values()]
    return min(values) >= 0 and math.isfinite(sum(values))


def rank_grid(cands: list[Scenario], margin: float, cal: Calibration, shared: Shared | None) -> list[Figures | None]:
    """rank_figures of each candidate, for a sweep's candidates that differ only in their cluster (a plan's GPU
    types x counts): per GPU count, one memory model, its peak bytes once per micro-batch and the largest
    micro-batch once per capacity (figures builds the breakdown of every candidate to read its fit_bytes, which
    is MemoryModel.peak_bytes: the same sums). Candidates that `shared` does not cover take rank_figures."""
    sh = shared_for(shared, cands[0]) if cands else None
    if sh is None:
        return [rank_figures(c, margin, cal, shared) for c in cands]
    if not (margin and cands[0].workload.solve_batch):  # rank_figures: the scenario as it is
        return _grid(cands, 0.0, margin, cal, sh)
    out = _grid(cands, margin, margin, cal, sh)
    again = [i for i, f in enumerate(out) if f is not None and not f.fits and f.does_not_fit]  # none leaves it free
    for i, f in zip(again, _grid([cands[i] for i in again], 0.0, margin, cal, sh)):
        out[i] = f
    return out


def _grid(cands: list[Scenario], margin: float, tight_margin: float, cal: Calibration,
          sh: Shared) -> list[Figures | None]:
    """figures(c, margin, cal, tight_margin, sh) of each candidate (all covered by `sh`), in their order."""
    out: list[Figures | None] = []
    wl = cands[0].workload if cands else None
    counts: dict[int, BatchSolver] = {}  # the memo's, looked up once per count
    reasons: dict[int, str | None] = {}  # per GPU type (id), from the memo
    for scn in cands:
        cl = scn.cluster
        world = cl.world_size
        at = counts.get(world)
        if at is None:
            at = counts[world] = sh.get(("grid", world), lambda: BatchSolver(memory_model(scn), wl.peak_seq_len()))
        reason = reasons.get(id(cl.gpu), reasons)
        if reason is reasons:
            reason = reasons[id(cl.gpu)] = sh.per_gpu("reason", scn, lambda: unsupported_reason(scn))
        cap = usable_bytes(cl.gpu, at.mem.allocator)  # memory_model's capacity for this GPU
        if not cap > 0:  # the estimate says why
            out.append(None)
            continue
        max_b = at.largest(cap * (1.0 - margin))
        batch = (max_b or 1) if wl.solve_batch else int(wl.micro_batch_size)
        peak = at.peak(batch)
        # _memory_sane of this GPU's breakdown (by count and batch, as there)
        if not sh.get(("sane", world, batch),
                      lambda: _breakdown_sane(fast_replace(at.mem, capacity_bytes=cap).breakdown(batch, at.seq))):
            out.append(None)
            continue
        out.append(_ranked(scn, sh, reason, peak, cap, margin, tight_margin, batch, at.mem.trainable_params, cal))
    return out
