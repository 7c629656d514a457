"""One compute signature's micro-batch seconds on every GPU type at once: bounds.micro_batch_seconds with the
estimator's pass times (estimate/time.py pass_times, op_time, kernels.gemm_utilization) computed as arrays over
the GPU types, one pass over the ops instead of one per GPU type (a search of 16 GPU types and 10^4 signatures
spent a sixth of its time there). The same formulas; the op times are kept per op list and rates, which the
mixes that differ only in checkpointing share, and the passes summed as a matrix product (the same terms in another
order); tests/plan/test_pass_bounds.py checks the numbers against micro_batch_seconds per GPU type to 1e-12."""
from __future__ import annotations

import math
from operator import attrgetter
from typing import Any, Sequence

from ..estimate.comm import model_parallel
from ..estimate.compute import Op, cached_ops, micro_batch_ops, recomputed
from ..estimate.efficiency import Efficiency
from ..estimate.kernels import SHORT_TILE, TILE, UNKNOWN_SMS
from ..estimate.layout import layout
from ..estimate.time import Rates, rates
from ..spec.scenario import Scenario, fast_replace
from .bounds import LARGE, SAFETY, op_slopes, ops_mix, rate_table

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
    """time.op_time over GPU types (`r`: the Rates fields as arrays) of an op that is not a non-fusible matmul
    (those take _matmul_times, all of an op list's at once)."""
    kind = op.kind
    if kind == "dequant":
        return op.bytes / r["dequant"] + op.kernels * r["floor"]
    if op.fusible:
        return op.bytes * r["compile_bytes"] / r["stream"] + op.kernels * r["compile_kernels"] * r["floor"]
    mem_t = op.bytes / r["stream"]
    floor = op.kernels * r["floor"]
    if kind == "attention":
        s = int(op.seq) or 1
        eager = op.flops / (r["gemm"] * _gemm_utilization(np, s, s, op.k, r["sms"], 1, r["k_half"]))
        with np.errstate(divide="ignore", invalid="ignore"):
            fused = op.flops * (op.seq + r["seq_half"]) / (r["attention"] * op.seq)
        return np.maximum(np.where(r["attention"] > 0, fused, eager), mem_t) + floor
    return (np.maximum(op.flops / (r["gemm"] * 0.1), mem_t) if op.flops else mem_t) + floor


