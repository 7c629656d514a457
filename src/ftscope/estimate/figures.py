"""The figures a ranking reads of one estimate (fits, tight, hours, dollars), without building the estimate.

A plan ranks every candidate but shows a few: `rank_figures` runs the stages `estimate` runs (memory_stage,
step_parts, run_steps: the same functions, so the same numbers) and stops before the Estimate, TimeEstimate and
RunCost objects, the breakdown per layer, the MFU and the result checks, which plan/search.py builds only for the
rows that are read. A candidate that does not fit needs no time at all (it ranks last whatever it is).
"""
from __future__ import annotations

import math
from functools import partial
from typing import Callable, NamedTuple, Sequence

from ..spec.scenario import Scenario, fast_replace
from . import memory_stage, unsupported_reason
from .comm_buffers import nccl_mix_key
from .cost import price_of, run_steps
from .efficiency import Calibration
from .memory import MemoryModel, capacity_free_model, device_capacity
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
    if sh is None:
        return _breakdown_sane(bd)
    sane = sh.get(("sane", world), dict)  # by micro-batch (_grid's memo too)
    hit = sane.get(batch)
    if hit is None:
        hit = sane[batch] = _breakdown_sane(bd)
    return hit


def _breakdown_sane(bd) -> bool:
    return _values_sane([bd.peak_bytes, bd.allocated_bytes, *bd.categories.values()])


def _breakdown_values(mem: MemoryModel, batch: int, seq: float, cap: float | None = None) -> list[float]:
    """[peak_bytes, allocated_bytes, *categories.values()] of mem.breakdown(batch, seq), without building it, on a
    device of `cap` usable bytes (mem's capacity when None). MemoryModel._peak_of's peak, whose cut to the capacity
    (where what must fit does) is looked at only when the peak exceeds it: a plan checks every new micro-batch."""
    phases = mem._points(batch, seq)
    totals = mem._reserved_of(phases)
    i = max(range(len(phases)), key=totals.__getitem__)
    least = mem.least_reserved
    peak = max(totals[i], least)
    cap = mem.capacity_bytes if cap is None else cap
    if peak > cap and cap >= max(least, *mem._reserved_of(phases, held=True)):
        peak = cap
    _, grads, act, temp, allocated = phases[i]
    overhead = peak - allocated  # peak_bytes is allocated + overhead, which need not round back to peak
    return [allocated + overhead, allocated, mem.weights, grads, mem.optimizer, act, temp, overhead]


def _values_sane(values: list[float]) -> bool:
    return min(values) >= 0 and math.isfinite(sum(values))


def rank_grid(cands: list[Scenario], margin: float, cal: Calibration, shared: Shared | None) -> list[Figures | None]:
    """rank_figures of each candidate, for a sweep's candidates that differ only in their cluster (a plan's GPU
    types x counts): see grid_figures. Candidates that `shared` does not cover take rank_figures."""
    sh = shared_for(shared, cands[0]) if cands else None
    if sh is None:
        return [rank_figures(c, margin, cal, shared) for c in cands]
    sites = [(c.cluster.gpu, c.cluster.gpus_per_node, c.cluster.nodes, c.cluster.inter_node_gbs) for c in cands]
    return grid_figures(sh, sites, margin, cal, cands.__getitem__)


def grid_figures(sh: Shared, sites: Sequence[tuple], margin: float, cal: Calibration,
                 scenario_of: Callable[[int], Scenario]) -> list[Figures | None]:
    """rank_figures of `sh`'s scenario on each site (GPU type, GPUs per node, nodes, network GB/s per GPU), whose
    scenario is scenario_of(index), made only where a value is not yet known: per GPU count, one memory model,
    its peak bytes once per micro-batch and the largest micro-batch once per capacity (figures builds the
    breakdown of every candidate to read its fit_bytes, which is MemoryModel.peak_bytes: the same sums); the
    fitting candidates' hours and dollars computed together as arrays (grid_time.py)."""
    if not (margin and sh.scenario.workload.solve_batch):  # rank_figures: the scenario as it is
        return _grid(sh, sites, range(len(sites)), 0.0, margin, cal, scenario_of)
    out = _grid(sh, sites, range(len(sites)), margin, margin, cal, scenario_of)
    again = [i for i, f in enumerate(out) if f is not None and not f.fits and f.does_not_fit]  # none leaves it free
    for i, f in zip(again, _grid(sh, sites, again, 0.0, margin, cal, scenario_of)):
        out[i] = f
    return out


