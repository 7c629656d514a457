"""Hours and dollars of many candidates at once, as numpy arrays (a dozen or so: one at a time in plain floats, the
same operations, where numpy's per-call cost is the larger): what estimate/figures.py's `_ranked` computes
one candidate at a time (time.py's step_parts and its sum, comm.py's data_parallel and exposed, cost.py's
run_steps), over a plan's candidates (one scenario on many GPU types, counts and nodes).

Exactness is the point: every array takes the scalar path's floating-point operations in the scalar path's order
(`a * b / c` as `(a * b) / c`, Python's `min(a, b)` as `where(b < a, b, a)`, builtin sum() as `builtin_sum`), so
each hour and dollar equals the scalar one bit for bit (tests/estimate/test_grid_time.py compares them with ==).
A candidate whose figures are not finite, non-negative numbers comes back as None (the scalar path says why), and
so does every candidate of a mix this module does not take: tensor, pipeline, context or expert parallelism, or
activation offload (their collectives and copies read the micro-batch's shape).
"""
from __future__ import annotations

import math
import sys
from typing import Sequence

import numpy as np

from ..spec.scenario import Scenario
from .comm import DDP_BUCKET_BYTES, _param_modules, gather_passes
from .cost import price_of
from .efficiency import Calibration
from .weight_memory import gathered_weight_bytes
from .shared import Shared
from .time import ADAM_BYTES_PER_PARAM, OPTIMIZER_KERNELS

COMPENSATED_SUM = sys.version_info >= (3, 12)
"""Python 3.12's sum() of floats adds with Neumaier's compensation (gh-100425); before, left to right."""


def builtin_sum(terms: Sequence[np.ndarray]) -> np.ndarray:
    """What sum() of one candidate's terms gives, for every candidate at once (each term an array or number)."""
    total = np.float64(0.0) + terms[0]  # sum() starts from int 0: 0 + x
    if not COMPENSATED_SUM:
        for x in terms[1:]:
            total = total + x
        return total
    comp = np.zeros_like(total)
    for x in terms[1:]:
        t = total + x
        comp = comp + np.where(np.abs(total) >= np.abs(x), (total - t) + x, (x - t) + total)
        total = t
    return np.where((comp != 0) & np.isfinite(comp), total + comp, total)


# numpy's reductions as the ufuncs' own (np.min, .any() and .all() add a Python wrapper each: ~1 us of a plan's 80)
_smallest, _any, _all = np.minimum.reduce, np.logical_or.reduce, np.logical_and.reduce


def _min(a, b):
    """Python's min(a, b): b only when b < a."""
    return np.where(b < a, b, a)


def _ring(bytes_, n, gbs, comm, factor: float = 1.0, live=None):
    """comm.ring_s over arrays (`comm`: the efficiency's communication fraction; `live`: every bytes_ > 0 and
    gbs > 0, where the caller knows it and n = 1 is discarded: ring_s's zeros need no mask then)."""
    t = factor * (n - 1) / n * bytes_ / (gbs * 1e9 * comm)
    return t if live else np.where((n <= 1) | (bytes_ <= 0) | (gbs <= 0), 0.0, t)


def takes(scn: Scenario) -> bool:
    """The mixes grid_hours computes (the others' collectives read the micro-batch's shape)."""
    mix = scn.mix
    return (mix.tensor_parallel == 1 and mix.pipeline_parallel == 1 and mix.context_parallel == 1
            and mix.expert_parallel == 1 and not mix.activation_offload)


_GPU_COLUMNS = ("communication", "latency", "overlap", "intra", "bandwidth", "kernels", "host_link", "cpu_adam",
                "hook_us", "other", "price")


def gpu_row(sh: Shared, scn: Scenario, cal: Calibration) -> tuple:
    """The values of the scenario's GPU type that hours_of reads, in _GPU_COLUMNS' order, as the scalar path
    computes them."""
    gpu = scn.cluster.gpu
    eff, _ = cal.for_gpu(gpu.key)
    price = sh.per_gpu("price", scn, lambda: price_of(scn))[0]
    row = (eff.communication, eff.collective_latency_us * 1e-6,
           eff.comm_overlap if gpu.peer_to_peer else eff.comm_overlap_host,  # exposed(host_staged=...)
           gpu.intra_node_gbs * (1.0 if gpu.peer_to_peer else 0.5),  # layout._link
           gpu.memory_bandwidth_gbs * 1e9 * eff.bandwidth,  # optimizer_s: bw * eff.bandwidth
           OPTIMIZER_KERNELS * max(eff.kernel_floor_us, eff.host_us_per_kernel) * 1e-6,
           gpu.host_link_gbs * 1e9 * eff.communication, eff.cpu_adam_params_per_s, eff.zero3_hook_us,
           eff.step_overhead_s + eff.microbatch_overhead_s * scn.workload.gradient_accumulation,
           np.nan if price is None else price)
    return tuple(map(float, row))  # as np.array(..., float64) reads them (the float path reads them as they are)


