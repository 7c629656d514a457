"""Hours and dollars of many candidates at once, as numpy arrays: what estimate/figures.py's `_ranked` computes
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

import sys
from typing import Callable, Sequence

import numpy as np

from ..spec.hardware import GpuSpec
from ..spec.scenario import Scenario
from .comm import DDP_BUCKET_BYTES, _param_modules, gather_passes
from .cost import price_of
from .efficiency import Calibration, Efficiency
from .weight_memory import gathered_weight_bytes
from .shared import Shared
from .time import ADAM_BYTES_PER_PARAM, OPTIMIZER_KERNELS, micro_batch_times

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
    return (eff.communication, eff.collective_latency_us * 1e-6,
            eff.comm_overlap if gpu.peer_to_peer else eff.comm_overlap_host,  # exposed(host_staged=...)
            gpu.intra_node_gbs * (1.0 if gpu.peer_to_peer else 0.5),  # layout._link
            gpu.memory_bandwidth_gbs * 1e9 * eff.bandwidth,  # optimizer_s: bw * eff.bandwidth
            OPTIMIZER_KERNELS * max(eff.kernel_floor_us, eff.host_us_per_kernel) * 1e-6,
            gpu.host_link_gbs * 1e9 * eff.communication, eff.cpu_adam_params_per_s, eff.zero3_hook_us,
            eff.step_overhead_s + eff.microbatch_overhead_s * scn.workload.gradient_accumulation,
            np.nan if price is None else price)


def micro_row(sh: Shared, cal: Calibration, eff: Efficiency, batch: int, gpu: GpuSpec,
              scenario: Callable[[], Scenario]) -> tuple:
    """(forward, backward, recompute, dequant, attention) seconds of one micro-batch on this GPU type: time.py's
    micro_batch_times (through the same memo), kept as a tuple per GPU type and micro-batch (`scenario`: makes
    one on that GPU when the values are not yet known)."""
    memo = sh.get(("grid_micro", id(cal)), dict, cal)
    key = (id(gpu), id(eff), batch)
    hit = memo.get(key)
    if hit is None:
        mb, _, att = micro_batch_times(scenario(), batch, eff, None, sh)[0]
        hit = memo[key] = (mb["forward"], mb["backward"], mb["recompute"], mb["dequant"], att)
    return hit


SMALLEST = 8
"""Fewer fitting candidates than this take the scalar path: an array's fixed cost (~100 numpy calls) is then the
larger."""


def hours_of(base: Scenario, table: list[tuple], cols: list[tuple]) -> list[tuple[float, float | None] | None]:
    """(run hours, run dollars or None without a price) of each candidate, as figures' _ranked computes them, or
    None where a figure is not a finite, non-negative number. `table`: gpu_row of each GPU type; `cols`: per
    candidate, its GPU's row in `table`, world size, GPUs per node, nodes, network GB/s per GPU, micro-batch,
    trainable parameters and micro_row. `base`: a scenario of the sweep (takes(base))."""
    if not cols:
        return []
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
