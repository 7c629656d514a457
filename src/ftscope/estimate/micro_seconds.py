"""A plan's micro-batch seconds per GPU type: the (forward, backward, recompute, dequant, attention) seconds of a
fitting candidate's micro-batch that grid_time.py's hours read, made where no estimate has made them.

time.py's pass_times also sums every op's seconds per layer, which only an Estimate's breakdown reads; a plan times
each new micro-batch on each GPU type it meets (its larger GPU counts shard the states, so their batches are new)
and ranks without them. pass_seconds takes pass_times' sums in the same order, so each number is equal
(tests/estimate/test_micro_seconds.py compares them with ==); a change to pass_times' passes must be made here too.
"""
from __future__ import annotations

from typing import Callable, Sequence

from ..spec.hardware import GpuSpec
from ..spec.scenario import Scenario
from .compute import Op, cached_ops
from .efficiency import Calibration, Efficiency
from .kernels import gemm_utilization
from .shared import Shared
from .time import Rates, shared_rates


def micro_row(sh: Shared, cal: Calibration, eff: Efficiency, batch: int, gpu: GpuSpec,
              scenario: Callable[[], Scenario] | None = None) -> tuple:
    """(forward, backward, recompute, dequant, attention) seconds of one micro-batch on this GPU type: time.py's
    micro_batch_times (through its memos: _micro_seconds), kept as a tuple per GPU type and micro-batch. Only the
    GPU type is read of the candidate (`scenario`, which makes one, is not called): its model, mix and workload
    are the sweep's (sh covers it)."""
    memo = sh.get(("grid_micro", id(cal)), dict, cal)
    key = (id(gpu), id(eff), batch)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _micro_seconds(sh, gpu, batch, eff)
    return hit


def _micro_seconds(sh: Shared, gpu: GpuSpec, batch: int, eff: Efficiency) -> tuple:
    """micro_row's values made: time.py's micro_batch_times through its memos (the padded length and ops per
    micro-batch, the rates per GPU type), or, where no estimate of the sweep has timed this micro-batch, its passes
    without the seconds per layer (pass_seconds: equal to pass_times')."""
    known = sh.known((("micro", batch, id(eff)), id(gpu)))  # micro_batch_times' own memo entry
    if known is not None:
        mb, _, att = known[0]
        return (mb["forward"], mb["backward"], mb["recompute"], mb["dequant"], att)
    scn = sh.scenario
    ops = sh.known(("ops", batch))
    if ops is None:  # micro_batch_times' entries, made as there
        seq = sh.get(("padded", batch), lambda: scn.workload.mean_padded_len(batch))
        ops = sh.get(("ops", batch), lambda: cached_ops(scn, batch, seq))
    r = shared_rates(gpu, scn.mix, eff)
    key = (id(ops), id(r))
    hit = _SECONDS.get(key)
    if hit is None:
        if len(_SECONDS) >= 4096:
            _SECONDS.clear()
        hit = _SECONDS[key] = (ops, r, pass_seconds(ops, scn.mix, r))
    return hit[2]


_SECONDS: dict[tuple, tuple] = {}
"""(ops, rates, pass_seconds) by (id of the ops, id of the rates). compute.cached_ops gives one ops tuple per model,
compute_mix and batch shape, and time.shared_rates one rates object per GPU type, efficiency and the mix fields it
reads (the value keeps both alive, so their ids stay their own); pass_seconds reads no field of the mix that
compute_mix leaves out: the sweeps of mixes that differ only in those (ZeRO stage, offload, optimizer) share a
micro-batch's passes on a GPU type, and a new micro-batch's key hashes neither the model, the mix nor the rates.
(time.py's _PASS_CACHE, keyed on all three, is not read: a plan's estimates are of its few best candidates, and
their sweep's times are micro_batch_times' memo entries, read above.)"""


def pass_seconds(ops: Sequence[Op], mix, r: Rates) -> tuple[float, float, float, float, float]:
    """(forward, backward, recompute, dequant, attention) of time.pass_times(ops, scn, eff, r): its parts and
    attention seconds, the same operations in the same order, without the seconds per layer (a ranking reads
    none), with compute.recomputed and time.op_time written out in the loop (their calls were a third of its
    time; tests/estimate/test_micro_seconds.py compares the results with ==, on catalog and random ops)."""
    ckpt = mix.gradient_checkpointing
    policy, every = mix.checkpointing, mix.checkpoint_every
    g0 = g1 = g2 = k0 = k1 = k2 = d0 = d1 = d2 = s0 = s2 = 0.0
    attention = 0.0
    sync, compiled, floor, stream, cbytes = r.sync, r.compile_kernels, r.floor, r.stream, r.compile_bytes
    sms, k_half = r.sms, r.k_half
    for kind, _, flops, byts, kernels, rows, backward, recompute, grouped, n, k, groups, seq, fp8, fusible, head in ops:
        if not ckpt or head:  # recomputed(op, mix)
            rec = 0.0
        elif policy == "selective":
            rec = 1.0 if kind == "attention" else 0.0
        elif policy == "per-op":
            rec = 1.0 if fusible else 0.0
        else:
            rec = 1.0 / every if recompute else 0.0
        if kind == "dispatch":
            t = kernels * sync
            s0 += t
            s2 += t * rec
            continue
        if kind == "dequant":  # op_time(op, r); `a if a > b else b` where it takes max(b, a)
            t = byts / r.dequant + kernels * floor
        elif fusible:
            t = byts * cbytes / stream + kernels * compiled * floor
        else:
            mem_t = byts / stream
            fl = kernels * floor
            if kind == "matmul":
                util = gemm_utilization(1.0 if 1.0 > rows else rows, n, k, sms, groups, k_half)
                x = flops / ((r.fp8_gemm if fp8 else r.gemm) * util * (r.grouped if grouped else 1.0))
            elif kind == "attention":
                if not r.attention:
                    s = int(seq) or 1
                    x = flops / (r.gemm * gemm_utilization(s, s, k, sms, 1, k_half))
                else:
                    x = flops * (seq + r.seq_half) / (r.attention * seq)
            elif flops:
                x = flops / (r.gemm * 0.1)
            else:
                x = mem_t
            t = (mem_t if mem_t > x else x) + fl
        k = kernels * (compiled if fusible else 1.0)
        back = 1.0 if kind == "dequant" else backward
        g0 += t
        g1 += t * back
        g2 += t * rec
        k0 += k
        k1 += k * back
        k2 += k * rec
        if kind == "dequant":
            d0 += t
            d1 += t * back
            d2 += t * rec
        elif kind == "attention":
            attention += t * (1 + back)
    host = r.host
    c0 = max(k0 * host / g0, 1.0) if g0 > 0 else 1.0  # host-bound passes stretch
    c1 = max(k1 * host / g1, 1.0) if g1 > 0 else 1.0
    c2 = max(k2 * host / g2, 1.0) if g2 > 0 else 1.0
    # pass_times' sum(deq[i] * scale[i] for i in range(3)), written out: sum() starts from the int 0
    return ((g0 - d0) * c0 + s0, (g1 - d1) * c1 + 0.0, (g2 - d2) * c2 + s2, 0 + d0 * c0 + d1 * c1 + d2 * c2,
            attention)