SMALLEST = 1
"""Fewer fitting candidates than this take the scalar path (the floats of a few candidates cost less than it)."""


def hours_of(base: Scenario, table: list[tuple], cols: list[tuple]) -> list[tuple[float, float | None] | None]:
    """(run hours, run dollars or None without a price) of each candidate, as figures' _ranked computes them, or
    None where a figure is not a finite, non-negative number. `table`: gpu_row of each GPU type; `cols`: per
    candidate, its GPU's row in `table`, world size, GPUs per node, nodes, network GB/s per GPU, micro-batch,
    trainable parameters and micro_row. `base`: a scenario of the sweep (takes(base))."""
    if not cols:
        return []
    if len(cols) <= FLOATS_UP_TO:
        return _floats(base, table, cols)
    parts, _, g, c = step_columns(base, table, cols)
    wl, world, batch = base.workload, c[1], c[5]
    terms = list(parts.values())
    step = builtin_sum(terms)  # sum(parts.values())
    ga = wl.gradient_accumulation
    steps = np.ceil(wl.samples_per_epoch() * wl.epochs / (batch * ga * world * wl.samples_per_sequence()))
    hours = steps * step / 3600.0
    usd = hours * world * g["price"]
    priced = g["price"] == g["price"]  # not NaN: a price
    # _ranked's checks (a NaN part makes the step NaN); a missing price leaves usd NaN, which is not checked
    sane = ((step > 0) & (_smallest(terms) >= 0) & np.isfinite(step + hours) & (hours >= 0)
            & ~(priced & ~(np.isfinite(usd) & (usd >= 0))))
    return [(h, u if p else None) if ok else None
            for ok, h, u, p in zip(sane.tolist(), hours.tolist(), usd.tolist(), priced.tolist())]


def step_columns(base: Scenario, table: list[tuple], cols: list[tuple]) -> tuple[dict, list[tuple], dict, np.ndarray]:
    """(step_parts' seconds per breakdown part, in its order; the collectives as (seconds, window, unhidden),
    meaningless on one GPU; the GPU columns; the candidates' columns) of hours_of's candidates, as arrays."""
    c = np.array(cols, dtype=np.float64).T
    g = dict(zip(_GPU_COLUMNS, np.array(table, dtype=np.float64)[c[0].astype(np.intp)].T))
    world, gpn, nodes, inter, batch, trainable, fwd, bwd, rec, deq, att = c[1:]
    mix, ga = base.mix, base.workload.gradient_accumulation
    runs = ga + 0.0  # ga + layout.bubble (0.0 without pipeline stages)
    # layout: dp = world; dp_gbs = _link(scn, world): the network once the ranks span nodes
    gbs = g["intra"]
    if _any(nodes > 1):
        network = inter * gpn
        spans = (world > gpn) & (nodes > 1)
        gbs = np.where(spans, np.where(gpn > 1, _min(gbs, network), network), gbs)
    # ring_s's zeros (one GPU, nothing to move, no link) need a mask only where one occurs
    live = bool(_all(trainable > 0) and _all(gbs > 0))  # on one GPU (n = 1) the ring is 0 and replaced below
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero rate: _ranked raises, as the scalar path
        transfers = _collectives(base, ga, g, world, gbs, trainable, live)
    # x * 1 is x, bit for bit (NaN, infinities and -0.0 included): one accumulation step skips those products
    windows = {"fwd_bwd": (fwd + bwd + rec + deq) * ga, "bwd": bwd * ga, "last_bwd": bwd, "attention": att * ga} \
        if ga != 1 else {"fwd_bwd": fwd + bwd + rec + deq, "bwd": bwd, "last_bwd": bwd, "attention": att}
    comm = exposed_s = _exposed(transfers, windows, g["overlap"])
    if not _all(world > 1):
        # collectives() is empty on one GPU: exposed([]) leaves min(0.0, overlap x fwd_bwd) hidden
        alone = 0.0 - _min(0.0, g["overlap"] * windows["fwd_bwd"])
        comm = np.where(world > 1, exposed_s, alone)
    parts = {"forward": fwd * runs, "backward": bwd * runs, "recompute": rec * runs, "dequant": deq * runs} \
        if runs != 1.0 else {"forward": fwd, "backward": bwd, "recompute": rec, "dequant": deq}
    parts.update(optimizer=_optimizer(mix, base, ga, g, world, trainable), communication=comm, other=g["other"])
    return parts, transfers, g, c


