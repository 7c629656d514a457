"""One compute signature's micro-batch seconds on every GPU type at once: bounds.micro_batch_seconds with the
estimator's pass times (estimate/time.py pass_times, op_time, kernels.gemm_utilization) computed as arrays over
the GPU types, one pass over the ops instead of one per GPU type (a search of 16 GPU types and 10^4 signatures
spent a sixth of its time there). The same formulas in the same order; tests/plan/test_pass_bounds.py checks
the numbers against micro_batch_seconds per GPU type."""
from __future__ import annotations

import math
from typing import Any, Sequence

from ..estimate.compute import Op, cached_ops, recomputed
from ..estimate.efficiency import Efficiency
from ..estimate.kernels import SHORT_TILE, TILE, UNKNOWN_SMS
from ..estimate.time import rates
from ..spec.scenario import Scenario

RATE_FIELDS = ("fp8_gemm", "gemm", "attention", "seq_half", "stream", "dequant", "floor", "host", "sync", "sms",
               "k_half", "grouped", "compile_bytes", "compile_kernels")


def _gemm_utilization(np, m: float, n: int, k: int, sms, groups: int, k_half):
    """kernels.gemm_utilization over GPU types (`sms`, `k_half`: arrays)."""
    if m <= 0 or n <= 0 or k <= 0:
        return np.ones(len(sms))
    tiles_n = -(-n // TILE)
    best = np.zeros(len(sms))
    for tm in (SHORT_TILE, TILE) if m < TILE else (TILE,):
        tiles_m = math.ceil(m / tm)
        tile_use = (m * n) / (tiles_m * tm * tiles_n * TILE)
        fill = np.minimum(1.0, tiles_m * tiles_n * max(groups, 1) / np.where(sms > 0, sms, UNKNOWN_SMS))
        best = np.maximum(best, tile_use * fill)
    with np.errstate(divide="ignore", invalid="ignore"):
        pipeline = np.where(k_half > 0, k / (k + k_half), 1.0)
    return best * pipeline


def _op_time(np, op: Op, r: dict[str, Any]):
    """time.op_time over GPU types (`r`: the Rates fields as arrays)."""
    kind = op.kind
    if kind == "dequant":
        return op.bytes / r["dequant"] + op.kernels * r["floor"]
    if op.fusible:
        return op.bytes * r["compile_bytes"] / r["stream"] + op.kernels * r["compile_kernels"] * r["floor"]
    mem_t = op.bytes / r["stream"]
    floor = op.kernels * r["floor"]
    if kind == "matmul":
        util = _gemm_utilization(np, max(op.rows, 1.0), op.n, op.k, r["sms"], op.groups, r["k_half"])
        rate = (r["fp8_gemm"] if op.fp8 else r["gemm"]) * util * (r["grouped"] if op.grouped else 1.0)
        return np.maximum(op.flops / rate, mem_t) + floor
    if kind == "attention":
        s = int(op.seq) or 1
        eager = op.flops / (r["gemm"] * _gemm_utilization(np, s, s, op.k, r["sms"], 1, r["k_half"]))
        with np.errstate(divide="ignore", invalid="ignore"):
            fused = op.flops * (op.seq + r["seq_half"]) / (r["attention"] * op.seq)
        return np.maximum(np.where(r["attention"] > 0, fused, eager), mem_t) + floor
    return (np.maximum(op.flops / (r["gemm"] * 0.1), mem_t) if op.flops else mem_t) + floor


def micro_batch_seconds_per_gpu(np, scns: Sequence[Scenario], effs: Sequence[Efficiency], batch: int, length: float):
    """bounds.micro_batch_seconds of `scns` (one mix on each GPU type, `effs` their efficiencies): per GPU type,
    the forward, backward, recompute and dequantization seconds of one micro-batch at a fixed padded length, each
    pass stretched when its kernel launches outlast its GPU work."""
    fixed = [s.with_(padding="max_length", seq_len=max(1, math.floor(length))) for s in scns]
    seq = fixed[0].workload.mean_padded_len(batch)
    ops = cached_ops(fixed[0], batch, seq)  # the ops do not depend on the GPU
    each = [rates(f, e) for f, e in zip(fixed, effs)]
    r = {name: np.array([getattr(x, name) for x in each], float) for name in RATE_FIELDS}
    mix = fixed[0].mix
    n = len(each)
    gpu, kern, deq, syncs = (np.zeros((3, n)) for _ in range(4))
    for op in ops:
        rec = recomputed(op, mix) if mix.gradient_checkpointing else 0.0
        if op.kind == "dispatch":  # syncs in forward and recompute (backward replays known indices)
            t = op.kernels * r["sync"]
            syncs[0] += t
            syncs[2] += t * rec
            continue
        t = _op_time(np, op, r)
        k = op.kernels * (r["compile_kernels"] if op.fusible else 1.0)
        back = 1.0 if op.kind == "dequant" else op.backward
        for i, factor in enumerate((1.0, back, rec)):
            gpu[i] += t * factor
            kern[i] += k * factor
            if op.kind == "dequant":
                deq[i] += t * factor
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(gpu > 0, np.maximum(kern * r["host"] / gpu, 1.0), 1.0)  # host-bound passes stretch
    parts = (gpu - deq) * scale + syncs
    return parts.sum(axis=0) + (deq * scale).sum(axis=0)