_figures = partial(tuple.__new__, Figures)
"""Figures from a tuple of its fields without NamedTuple's generated __new__ (a plan makes one per candidate)."""


_MISFITS = {dnf: Figures(False, False, None, None, dnf) for dnf in (False, True)}
"""A misfit's figures by does_not_fit: the two there are, shared rather than made per site."""


def _grid_memos(sh: Shared, cal: Calibration) -> tuple:
    """_grid's memos: per GPU type ((GPU, unsupported reason, efficiency, grid_time row) by GPU id), micro_row's;
    the sweep's _comm_fields."""
    return (sh.get(("grid_gpu", id(cal)), dict, cal), sh.get(("grid_micro", id(cal)), dict, cal),
            _comm_fields(sh.scenario))


_LAZY: list = []
"""grid_time's SMALLEST, hours_of and takes and micro_seconds' micro_row, imported by the first plan (numpy), not at
start-up."""


def _lazy() -> list:
    if not _LAZY:
        from .grid_time import SMALLEST, hours_of, takes
        from .micro_seconds import micro_row
        _LAZY[:] = (SMALLEST, hours_of, takes, micro_row)
    return _LAZY


def _grid(sh: Shared, sites: Sequence[tuple], which: Sequence[int], margin: float, tight_margin: float,
          cal: Calibration, scenario_of: Callable[[int], Scenario]) -> list[Figures | None]:
    """figures(scenario_of(i), margin, cal, tight_margin, sh) of each site i in `which`, in that order. No site's
    figures are kept: a repeated plan reads its whole ranking back (plan/search.py), and a site of another plan is
    remade from the sweep's memos (its solver, capacity, largest micro-batch, sanity and micro-batch seconds).
    Per GPU count one memory model solved once per capacity, its peak bytes once per micro-batch (figures builds
    the breakdown of every candidate to read its fit_bytes, which is MemoryModel.peak_bytes: the same sums); what a
    count's sites share is looked up once per count (_count), the rest per site, inline (a plan has thousands)."""
    per_gpu, micro, comm = sh.get(("grid_memos", id(cal)), lambda: _grid_memos(sh, cal), cal)
    lazy = _lazy()
    timing, micro_row = lazy[2](sh.scenario), lazy[3]  # timing: grid_time takes the mix
    wl = sh.scenario.workload
    fixed = None if wl.solve_batch else int(wl.micro_batch_size)
    keep = 1.0 - margin
    counts: dict[tuple, tuple] = {}  # _count's by (GPUs, GPUs per node)
    w = g = None  # the last site's GPUs and GPUs per node
    out: list[Figures | None] = []
    fitting: list[tuple] = []  # the fitting sites: (place in out, site index, reason, peak, cap, batch, trainable)
    table, rows, cols = [], {}, []  # grid_time's rows of the GPU types met (their places by GPU id), site columns
    for i in which:
        gpu, gpn, nodes, inter = sites[i]
        world = gpn * nodes
        if world != w or gpn != g:  # (sites are GPU-major: a node layout's plan has one count)
            w, g = world, gpn
            here = counts.get((world, gpn))
            if here is None:
                here = counts[world, gpn] = _count(sh, world, gpn, i, wl, comm, scenario_of)
            at, solved, peaks, sane, caps, trainable = here
        info = per_gpu.get(id(gpu))
        if info is None or info[0] is not gpu:
            info = per_gpu[id(gpu)] = (gpu, *_gpu_info(sh, scenario_of(i), cal, timing))
        _, reason, eff, row = info
        # memory_model's capacity at this site: what it reads is the GPU, its count and layout, and the sweep's few
        # comm_key fields, which the plans of a scenario's mixes share (no candidate scenario made to read it)
        cap = caps.get(id(gpu))
        if cap is None or cap[0] is not gpu:
            cap = _capacity(caps, gpu, scenario_of(i), at.mem.allocator)
        cap = cap[1]
        if not cap > 0:  # the estimate says why
            out.append(None)
            continue
        limit = cap * keep
        if fixed is not None:
            batch = fixed
        else:  # at.largest(limit), its memo read here first
            batch = solved.get(limit)
            if batch is None:
                batch = at.largest(limit)
            batch = batch or 1
        peak = peaks.get(batch)  # at.peak(batch), its memo read here first
        if peak is None:
            peak = at.peak(batch)
        # _memory_sane of this GPU's breakdown (by count and batch, as there; a pure function of model, capacity, batch)
        ok = sane.get(batch)
        if ok is None:
            ok = sane[batch] = _sane_on(at, cap, batch)
        if not ok:
            out.append(None)
            continue
        if not (reason is None and peak <= limit):  # _ranked's misfit
            out.append(_MISFITS[(reason is None and peak > limit)
                                or (reason is not None and reason.startswith("does not fit"))])
            continue
        fitting.append((len(out), i, reason, peak, cap, batch, trainable))
        out.append(None)
        if not timing:
            continue
        times = micro.get((id(gpu), id(eff), batch))  # micro_row's memo, read here first
        if times is None:
            times = micro_row(sh, cal, eff, batch, gpu, partial(scenario_of, i))
        if times:  # grid_time takes the mix
            r = rows.get(id(gpu))
            if r is None:
                r = rows[id(gpu)] = len(table)
                table.append(row)
            cols.append((r, world, gpn, nodes, inter, batch, trainable) + times)
    if fitting:
        _timed(sh, out, fitting, table, cols, margin, tight_margin, cal, scenario_of)
    return out