def _optimizer(mix, base: Scenario, ga: int, g: dict, world, trainable):
    """time.optimizer_s with tp = pp = 1 and dp = world."""
    shard = trainable / 1 / (world if mix.shard_stage >= 1 else 1)
    state_scale = 0.5 if (mix.precision == "bf16" and mix.optimizer == "adamw") else 1.0
    if mix.offload == "none":
        return shard * ADAM_BYTES_PER_PARAM[mix.optimizer] * state_scale / g["bandwidth"] + g["kernels"]
    t = shard / g["cpu_adam"] + shard * (2.0 + 2.0) / g["host_link"]
    if mix.offload == "optimizer+params":
        w = gathered_weight_bytes(base) / world
        t = t + w * gather_passes(base) * ga / g["host_link"]
    return t


def _collectives(base: Scenario, ga: int, g: dict, n, gbs, trainable, live: bool) -> list[tuple]:
    """comm.data_parallel as (seconds, window, unhidden) with tp = pp = 1 and dp = n (meaningless where n = 1)."""
    mix, m = base.mix, base.model
    lat, eff_comm = g["latency"], g["communication"]
    g_bytes = trainable / 1 * (2.0 if mix.precision != "fp32" else 4.0)
    ratio = g_bytes / DDP_BUCKET_BYTES
    buckets = np.where(ratio > 1.0, ratio, 1.0)  # max(1.0, ratio)
    last_bucket = _ring(_min(g_bytes, DDP_BUCKET_BYTES), n, gbs, eff_comm, 2.0, live)
    stage = mix.shard_stage
    if stage <= 1:
        out = [(_ring(g_bytes, n, gbs, eff_comm, 2.0, live) + buckets * lat, "last_bwd", last_bucket)]
        if stage == 1:
            out.append((_ring(trainable / 1 * 2.0, n, gbs, eff_comm, 1.0, live) + buckets * lat, "none", 0.0))
        return out
    reduce = ga * (_ring(g_bytes, n, gbs, eff_comm, 1.0, live) + buckets * lat)
    out = [(reduce, "bwd", ga * last_bucket / 2)]
    if stage == 2 and not mix.fsdp:
        out.append((_ring(trainable / 1 * 2.0, n, gbs, eff_comm, 1.0, live) + buckets * lat, "none", 0.0))
    if stage == 2 and mix.fsdp:
        out.append((_ring(gathered_weight_bytes(base) / 1, n, gbs, eff_comm, 1.0, live), "fwd_bwd", 0.0))
    if stage == 3:
        passes = gather_passes(base)
        units = sum(k for _, k in m.layer_groups) / 1 + 1
        gathers = ga * passes * _ring(gathered_weight_bytes(base) / 1, n, gbs, eff_comm, 1.0, live)
        if mix.fsdp:
            out.append((gathers + ga * units * passes * lat, "fwd_bwd", gathers / units))
        else:
            modules = _param_modules(base) / 1
            out.append((gathers + ga * modules * passes * lat, "fwd_bwd", gathers / units))
            out.append((ga * modules * passes * g["hook_us"] * 1e-6, "none", 0.0))
    return out


def _exposed(transfers: list[tuple], windows: dict, overlap):
    """comm.exposed's exposed seconds, over arrays."""
    by: dict[str, list[tuple]] = {}
    for t in transfers:
        by.setdefault(t[1], []).append(t)
    total_all = hidden = 0.0
    for window, ts in by.items():
        total = builtin_sum([s for s, _, _ in ts])
        fixed = builtin_sum([_min(u, s) for s, _, u in ts])
        room = overlap * windows.get(window, 0.0) if window != "none" else 0.0
        hidden = hidden + _min(total - fixed, room)
        total_all = total_all + total
    hidden = _min(hidden, overlap * windows.get("fwd_bwd", 0.0))
    return total_all - hidden


FLOATS_UP_TO = 24
"""Up to this many candidates hours_of computes one candidate at a time in plain floats (a node plan's dozen): the
arrays' ~90 numpy calls then cost more than the floats' arithmetic."""


