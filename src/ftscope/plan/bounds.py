"""What the search may know about a candidate without estimating it, and why each fact is exact.

Each rule either decides a candidate's status exactly, or bounds its ranking key from below; the engine
estimates every candidate whose bound could still enter a top-k, and checks every estimate against its bounds.

1. Memory (`MemoryProbe`, one per mix and GPU count): the memory model reads the GPU only through its usable
   capacity, so one model serves every GPU type. Every phase's reserved bytes grow with the micro-batch at a
   fixed length (activations, logits and allocator overhead scale with tokens and tokens x length), so a
   candidate fits at some micro-batch iff it fits at 1: the solver then returns >= 1, otherwise 0 ("does not
   fit"). The peak at micro-batch 1 bounds the memory ranking from below.
2. Micro-batch (classify.py): a phase's bytes lie between fixed + b x (what the first sequence adds) and
   fixed + b x (bytes per sequence at the solver's cap), since terms that stop growing (a fused loss's tile)
   only make the first slope steeper; so the solver's answer lies between the floors of min over phases of
   (capacity - fixed bytes) / each slope; one part in a million either side covers rounding. With a fixed
   global batch, recommend's rule (keep_global_batch) caps both at the global batch per GPU.
3. Time, for every candidate (`sequence_work`, `op_rates`): an op's time is at least
   max(FLOPs / (peak x the best efficiency its kind reaches), bytes / (bandwidth x streaming efficiency)) plus
   non-negative launch terms, and a step adds non-negative optimizer, communication and host terms. Per
   sequence, FLOPs and bytes are c1 x s + c2 x s^2 of the padded length s (fitted at three lengths; an op
   without that form contributes nothing), s never falls below its value at the micro-batch lower bound
   (mean_padded_len grows with the micro-batch), and hours = steps x step seconds with steps >= sequences /
   (micro-batch x accumulation x GPUs). Also, a micro-batch takes at least what one sequence of the shortest
   length takes (`micro_batch_seconds`, the estimator's step time: a micro-batch's time grows with its size and
   length), so per sequence at least that over the largest micro-batch the candidate may run. Under a parallel
   layout the ops are one GPU's share (micro_batch_ops applies the layout) and every GPU of a tensor, pipeline or
   context group runs each of its group's sequences: hours divide by the data-parallel replicas, not the GPUs.
   A sequence also adds the model-parallel collectives no compute hides (pass_bounds.exposed_seconds_per_sequence).
4. Time, for a candidate rule 3 cannot rule out (`refined_hours`): the least of the estimator's own step
   times over the micro-batches the candidate may run (when they are at most REFINE_SPAN apart), at the
   shortest length it may pad to. A micro-batch's compute never shrinks with the length (GEMM time is a
   non-decreasing step in the rows); per sequence it may grow with the micro-batch (a partly filled last tile),
   hence the minimum over micro-batches; the optimizer step and host overheads are per step and grow with
   accumulation; of the communication only what no compute hides counts: the collectives of window "none"
   (tensor parallelism without overlap, expert and all-to-all context parallelism, 1F1B's sends, DeepSpeed's
   gather after the step) and the `unhidden` part of the others, which comm.exposed leaves exposed whatever the
   compute (their bytes grow with the tokens or do not read them); the rest (>= 0) is dropped.
Dollars are hours x GPUs x price. A factor 1 - 1e-6 covers floating-point rounding in all of these.

Not used, because this estimator breaks them: memory monotone in the GPU count (DDP's gradient buckets double
the gradients from 2 GPUs on; ZeRO-3 gathers (1 - 1/n) of a block), in the ZeRO stage (ZeRO-2/3 add a
reduce-scatter bucket that can outweigh the sharded gradients of a LoRA run), in checkpointing (it holds on the
models tried, but the recomputed block and PEFT's merged expert stack make it a property of the model, not
of the code), and dominance between mixes (no mix is both slower and larger than another for every model).
One memory model per mix and count is cheap enough; tests/plan/test_bounds.py checks the rules above.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..estimate.compute import Op, cached_ops, compute_mix, micro_batch_ops, recomputed
from ..estimate.efficiency import Efficiency
from ..estimate.layout import layout
from ..estimate.memory import trainable_params
from ..estimate.time import Rates, micro_batch_times, rates, step_parts_and_transfers
from ..spec.scenario import Scenario, fast_replace
from .layouts import replicas
from .memory_probe import SAFETY, MemoryProbe, StateFloor  # noqa: F401 (rule 1's, re-exported)

LARGE = 4096
"""Sequences per micro-batch at which per-sequence slopes are read: weight-sized terms are spread thin there,
and the experts a micro-batch touches are all of them."""


@dataclass(frozen=True)
class SequenceWork:
    """One op's work per added sequence as a function of the padded length s: c1 x s + c2 x s^2 FLOPs and
    bytes (projections and experts grow with the tokens, attention scores with tokens x length)."""

    kind: str
    grouped: bool
    fp8: bool
    fusible: bool
    """Fusible elementwise op: its time is its bytes (x torch.compile's share), its FLOPs do not count."""
    flops: tuple[float, float]
    bytes: tuple[float, float]
    passes: float
    """forward + backward multiple + recompute."""


def _slopes(scn: Scenario, seq: float, batch: int = LARGE) -> list[tuple[Op, float, float]]:
    """(op, FLOPs, bytes) one more sequence adds at `batch` sequences of length `seq`."""
    one, two = micro_batch_ops(scn, batch, seq), micro_batch_ops(scn, 2 * batch, seq)
    if len(one) != len(two) or any(a.kind != b.kind or a.layer != b.layer for a, b in zip(one, two)):
        raise ValueError("op lists differ between micro-batches")
    return [(a, (b.flops - a.flops) / batch, (b.bytes - a.bytes) / batch) for a, b in zip(one, two)]


def _fit(v1: float, v2: float, v3: float, seq: float) -> tuple[float, float] | None:
    """(c1, c2) with v = c1 s + c2 s^2 at s = seq, 2 seq (checked at 3 seq); None when that is not the form."""
    quad = (v2 - 2.0 * v1) / (2.0 * seq * seq)
    lin = (v1 - quad * seq * seq) / seq
    if abs(quad) <= 1e-12 * abs(lin):
        quad = 0.0
    if lin < 0 or quad < 0 or abs(lin * 3 * seq + quad * 9 * seq * seq - v3) > 1e-9 * max(abs(v3), 1.0):
        return None
    return lin, quad


def _at_least_linear(scn: Scenario, seq: float, slopes: list[tuple[Op, float, float]]) -> list[tuple[bool, bool]]:
    """Per op: do its FLOPs and bytes at 1, 2 and 16 sequences reach the per-sequence slope times the
    sequences (what the bound assumes: constants and expert-weight reads only add)?"""
    ok = [[True, True] for _ in slopes]
    for batch in (1, 2, 16):
        # one sequence's ops through the shared cache: the classification's micro_batch_seconds_per_gpu reads the
        # same list next (the ops depend on the batch shape alone, not on the padding: compute.cached_ops)
        ops = cached_ops(scn, batch, seq) if batch == 1 else micro_batch_ops(scn, batch, seq)
        for i, op in enumerate(ops):
            _, f, b = slopes[i]
            ok[i][0] &= op.flops >= batch * f * (1 - 1e-9)
            ok[i][1] &= op.bytes >= batch * b * (1 - 1e-9)
    return [(f, b) for f, b in ok]


def ops_mix(mix):
    """The mix with the fields micro_batch_ops does not read at one value (compute_mix's, checkpointing, which
    only `recomputed` reads, and the fused attention kernel: the ops know fused from eager only), so that
    sequence_work fits each distinct op list once (tests/plan/test_bounds.py)."""
    return fast_replace(compute_mix(mix), gradient_checkpointing=False, checkpointing="full", checkpoint_every=1,
                        attention="eager" if mix.attention == "eager" else "sdpa")


def _at(v: float, seq: float) -> tuple[float, float] | None:
    """(c1, 0) with c1 x seq = v: the work at the one length `seq` (None when negative)."""
    return (v / seq, 0.0) if v >= 0 else None


def op_slopes(scn: Scenario, seq: float, one_length: bool = False
              ) -> list[tuple[Op, tuple[float, float], tuple[float, float]]]:
    """Per op but dispatch and dequantization: (op, FLOPs fit, bytes fit) of sequence_work, before the passes.
    `one_length`: the work at `seq` alone (two op lists instead of six; see sequence_work)."""
    try:
        points = [_slopes(scn, seq * m) for m in ((1.0,) if one_length else (1.0, 2.0, 3.0))]
    except ValueError:
        return []
    checks = _at_least_linear(scn, seq, points[0])
    out = []
    for (op, f1, b1), *more, (f_ok, b_ok) in zip(*points, checks):
        if op.kind in ("dispatch", "dequant"):
            continue
        if one_length:
            flops, bytes_ = (_at(f1, seq) if f_ok else None), (_at(b1, seq) if b_ok else None)
        else:
            (_, f2, b2), (_, f3, b3) = more
            flops = _fit(f1, f2, f3, seq) if f_ok else None
            bytes_ = _fit(b1, b2, b3, seq) if b_ok else None
        out.append((op, flops or (0.0, 0.0), bytes_ or (0.0, 0.0)))
    return out


def sequence_work(scn: Scenario, seq: float, memo: dict | None = None, one_length: bool = False) -> list[SequenceWork]:
    """Per op (launch-bound dispatch and weight-bound dequantization left out), the FLOPs and bytes one more
    sequence adds as functions of the padded length, read at `seq`, 2 and 3 x `seq`; an op that does not have
    that form, or whose small micro-batches fall below it, contributes nothing (the bound stays valid).
    `one_length`: the work is read only at `seq` (a workload whose every micro-batch pads to one length, such as a
    packed one), so it is the slope at `seq` alone, written c1 x s with c1 = slope / seq: valid at s = seq only,
    from two op lists instead of six (tests/plan/test_bounds.py checks it against the fit there).
    `memo`: a dict shared by calls on one model, workload and cluster, whose mixes differ (the fits are kept per
    ops_mix; the passes are the mix's own)."""
    if memo is None:
        slopes = op_slopes(scn, seq, one_length)
    else:
        key = (ops_mix(scn.mix), seq, one_length)
        slopes = memo.get(key)
        if slopes is None:
            slopes = memo[key] = _staged_slopes(fast_replace(scn, mix=key[0]), seq, one_length, memo)
        mix = scn.mix  # the passes read these of the mix (compute.recomputed): one list per value
        passes = (key, mix.gradient_checkpointing, mix.checkpointing, mix.checkpoint_every)
        work = memo.get(passes)
        if work is None:
            work = memo[passes] = _work(slopes, mix)
        return work
    return _work(slopes, scn.mix)


def _work(slopes: list[tuple[Op, tuple[float, float], tuple[float, float]]], mix) -> list[SequenceWork]:
    return [SequenceWork(op.kind, op.grouped, op.fp8, op.fusible, flops, bytes_,
                         1.0 + op.backward + recomputed(op, mix)) for op, flops, bytes_ in slopes]


def _staged_slopes(scn: Scenario, seq: float, one_length: bool, memo: dict
                   ) -> list[tuple[Op, tuple[float, float], tuple[float, float]]]:
    """op_slopes of an ops_mix scenario; with a pipeline, those of the same mix without it (kept in `memo`), a
    block op's work times 1 / stages: micro_batch_ops gives each stage its share of the blocks (count / pp of each
    layer group) and the head to every one, and reads the stages nowhere else (tests/plan/test_bounds.py checks
    the scaled fits against fresh ones; a few ulps apart, inside SAFETY)."""
    pp = scn.mix.pipeline_parallel
    if pp == 1:
        return op_slopes(scn, seq, one_length)
    flat = fast_replace(scn.mix, pipeline_parallel=1)
    key = (flat, seq, one_length)
    slopes = memo.get(key)
    if slopes is None:
        slopes = memo[key] = op_slopes(fast_replace(scn, mix=flat), seq, one_length)
    share = 1.0 / pp
    return [(op, f, b) if op.head else (op, (f[0] * share, f[1] * share), (b[0] * share, b[1] * share))
            for op, f, b in slopes]


def _best_rate(w: SequenceWork, r: Rates) -> float:
    """The highest FLOP/s op_time gives an op of this kind (GEMM utilization and the attention length factor
    are at most 1); 0 when its FLOPs do not count."""
    if w.fusible:
        return 0.0
    if w.kind == "matmul":
        return (r.fp8_gemm if w.fp8 else r.gemm) * (r.grouped if w.grouped else 1.0)
    if w.kind == "attention":
        return r.attention or r.gemm   # eager attention runs batched GEMMs
    return r.gemm * 0.1


def op_rates(work: list[SequenceWork], scn: Scenario, eff: Efficiency) -> list[tuple[float, float, float, float]]:
    """Per op, seconds per sequence of length s on scn's GPU: at least max(a s + b s^2, c s + d s^2), compute
    at the highest rate its kind reaches and bytes at the streaming bandwidth (a fusible op's at torch.compile's
    share), times its passes."""
    r = rates(scn, eff)
    out = []
    for w in work:
        rate = _best_rate(w, r)
        f = (w.flops[0] * w.passes / rate, w.flops[1] * w.passes / rate) if rate > 0 else (0.0, 0.0)
        stream = r.stream / (r.compile_bytes if w.fusible else 1.0)
        b = (w.bytes[0] * w.passes / stream, w.bytes[1] * w.passes / stream) if stream > 0 else (0.0, 0.0)
        out.append((f[0] * SAFETY, f[1] * SAFETY, b[0] * SAFETY, b[1] * SAFETY))
    return out


def op_rates_per_gpu(np, work: list[SequenceWork], scns: list[Scenario], effs: list[Efficiency],
                     each: list[Rates] | None = None, memo: dict | None = None):
    """op_rates on several GPUs at once: an array GPUs x ops x (a, b, c, d), the same numbers (the same float
    operations, each op's rate looked up per GPU from the few its kind and dtype give). `each`: their rates;
    `memo`: a dict shared by calls with the same `each` objects, keeping the rate table per op classes and rates, and
    each work list's classes and arrays (signatures that differ only in their rates share one: sdpa and flash)."""
    parts = None if memo is None else memo.get(("work", id(work)))
    if parts is None or parts[0] is not work:
        kinds: dict = {}  # op class -> column of the rate table
        cls = [kinds.setdefault((w.fusible, w.kind, w.fp8, w.grouped), len(kinds)) for w in work]
        flops = np.array([[w.flops[0] * w.passes, w.flops[1] * w.passes] for w in work]).reshape(len(work), 2)
        bytes_ = np.array([[w.bytes[0] * w.passes, w.bytes[1] * w.passes] for w in work]).reshape(len(work), 2)
        parts = (work, kinds, cls, flops, bytes_, [1 if w.fusible else 0 for w in work])  # work kept: no id reuse
        if memo is not None:
            memo[("work", id(work))] = parts
    return _rated_ops(np, parts[1:], scns, effs, each, memo)


def _rated_ops(np, parts: tuple, scns: list[Scenario], effs: list[Efficiency], each: list[Rates] | None,
               memo: dict | None):
    """op_rates_per_gpu of a work list's (op classes, class per op, FLOPs and bytes x passes, stream column per op)."""
    kinds, cls, flops, bytes_, stream_of = parts
    rate, stream = rate_table(np, kinds, scns, effs, each, memo)
    op_rate = rate[:, cls][:, :, None]  # GPUs x ops x 1
    op_stream = stream[:, stream_of][:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(op_rate > 0, flops[None] / op_rate, 0.0)
        b = np.where(op_stream > 0, bytes_[None] / op_stream, 0.0)
    return np.concatenate([f, b], axis=2) * SAFETY


def rate_table(np, kinds: dict, scns: list[Scenario], effs: list[Efficiency], each: list[Rates] | None,
               memo: dict | None):
    """Per GPU: the best FLOP/s of each op class (`kinds`: class -> column) and the stream bandwidth, plain and
    fusible; kept in `memo` per classes and rates."""
    key = None if memo is None or each is None else (tuple(kinds), id(each))
    hit = None if key is None else memo.get(key)
    if hit is None or hit[0] is not each:
        rate, stream = np.zeros((len(effs), len(kinds))), np.zeros((len(effs), 2))
        for g, eff in enumerate(effs):  # with `each`, scns may be the first alone
            r = rates(scns[g], eff) if each is None else each[g]
            for (fusible, kind, fp8, grouped), c in kinds.items():
                rate[g, c] = _best_rate(SequenceWork(kind, grouped, fp8, fusible, (0.0, 0.0), (0.0, 0.0), 0.0), r)
            stream[g] = r.stream / 1.0, r.stream / r.compile_bytes
        hit = (each, rate, stream)  # the rates stay alive with their key: no id is reused
        if key is not None:
            memo[key] = hit
    return hit[1], hit[2]


def seconds_per_sequence(np, rates, seq):
    """Lower bound on one sequence's forward + backward + recompute seconds: rates[block, op] = (a, b, c, d) of
    op_rates, seq[block, candidate] the padded length; sum over ops of max(a s + b s^2, c s + d s^2)."""
    s = seq[:, None, :]
    a, b, c, d = (rates[:, :, i, None] for i in range(4))
    return np.maximum(a * s + b * s * s, c * s + d * s * s).sum(axis=1)


def shortest_sequence(scn: Scenario) -> float:
    """The shortest padded length any micro-batch computes on (mean_padded_len never goes below it)."""
    wl = scn.workload
    return min(wl.mean_padded_len(1), wl.mean_tokens_per_sample())


def micro_batch_seconds(scn: Scenario, batch: int, length: float, eff: Efficiency) -> float:
    """GPU seconds of one micro-batch's forward, backward, recompute and dequantization at a fixed padded length,
    from the estimator's own step time (divided by the micro-batches it runs: the accumulation, plus a pipeline's
    bubble, which a candidate with more accumulation spreads thinner)."""
    runs = scn.workload.gradient_accumulation + layout(scn).bubble
    fixed = scn.with_(padding="max_length", seq_len=max(1, math.floor(length)))
    (mb, _, _), _, _ = micro_batch_times(fixed, batch, eff)
    parts = {k: v * runs for k, v in mb.items()}  # step_time's own parts (the same runs), without its other terms
    return (parts["forward"] + parts["backward"] + parts["recompute"] + parts["dequant"]) / runs


REFINE_SPAN = 16
"""Widest micro-batch range refined_hours evaluates one by one; a wider one gets no sharper bound."""


def refined_hours(scn: Scenario, batch_low: int, batch_high: int, global_batch: int | None,
                  eff: Efficiency) -> float:
    """A tighter lower bound on a candidate's hours, from the estimator's own step time at each micro-batch it
    may run and the shortest length it may pad to (0 when the range is wider than REFINE_SPAN). Exact because
    a micro-batch's compute never shrinks with the length (GEMM time is a non-decreasing step in the rows, see
    kernels.gemm_utilization); the optimizer step and host overheads are per step; of the communication only what
    no compute hides counts (rule 4).
    Per sequence, compute may grow with the micro-batch (a partly filled last tile), hence one per batch."""
    if batch_high - batch_low > REFINE_SPAN:
        return 0.0
    wl, world = scn.workload, replicas(scn)  # a model-parallel group runs one micro-batch
    length = max(1, math.floor(max(wl.mean_padded_len(batch_low), shortest_sequence(scn))))
    sequences = wl.samples_per_epoch() * wl.epochs / wl.samples_per_sequence()
    trainable = trainable_params(scn)
    best = math.inf
    for batch in range(max(batch_low, 1), batch_high + 1):
        if global_batch is None:
            ga = wl.gradient_accumulation
            sequences_per_step = batch * ga * world
        else:  # recommend's accumulation: ceil(global / (micro-batch x GPUs)), so a step covers < global + b x GPUs
            ga = max(1, math.ceil(global_batch / (batch * world)))
            sequences_per_step = global_batch + batch * world
        fixed = scn.with_(padding="max_length", seq_len=length, gradient_accumulation=ga)
        # step_time.breakdown_s without its other figures, and the step's collectives (those of
        # collectives(fixed, eff, trainable, batch, mean_padded_len(batch), layout(fixed)), read once)
        parts, *_, transfers = step_parts_and_transfers(fixed, batch, eff, trainable)
        compute = parts["forward"] + parts["backward"] + parts["recompute"] + parts["dequant"]
        exposed = sum(t.seconds if t.window == "none" else min(t.unhidden, t.seconds) for t in transfers)
        seconds = sequences / world * compute / (ga * batch) + sequences / sequences_per_step * (
            parts["optimizer"] + parts["other"] + exposed)
        best = min(best, seconds)
    return best / 3600.0 * SAFETY


def hours_per_gpu_second(scn: Scenario) -> float:
    """Hours of a run per GPU-second of per-sequence compute, before dividing by the data-parallel replicas (each
    GPU of a model-parallel group computes its share of every sequence its group runs)."""
    wl = scn.workload
    return wl.samples_per_epoch() * wl.epochs / (wl.samples_per_sequence() * 3600.0) * SAFETY