def _timed(sh: Shared, out: list, fitting: list[tuple], table: list[tuple], cols: list[tuple], margin: float,
           tight_margin: float, cal: Calibration, scenario_of: Callable[[int], Scenario]) -> None:
    """_grid's figures of its fitting sites (their places in `out` hold None), timed together by grid_time where
    it takes them all (`table`, `cols`: its GPU rows and site columns), else one by one (_ranked)."""
    lazy = _lazy()
    runs = lazy[1](sh.scenario, table, cols) if len(cols) == len(fitting) >= lazy[0] else [None] * len(fitting)
    for (k, i, reason, peak, cap, batch, trainable), run in zip(fitting, runs):
        if run is None:  # grid_time leaves it to the scalar path (it fits: _grid checked what _ranked checks first)
            out[k] = _ranked(scenario_of(i), sh, reason, peak, cap, margin, tight_margin, batch, trainable, cal)
        else:
            out[k] = _figures((True, peak > cap * (1.0 - tight_margin), run[0], run[1], False))


def _count(sh: Shared, world: int, gpn: int, i: int, wl, comm: tuple,
           scenario_of: Callable[[int], Scenario]) -> tuple:
    """What _grid's sites on `world` GPUs, `gpn` per node, share (scenario_of(i) is one of them): (their BatchSolver,
    its largest-batch and peak memos, the sanity memo of the count, the capacity memo of the layout by GPU id,
    trainable parameters)."""
    at = sh.get(("grid", world), lambda: _solver(sh, capacity_free_model(scenario_of(i)), wl.peak_seq_len()))
    allocator = at.mem.allocator
    key = (world, gpn, id(allocator), comm)
    hit = _CAPACITIES.get(key)
    if hit is None or hit[0] is not allocator:
        if len(_CAPACITIES) >= 16_384:
            _CAPACITIES.clear()
        hit = _CAPACITIES[key] = (allocator, {})
    return at, at.solved, at.peaks, sh.get(("sane", world), dict), hit[1], at.mem.trainable_params