def _floats(base: Scenario, table: list[tuple], cols: list[tuple]) -> list[tuple[float, float | None] | None]:
    """hours_of one candidate at a time: step_columns' and hours_of's operations on each candidate's floats, in the
    same order (numpy's float64 arithmetic is the interpreter's), `live` read over all of them as there. A
    candidate whose arithmetic raises (a zero rate) is left to the scalar path, as the arrays' infinities are."""
    hit = _SWEEP_TERMS.get(id(base))
    if hit is None or hit[0] is not base:
        if len(_SWEEP_TERMS) >= 256:
            _SWEEP_TERMS.clear()
        hit = _SWEEP_TERMS[id(base)] = (base, _sweep_terms(base))
    mix, stage, ga, runs, per_grad, sharded, adam, gathered, passes, units, modules, work, sps = hit[1]
    # table: gpu_row's floats; cols: ints (counts, micro-batch, parameters: below 2**53, so each operation with them
    # rounds as with their floats, an int's product or quotient being exact or correctly rounded) and floats
    links = [_link(table[c[0]][3], c[1], c[2], c[3], c[4]) for c in cols]
    live = all(c[6] > 0 for c in cols) and all(gbs > 0 for gbs in links)
    out: list[tuple[float, float | None] | None] = []
    for c, gbs in zip(cols, links):
        try:
            out.append(_one(mix, stage, ga, runs, per_grad, sharded, adam, gathered, passes, units, modules, work, sps,
                            live, table[c[0]], c, gbs))
        except (ZeroDivisionError, OverflowError, ValueError):
            out.append(None)
    return out


_SWEEP_TERMS: dict[int, tuple] = {}
"""_sweep_terms by the sweep's scenario (its id, the scenario kept with them): a sweep's plans read them on each call."""


def _sweep_terms(base: Scenario) -> tuple:
    """What _one reads of the sweep's scenario: the same values for every candidate of its plans."""
    mix, wl = base.mix, base.workload
    ga, stage = wl.gradient_accumulation, mix.shard_stage
    runs = ga + 0.0
    per_grad = 2.0 if mix.precision != "fp32" else 4.0
    sharded = mix.shard_stage >= 1
    adam = (ADAM_BYTES_PER_PARAM[mix.optimizer], 0.5 if (mix.precision == "bf16" and mix.optimizer == "adamw")
            else 1.0) if mix.offload == "none" else None
    gathered = gathered_weight_bytes(base) / 1 if (stage >= 2 or mix.offload == "optimizer+params") else 0.0
    passes = gather_passes(base) if (stage == 3 or mix.offload == "optimizer+params") else 0
    units = sum(k for _, k in base.model.layer_groups) / 1 + 1 if stage == 3 else 1.0
    modules = _param_modules(base) / 1 if stage == 3 and not mix.fsdp else 0.0
    work = wl.samples_per_epoch() * wl.epochs
    sps = wl.samples_per_sequence()
    return mix, stage, ga, runs, per_grad, sharded, adam, gathered, passes, units, modules, work, sps


def _link(intra: float, world: float, gpn: float, nodes: float, inter: float) -> float:
    """step_columns' gbs of one candidate: the network once the ranks span nodes."""
    if nodes > 1 and world > gpn:
        network = inter * gpn
        return (network if network < intra else intra) if gpn > 1 else network
    return intra