def _matmul_times(np, ops: Sequence[Op], r: dict[str, Any]):
    """time.op_time of matmuls (not fusible), ops x GPU types in one pass: the same float operations element by
    element (Python's per-op integers and floats, then the same array operations on each op's row)."""
    sms = np.where(r["sms"] > 0, r["sms"], UNKNOWN_SMS)[None, :]
    cols = []  # per op: m, n, k, and per tile height: tiles, the tile use (0 where the height is not tried)
    for op in ops:
        m, n, k = max(op.rows, 1.0), op.n, op.k
        tiles_n = -(-n // TILE) if n > 0 else 0
        per = []
        for tm in (SHORT_TILE, TILE):
            if m >= TILE and tm == SHORT_TILE or m <= 0 or n <= 0 or k <= 0:
                per += [0, 0.0]
                continue
            tiles_m = math.ceil(m / tm)
            per += [tiles_m * tiles_n * max(op.groups, 1), (m * n) / (tiles_m * tm * tiles_n * TILE)]
        cols.append((float(k), m <= 0 or n <= 0 or k <= 0, *per))
    k, whole, short_tiles, short_use, tall_tiles, tall_use = (np.array(c)[:, None] for c in zip(*cols))
    best = np.zeros((len(ops), sms.shape[1]))
    for tiles, use in ((short_tiles, short_use), (tall_tiles, tall_use)):
        best = np.maximum(best, use * np.minimum(1.0, tiles.astype(float) / sms))
    with np.errstate(divide="ignore", invalid="ignore"):
        pipeline = np.where(r["k_half"][None, :] > 0, k / (k + r["k_half"][None, :]), 1.0)
    util = np.where(whole, 1.0, best * pipeline)
    fp8 = np.array([op.fp8 for op in ops])[:, None]
    grouped = np.array([op.grouped for op in ops])[:, None]
    rate = np.where(fp8, r["fp8_gemm"], r["gemm"]) * util * np.where(grouped, r["grouped"], 1.0)
    flops = np.array([op.flops for op in ops], float)[:, None]
    mem_t = np.array([op.bytes for op in ops], float)[:, None] / r["stream"]
    floor = np.array([op.kernels for op in ops], float)[:, None] * r["floor"]
    return np.maximum(flops / rate, mem_t) + floor


def _op_matrices(np, ops: Sequence[Op], r: dict[str, Any]):
    """Per op and GPU type: its seconds (op_time; 0 for dispatch) and its kernel launches (x torch.compile's share
    for a fusible op); per op: whether it is a dispatch and a dequantization. What every signature with these ops
    and rates shares (checkpointing changes only the passes' factors)."""
    n = len(r["floor"])
    times = np.zeros((len(ops), n))
    dispatch = np.array([op.kind == "dispatch" for op in ops], bool)
    gemms, fused, plain, deq = [], [], [], []  # by op_time's formula; plain: a stream op without FLOPs
    for i, op in enumerate(ops):
        if not dispatch[i]:  # (a dispatch's time is 0: its launches are the host's, _pass_seconds' syncs)
            kind = op.kind
            if kind == "dequant":
                deq.append(i)
            elif op.fusible:
                fused.append(i)
            elif kind == "matmul":
                gemms.append(i)
            elif kind == "stream" and not op.flops:
                plain.append(i)
            else:
                times[i] = _op_time(np, op, r)
    if gemms:
        times[gemms] = _matmul_times(np, [ops[i] for i in gemms], r)
    # _op_time's formulas on a column of ops at once: the same float operations, element by element
    if deq:
        b, k = _column(np, ops, deq, "bytes"), _column(np, ops, deq, "kernels")
        times[deq] = b / r["dequant"] + k * r["floor"]
    if plain:
        b, k = _column(np, ops, plain, "bytes"), _column(np, ops, plain, "kernels")
        times[plain] = b / r["stream"] + k * r["floor"]
    if fused:
        b, k = _column(np, ops, fused, "bytes"), _column(np, ops, fused, "kernels")
        times[fused] = b * r["compile_bytes"] / r["stream"] + k * r["compile_kernels"] * r["floor"]
    fusible = np.array([op.fusible for op in ops], bool)[:, None]
    kernels = np.where(dispatch[:, None], 0.0, _column(np, ops, range(len(ops)), "kernels")
                       * np.where(fusible, r["compile_kernels"], 1.0))
    dequant = np.array([op.kind == "dequant" for op in ops], bool)
    launches = np.array([op.kernels if op.kind == "dispatch" else 0.0 for op in ops])
    return times, kernels, dispatch, dequant, launches


def _column(np, ops: Sequence[Op], rows: Any, name: str):
    """One field of these ops as a column of floats (ops x 1)."""
    return np.array([getattr(ops[i], name) for i in rows], float)[:, None]


def _staged(np, ops: Sequence[Op], matrices: tuple, share: float) -> tuple:
    """_op_matrices of a pipeline stage from those of the whole model's ops: micro_batch_ops gives a stage `share` of
    each layer group's count (a block op's FLOPs, bytes and kernels scale with it, so its op_time does: the GEMM
    shape reads the rows and widths, not the count) and the head whole (tests/plan/test_pass_bounds.py)."""
    if share == 1.0:
        return matrices
    times, kernels, dispatch, dequant, launches = matrices
    part = np.array([1.0 if op.head else share for op in ops])
    return times * part[:, None], kernels * part[:, None], dispatch, dequant, launches * part


def work_rates(np, scn: Scenario, seq: float, memo: dict, one_length: bool, scns: list[Scenario],
               effs: list[Efficiency], each: list[Rates]):
    """op_rates_per_gpu(sequence_work(scn, seq, memo, one_length), scns, effs, each, memo) without the work list:
    the same float operations on arrays of the ops' fits (kept per ops_mix without the pipeline, then per stage
    share and checkpointing), not an object per op and mix; None when there is no op (an empty work list)."""
    mix, flat = scn.mix, ops_mix(scn.mix)
    key = ("rated work", flat, seq, one_length, mix.gradient_checkpointing, mix.checkpointing, mix.checkpoint_every)
    parts = memo.get(key)
    if parts is None:
        pp = flat.pipeline_parallel
        whole = fast_replace(flat, pipeline_parallel=1) if pp > 1 else flat
        base = memo.get(("slope arrays", whole, seq, one_length))
        if base is None:
            at = fast_replace(scn, mix=whole)
            base = _one_length_arrays(np, at, seq) if one_length else NotImplemented
            if base is NotImplemented:
                slopes = memo.get((whole, seq, one_length))  # sequence_work's, when it made them
                if slopes is None:
                    slopes = memo[(whole, seq, one_length)] = op_slopes(at, seq, one_length)
                base = _slope_arrays(np, [op for op, _, _ in slopes], np.array([f for _, f, _ in slopes], float),
                                     np.array([b for _, _, b in slopes], float))
            memo[("slope arrays", whole, seq, one_length)] = base
        if base is None:
            parts = memo[key] = ()
        else:
            ops, kinds, cls, flops, bytes_, stream_of, per = base
            staged = per.get(pp)
            if staged is None:
                staged = per[pp] = (flops, bytes_)
                if pp > 1:  # _staged_slopes: a block op's fits times 1 / stages, the head's whole
                    head = per.get("head")
                    if head is None:
                        head = per["head"] = np.array([op.head for op in ops], bool)[:, None]
                    part = np.where(head, 1.0, 1.0 / pp)
                    staged = per[pp] = (flops * part, bytes_ * part)
            ckpt = key[4:]
            passes = per.get(ckpt)
            if passes is None:
                passes = per[ckpt] = np.array([1.0 + op.backward + recomputed(op, mix) for op in ops])[:, None]
            parts = memo[key] = (base, np.concatenate([staged[0] * passes, staged[1] * passes], axis=1))
    if not parts:
        return None
    base, work = parts
    divisor = memo.get(("divisor", id(base), id(each)))  # op_rates_per_gpu's rate and stream per op, GPU and term
    if divisor is None or divisor[0] is not base or divisor[1] is not each:
        _, kinds, cls, _, _, stream_of, _ = base
        rate, stream = rate_table(np, kinds, scns, effs, each, memo)
        by = np.concatenate([np.repeat(rate[:, cls].T[:, :, None], 2, axis=2),
                             np.repeat(stream[:, stream_of].T[:, :, None], 2, axis=2)], axis=2)  # ops x GPUs x 4
        # no rate: a quotient by 1 set to 0 afterwards, the same numbers (np.divide's where= took 3x the time)
        safe, zero = np.where(by > 0, by, 1.0), np.flatnonzero(~(by > 0))
        divisor = memo[("divisor", id(base), id(each))] = (base, each, safe, zero)  # both kept: no id reuse
    out = work[:, None, :] / divisor[2]  # _rated_ops' where(rate > 0, work / rate, 0)
    out.ravel()[divisor[3]] = 0.0
    out *= SAFETY
    # GPUs x ops x 4, laid out op by op as _rated_ops' arrays are (seconds_per_sequence sums in the layout's order)
    return out.transpose(1, 0, 2)


def _slope_arrays(np, ops: list[Op], flops, bytes_):
    """(ops, op classes, class per op, FLOPs fits, bytes fits, stream column per op, a dict for work_rates: the
    fits per pipeline's stages and the passes per checkpointing) of op_slopes' ops and fits (ops x 2 each), None
    without an op."""
    if not ops:
        return None
    kinds: dict = {}  # op class -> column of the rate table, as op_rates_per_gpu numbers them
    cls = np.array([kinds.setdefault((op.fusible, op.kind, op.fp8, op.grouped), len(kinds)) for op in ops])
    return ops, kinds, cls, flops, bytes_, np.array([1 if op.fusible else 0 for op in ops]), {}


def _one_length_arrays(np, scn: Scenario, seq: float):
    """_slope_arrays of op_slopes(scn, seq, one_length=True), the same float operations (bounds._slopes,
    _at_least_linear, _at) on arrays of the op lists' numbers instead of op by op; NotImplemented where the small
    micro-batches' lists do not line up with the slopes' (op_slopes then decides)."""
    one, two = micro_batch_ops(scn, LARGE, seq), micro_batch_ops(scn, 2 * LARGE, seq)
    if len(one) != len(two) or any(a.kind != b.kind or a.layer != b.layer for a, b in zip(one, two)):
        return None  # op_slopes: no op

    def numbers(ops):
        return np.array([op.flops for op in ops], float), np.array([op.bytes for op in ops], float)

    (f1, b1), (f2, b2) = numbers(one), numbers(two)
    flops, bytes_ = (f2 - f1) / LARGE, (b2 - b1) / LARGE  # per added sequence
    f_ok, b_ok = np.ones(len(one), bool), np.ones(len(one), bool)
    for batch in (1, 2, 16):  # at least linear: small micro-batches reach the slope times the sequences
        ops = cached_ops(scn, batch, seq) if batch == 1 else micro_batch_ops(scn, batch, seq)
        if len(ops) != len(one):
            return NotImplemented
        f, b = numbers(ops)
        f_ok &= f >= batch * flops * (1 - 1e-9)
        b_ok &= b >= batch * bytes_ * (1 - 1e-9)
    keep = np.array([op.kind not in ("dispatch", "dequant") for op in one], bool)
    flops = np.where(f_ok & (flops >= 0), flops / seq, 0.0)[keep]  # _at: c1 = slope / seq, c2 = 0
    bytes_ = np.where(b_ok & (bytes_ >= 0), bytes_ / seq, 0.0)[keep]
    zero = np.zeros(len(flops))
    return _slope_arrays(np, [op for op, k in zip(one, keep.tolist()) if k], np.stack([flops, zero], axis=1),
                         np.stack([bytes_, zero], axis=1))


RATE_MIX_FIELDS = ("precision", "attention", "compile")
"""The Mix fields time.rates reads (with the GPU and the efficiency; tests/plan/test_pass_bounds.py varies the
others)."""
rate_key = attrgetter(*RATE_MIX_FIELDS)
"""A mix's RATE_MIX_FIELDS values, a tuple."""


def rates_per_gpu(np, scns: Sequence[Scenario], effs: Sequence[Efficiency], memo: dict):
    """(time.rates of each scenario, the RATE_FIELDS as arrays over them), kept in `memo` per distinct
    RATE_MIX_FIELDS value: the scenarios of one search's calls are one mix on the same GPU types."""
    key = rate_key(scns[0].mix)
    hit = memo.get(key)
    if hit is None:
        each = [rates(s, e) for s, e in zip(scns, effs)]
        hit = memo[key] = (each, {name: np.array([getattr(x, name) for x in each], float) for name in RATE_FIELDS})
    return hit


def micro_batch_seconds_per_gpu(np, scns: Sequence[Scenario], effs: Sequence[Efficiency], batch: int, length: float,
                                memo: dict | None = None, rated: tuple | None = None):
    """bounds.micro_batch_seconds of `scns` (one mix on each GPU type, `effs` their efficiencies): per GPU type,
    the forward, backward, recompute and dequantization seconds of one micro-batch at a fixed padded length, each
    pass stretched when its kernel launches outlast its GPU work. `memo`: a dict shared by the calls of one search
    (same GPU types), keeping each op list's times per rates (_op_matrices); the passes are summed as one matrix
    product, the same terms in another order (a few ulps, inside the bounds' SAFETY). `rated`: rates_per_gpu's
    answer for `scns`, when known (the rates do not read the workload). With a memo, a pipeline's op times are
    those of its ops without the pipeline, a block op's times 1 / stages (_staged: a few ulps from its own)."""
    first = scns[0]
    fixed = None if memo is None else memo.get(("fixed", id(first.workload), length, batch))
    if fixed is None or fixed[0] is not first.workload:  # the workload kept with its key: no id reuse
        wl = first.with_(padding="max_length", seq_len=max(1, math.floor(length))).workload
        fixed = (first.workload, wl, wl.mean_padded_len(batch))
        if memo is not None:
            memo[("fixed", id(first.workload), length, batch)] = fixed
    _, wl, seq = fixed
    mix = first.mix  # the ops depend neither on the GPU nor on what ops_mix leaves out (checkpointing)
    flat, share = ops_mix(mix), 1.0
    if memo is not None and flat.pipeline_parallel > 1:
        flat, share = fast_replace(flat, pipeline_parallel=1), 1.0 / flat.pipeline_parallel
    ops = cached_ops(fast_replace(first, mix=flat, workload=wl), batch, seq)
    each, r = rated if rated is not None else rates_per_gpu(np, scns, effs, {})
    if memo is None:
        matrices, factors = _staged(np, ops, _op_matrices(np, ops, r), share), _factors(np, ops, mix)
    else:  # the whole model's matrices per op list and rates (the stages scale them), the factors per checkpointing
        same = memo.get(("rates", id(each)))  # equal rates share their times: the first such list stands for them
        if same is None or same[0] is not each:
            same = memo[("rates", id(each))] = (each, memo.setdefault(("same", tuple(each)), each))
        key = ("times", id(ops), id(same[1]))
        hit = memo.get(key)
        if hit is None or hit[0] is not ops:  # the ops and rates kept with their key: no id reuse
            hit = memo[key] = (ops, same[1], _op_matrices(np, ops, r), {})
        matrices = hit[3].get(share)
        if matrices is None:
            matrices = hit[3][share] = _staged(np, ops, hit[2], share)
        ckpt = ("factors", id(ops), mix.gradient_checkpointing and (mix.checkpointing, mix.checkpoint_every))
        factors = memo.get(ckpt)
        if factors is None or factors[0] is not ops:
            factors = memo[ckpt] = (ops, _factors(np, ops, mix))
        factors = factors[1]
    return _pass_seconds(np, matrices, factors, r)


def _factors(np, ops: Sequence[Op], mix: Any):
    """Per pass (forward, backward, recompute) and op: how many times the pass runs the op (0 for a dispatch),
    and the recompute shares alone."""
    rec = np.array([recomputed(op, mix) for op in ops]) if mix.gradient_checkpointing else np.zeros(len(ops))
    back = np.array([1.0 if op.kind == "dequant" else op.backward for op in ops])
    dispatch = np.array([op.kind == "dispatch" for op in ops], bool)
    return np.where(dispatch, 0.0, np.stack([np.ones(len(ops)), back, rec])), rec


def _pass_seconds(np, matrices: tuple, factors: tuple, r: dict[str, Any]):
    """micro_batch_seconds_per_gpu from an op list's matrices (_op_matrices) and factors (_factors)."""
    times, kernels, dispatch, dequant, launches = matrices
    factors, rec = factors
    gpu, kern, deq = factors @ times, factors @ kernels, (factors * dequant) @ times
    syncs = np.zeros((3, times.shape[1]))  # syncs in forward and recompute (backward replays known indices)
    syncs[0], syncs[2] = launches.sum() * r["sync"], (launches * rec).sum() * r["sync"]
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(gpu > 0, np.maximum(kern * r["host"] / gpu, 1.0), 1.0)  # host-bound passes stretch
    parts = (gpu - deq) * scale + syncs
    return parts.sum(axis=0) + (deq * scale).sum(axis=0)


COMM_FIELDS = ("precision", "gradient_checkpointing", "checkpointing", "tensor_parallel", "sequence_parallel",
               "tp_comm_overlap", "pipeline_parallel", "virtual_stages", "context_parallel", "context_parallel_impl",
               "expert_parallel", "experts_top_k")
"""The Mix fields comm.model_parallel and the layout read (tests/plan/test_pass_bounds.py varies the others)."""
comm_key = attrgetter(*COMM_FIELDS)
"""A mix's COMM_FIELDS values, a tuple (attrgetter: the search makes one per signature)."""


def exposed_seconds_per_sequence(np, bases: Sequence[Scenario], effs: Sequence[Efficiency], mix: Any, seq: float,
                                 memo: dict, blocks: Sequence[int] | None = None):
    """Per block (`bases`, `effs` its efficiency): a lower bound on the exposed communication seconds one sequence
    of at least `seq` tokens adds, from the model-parallel collectives no compute hides (window "none", which
    comm.exposed adds whole). Their bytes are linear in the tokens of a step (ga x micro-batch x length, no
    latency term), so a step's are at least ga x micro-batch times one sequence's at the shortest length. Kept
    per distinct COMM_FIELDS value in `memo`. `blocks`: the only blocks whose number is read (the others may be
    NaN), each computed once per value: most blocks have no candidate of a given layout that fits."""
    key = comm_key(mix)
    hit = memo.get(key)
    if hit is None:  # the first mix of the value stands for it, whichever block is asked for later
        hit = memo[key] = (mix, np.full(len(bases), np.nan))
    first, out = hit
    for b in range(len(bases)) if blocks is None else blocks:
        if out[b] != out[b]:  # NaN: not yet computed
            out[b] = _exposed(bases[b], effs[b], first, seq) * SAFETY
    return out


def _exposed(base: Scenario, eff: Efficiency, mix: Any, seq: float) -> float:
    if base.cluster.world_size <= 1:  # comm.collectives: one GPU talks to no one
        return 0.0
    scn = fast_replace(base, mix=mix, workload=fast_replace(base.workload, gradient_accumulation=1))
    return sum(t.seconds for t in model_parallel(scn, eff, 1, seq, layout(scn)) if t.window == "none")