def _capacity(caps: dict, gpu, scn: Scenario, allocator) -> tuple:
    """caps[id(gpu)] made: (gpu, device_capacity(scn, allocator)) (`caps`: _count's capacity memo)."""
    if len(caps) >= 4096:
        caps.clear()
    hit = caps[id(gpu)] = (gpu, device_capacity(scn, allocator))
    return hit


_CAPACITIES: dict[tuple, tuple] = {}
"""device_capacity by (GPUs in all, GPUs per node, allocator id, _comm_fields): (allocator, {GPU id: (GPU, bytes)}),
the allocator and GPUs kept alive with their ids."""


def _comm_fields(scn: Scenario) -> tuple:
    """What comm_buffers.comm_key reads of a scenario but its cluster (the mix's NCCL_MIX_FIELDS, the NCCL version):
    with the GPU and its counts, all device_capacity reads."""
    return (*nccl_mix_key(scn.mix), scn.recipe.nccl_version)


def _solver(sh: Shared, mem: MemoryModel, seq: int) -> BatchSolver:
    """The BatchSolver of the sweep's memory models equal to `mem` but for the capacity (it solves for each): DDP's
    and ZeRO-0's models are the same at every GPU count above one, so a plan over more nodes solves nothing anew."""
    return sh.get(("solver", fast_replace(mem, capacity_bytes=0.0), seq), lambda: BatchSolver(mem, seq))


def _sane_on(at: BatchSolver, cap: float, batch: int) -> bool:
    """_memory_sane's figures of at.mem.breakdown(batch, at.seq) on a device of `cap` usable bytes
    (_breakdown_values' list): only its capacity cut reads the capacity, so the rest is made once per batch."""
    hit = at.per_batch.get(batch)  # _uncut_at, made once per micro-batch
    if hit is None:
        hit = at.per_batch[batch] = _uncut_at(at, batch)
    peak, sane, allocated, grads, act, temp = hit
    if peak > cap and cap >= at.peak(batch):  # the cut where what must fit (peak_bytes) does
        mem = at.mem
        overhead = cap - allocated
        return _values_sane([allocated + overhead, allocated, mem.weights, grads, mem.optimizer, act, temp, overhead])
    return sane


def _uncut_at(at: BatchSolver, batch: int) -> tuple:
    """_uncut of the solver's model at this micro-batch (its one-stream sums from BatchSolver.top, without the
    phase points)."""
    hit = at.top(batch)
    if hit is None:
        return _uncut(at.mem, at.points(batch), at.least)
    return _uncut_of(at.mem, at.least, *hit)


def _uncut(mem: MemoryModel, phases: tuple, least: float) -> tuple:
    """(reserved peak, sanity of _breakdown_values' list, allocated, gradients, activations, temporary) of
    mem.breakdown(batch, seq) where the capacity does not cut its peak (`phases`: mem._points(batch, seq); `least`:
    mem.least_reserved)."""
    totals = mem._reserved_of(phases)
    top = max(totals)
    i = totals.index(top)  # max(range(...), key=totals.__getitem__): the first of the largest (NaN: by identity)
    _, grads, act, temp, allocated = phases[i]
    return _uncut_of(mem, least, top, grads, act, temp, allocated)


def _uncut_of(mem: MemoryModel, least: float, top: float, grads: float, act: float, temp: float,
              allocated: float) -> tuple:
    """_uncut's tuple from the top point's reserved bytes and its terms."""
    peak = max(top, least)
    overhead = peak - allocated
    return (peak, _values_sane([allocated + overhead, allocated, mem.weights, grads, mem.optimizer, act, temp,
                                overhead]), allocated, grads, act, temp)


def _gpu_info(sh: Shared, scn: Scenario, cal: Calibration, timing: bool) -> tuple:
    """(unsupported reason, efficiency, grid_time row) of the scenario's GPU type."""
    from .grid_time import gpu_row
    return (sh.per_gpu("reason", scn, lambda: unsupported_reason(scn)), cal.for_gpu(scn.cluster.gpu.key)[0],
            gpu_row(sh, scn, cal) if timing else None)