def _one(mix, stage, ga, runs, per_grad, sharded, adam, gathered, passes, units, modules, work, sps, live, g, c,
         gbs):
    """(hours, dollars or None) of one candidate, or None (hours_of's sanity), as step_columns and hours_of (`gbs`:
    its _link)."""
    comm_eff, lat, overlap, intra, bandwidth, kernels, host_link, cpu_adam, hook_us, other, price = g
    _, world, gpn, nodes, inter, batch, trainable, fwd, bwd, rec, deq, att = c
    if ga != 1:
        fwd_bwd, w_bwd = (fwd + bwd + rec + deq) * ga, bwd * ga
    else:
        fwd_bwd, w_bwd = fwd + bwd + rec + deq, bwd
    if world > 1:
        # _ring(b, world, gbs, comm, f) is f * (n - 1) / n * b / (gbs * 1e9 * comm), evaluated left to right: its
        # factors once per candidate give the same floats; its zeros (n > 1 here) where not live and b <= 0 or gbs <= 0
        n = world
        one, two, per = 1.0 * (n - 1) / n, 2.0 * (n - 1) / n, gbs * 1e9 * comm_eff
        g_bytes = trainable / 1 * per_grad
        ratio = g_bytes / DDP_BUCKET_BYTES
        buckets = ratio if ratio > 1.0 else 1.0
        b = DDP_BUCKET_BYTES if DDP_BUCKET_BYTES < g_bytes else g_bytes
        last_bucket = two * b / per if live or not (b <= 0 or gbs <= 0) else 0.0
        none = None  # the collective no compute hides (one at most)
        if stage <= 1:
            ring = two * g_bytes / per if live or not (g_bytes <= 0 or gbs <= 0) else 0.0
            wins = ((ring + buckets * lat, overlap * bwd, last_bucket),)  # the last backward's window
            if stage == 1:
                b = trainable / 1 * 2.0
                none = (one * b / per if live or not (b <= 0 or gbs <= 0) else 0.0) + buckets * lat
        else:
            ring = one * g_bytes / per if live or not (g_bytes <= 0 or gbs <= 0) else 0.0
            reduce = (ga * (ring + buckets * lat), overlap * w_bwd, ga * last_bucket / 2)
            wins = (reduce,)
            if stage == 2 and not mix.fsdp:
                b = trainable / 1 * 2.0
                none = (one * b / per if live or not (b <= 0 or gbs <= 0) else 0.0) + buckets * lat
            if stage == 2 and mix.fsdp:
                ring = one * gathered / per if live or not (gathered <= 0 or gbs <= 0) else 0.0
                wins = (reduce, (ring, overlap * fwd_bwd, 0.0))
            if stage == 3:
                ring = one * gathered / per if live or not (gathered <= 0 or gbs <= 0) else 0.0
                gathers = ga * passes * ring
                if mix.fsdp:
                    wins = (reduce, (gathers + ga * units * passes * lat, overlap * fwd_bwd, gathers / units))
                else:
                    wins = (reduce, (gathers + ga * modules * passes * lat, overlap * fwd_bwd, gathers / units))
                    none = ga * modules * passes * hook_us * 1e-6
        comm = _fexposed(wins, none, overlap * fwd_bwd)
    else:  # collectives() is empty on one GPU: exposed([]) leaves min(0.0, overlap x fwd_bwd) hidden
        room = overlap * fwd_bwd
        comm = 0.0 - (room if room < 0.0 else 0.0)
    shard = trainable / 1 / (world if sharded else 1)
    if adam is not None:
        opt = shard * adam[0] * adam[1] / bandwidth + kernels
    else:
        opt = shard / cpu_adam + shard * (2.0 + 2.0) / host_link
        if mix.offload == "optimizer+params":
            opt = opt + gathered / world * passes * ga / host_link
    if runs != 1.0:
        fwd, bwd, rec, deq = fwd * runs, bwd * runs, rec * runs, deq * runs
    step = sum((fwd, bwd, rec, deq, opt, comm, other))
    steps = work / (batch * ga * world * sps)
    if not math.isfinite(steps):  # np.ceil's infinity or NaN: not a finite number of hours
        return None
    hours = float(math.ceil(steps)) * step / 3600.0
    usd = hours * world * price
    priced = price == price
    if not (step > 0 and min(fwd, bwd, rec, deq, opt, comm, other) >= 0 and math.isfinite(step + hours) and hours >= 0
            and not (priced and not (math.isfinite(usd) and usd >= 0))):
        return None
    return hours, (usd if priced else None)


def _fexposed(wins: tuple, none: float | None, cap: float) -> float:
    """_exposed of one candidate: `wins`, its collectives in _collectives' order of windows, one per window, each as
    (seconds, overlap x window seconds, unhidden); `none`: the seconds of the one no compute hides, if any; `cap`:
    overlap x fwd_bwd. Each window's sums are of one term: builtin_sum([x]) is 0 + x, as sum([x])."""
    total_all = hidden = 0.0
    for s, room, u in wins:
        total = 0.0 + s
        free = total - (0.0 + (s if s < u else u))  # _min(u, s)
        hidden = hidden + (room if room < free else free)
        total_all = total_all + total
    if none is not None:  # room 0.0, unhidden 0.0
        total = 0.0 + none
        free = total - (0.0 + (none if none < 0.0 else 0.0))
        hidden = hidden + (0.0 if 0.0 < free else free)
        total_all = total_all + total
    return total_all - (cap if cap < hidden else hidden)
