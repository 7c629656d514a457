"""Step time: roofline per op with shape-aware efficiency, host-bound launches, pipeline bubble, optimizer,
collectives (exposed and hidden), host overhead.

For every op on the GPU: time = max(FLOPs / (peak x fraction x shape utilization), bytes / (bandwidth x
efficiency)) + kernels x floor. Each pass (forward, backward, recompute) takes the longer of its GPU time and the
host's time to launch its kernels (eager PyTorch issues each kernel from Python). One optimizer step =
gradient_accumulation micro-batches (plus the pipeline bubble) + the optimizer + the communication compute could
not hide + host overhead. All GPUs run in lock-step.
"""
from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Sequence

from ..spec.scenario import Scenario, fast_replace
from .comm import collectives, exposed, gather_passes
from .compute import Op, cached_ops, compute_mix, model_flops, recomputed
from .cost import price_of, run_cost
from .efficiency import Calibration, Efficiency, load_calibration
from .kernels import attention_fraction, gemm_fraction, gemm_utilization
from .layout import Layout, layout
from .result import Estimate, TimeEstimate
from .shared import Shared
from .weight_memory import gathered_weight_bytes

ADAM_BYTES_PER_PARAM = {"adamw": 84.0, "adamw_8bit": 24.0, "paged_adamw_8bit": 24.0, "sgd": 16.0}
"""Optimizer-step memory traffic per parameter with fp32 state: foreach AdamW reads and writes params,
grads and both moments in about 21 passes of 4 bytes; 8-bit states cut most of that."""
OPTIMIZER_KERNELS = 40
"""Kernel launches of a foreach (multi-tensor) optimizer step."""
PASSES = ("forward", "backward", "recompute")
_PASS_CACHE: dict[tuple, tuple] = {}
"""pass_times by (model, compute_mix(mix), batch shape, rates): a plan evaluates the same GPU at 1, 2, 4, 8 of them."""


@dataclass(frozen=True)
class Rates:
    """What one GPU offers this scenario's ops, with the efficiencies folded in (built once per step estimate)."""

    peak: float
    """Dense tensor FLOP/s in the run's matmul dtype."""
    fp8_peak: float
    gemm: float
    """FLOP/s of a large GEMM: peak x the architecture's fraction."""
    fp8_gemm: float
    attention: float
    """FLOP/s of fused attention at long sequences (0 for eager: its matmuls are GEMMs)."""
    seq_half: float
    stream: float
    """Bytes/s of streaming kernels."""
    dequant: float
    floor: float
    """Seconds per kernel on the GPU."""
    host: float
    """Seconds per kernel launch on the host."""
    sync: float
    sms: int
    k_half: float
    grouped: float
    compile_bytes: float
    """Factors on fusible ops' bytes and kernels (1 without torch.compile)."""
    compile_kernels: float


def rates(scn: Scenario, eff: Efficiency) -> Rates:
    return gpu_rates(scn.cluster.gpu, scn.mix, eff)


def gpu_rates(gpu, mix, eff: Efficiency) -> Rates:
    """rates() of a scenario on this GPU type with this mix: all it reads of the scenario."""
    peak = gpu.matmul_tflops(mix.precision) * 1e12
    fp8 = (gpu.fp8_tflops or 0.0) * 1e12 or peak
    frac = gemm_fraction(eff, gpu.architecture)
    att = 0.0 if mix.attention == "eager" else peak * attention_fraction(eff, mix.attention, gpu.architecture, 1e18)
    bw = gpu.memory_bandwidth_gbs * 1e9
    compiled = mix.compile
    return Rates(peak, fp8, peak * frac, fp8 * frac * eff.fp8_gemm, att, eff.attention_seq_half, bw * eff.bandwidth,
                 bw * eff.dequant_bandwidth, eff.kernel_floor_us * 1e-6, eff.host_us_per_kernel * 1e-6,
                 eff.sync_us * 1e-6, gpu.sm_count, eff.gemm_k_half, eff.grouped_matmul,
                 eff.compile_stream_bytes if compiled else 1.0, eff.compile_kernels if compiled else 1.0)


def shared_rates(gpu, mix, eff: Efficiency) -> Rates:
    """gpu_rates, one object per GPU type, efficiency and the fields of the mix it reads (RATE_FIELDS): the sweeps of
    a plan's mixes share them (a process plans many mixes on the same GPU types)."""
    key = (id(gpu), id(eff), _rate_fields(mix))
    hit = _RATES.get(key)
    if hit is None or hit[0] is not gpu or hit[1] is not eff:
        if len(_RATES) >= 4096:
            _RATES.clear()
        hit = _RATES[key] = (gpu, eff, gpu_rates(gpu, mix, eff))
    return hit[2]


RATE_FIELDS = ("precision", "attention", "compile")
"""The mix fields gpu_rates reads (shared_rates' key; tests/estimate/test_time.py checks the others change nothing)."""
_rate_fields = attrgetter(*RATE_FIELDS)
_RATES: dict[tuple, tuple] = {}
"""shared_rates by (GPU id, efficiency id, RATE_FIELDS): (GPU, efficiency, rates), the first two kept alive with
their ids."""


def op_time(op: Op, r: Rates) -> float:
    """GPU seconds of one op's forward (0 for the eager loop's synchronizations: see pass_times)."""
    kind = op.kind
    if kind == "dispatch":
        return 0.0
    if kind == "dequant":
        return op.bytes / r.dequant + op.kernels * r.floor
    if op.fusible:
        return op.bytes * r.compile_bytes / r.stream + op.kernels * r.compile_kernels * r.floor
    mem_t = op.bytes / r.stream
    floor = op.kernels * r.floor
    if kind == "matmul":
        util = gemm_utilization(max(op.rows, 1.0), op.n, op.k, r.sms, op.groups, r.k_half)
        rate = (r.fp8_gemm if op.fp8 else r.gemm) * util * (r.grouped if op.grouped else 1.0)
        return max(op.flops / rate, mem_t) + floor
    if kind == "attention":
        if not r.attention:   # eager: batched GEMMs over s x s scores
            s = int(op.seq) or 1
            return max(op.flops / (r.gemm * gemm_utilization(s, s, op.k, r.sms, 1, r.k_half)), mem_t) + floor
        return max(op.flops * (op.seq + r.seq_half) / (r.attention * op.seq), mem_t) + floor
    return (max(op.flops / (r.gemm * 0.1), mem_t) if op.flops else mem_t) + floor


def pass_times(ops: Sequence[Op], scn: Scenario, eff: Efficiency,
               r: Rates | None = None) -> tuple[dict[str, float], dict[str, float], float]:
    """(seconds per breakdown part, seconds per layer, attention seconds) of one micro-batch: each pass is as
    long as the longer of its GPU work and its kernel launches, plus the GPU's idle time around host
    synchronizations; dequantization is reported apart, inside the pass that runs it."""
    r = r or rates(scn, eff)
    mix = scn.mix
    ckpt = mix.gradient_checkpointing
    # per pass (forward, backward, recompute): GPU seconds, kernels, dequantization seconds, sync seconds; kept in
    # locals, not lists (a plan times every new micro-batch on every GPU type): the same sums in the same order
    g0 = g1 = g2 = k0 = k1 = k2 = d0 = d1 = d2 = s0 = s2 = 0.0
    layers: dict[str, list[float]] = {}
    attention = 0.0
    sync, compiled = r.sync, r.compile_kernels
    for op in ops:
        kind = op.kind
        rec = recomputed(op, mix) if ckpt else 0.0
        if kind == "dispatch":   # syncs in forward and recompute (backward replays known indices)
            t = op.kernels * sync
            s0 += t
            s2 += t * rec
            acc = layers.setdefault(op.layer, [0.0, 0.0, 0.0, 0.0])
            acc[3] += t * (1 + rec)
            continue
        t = op_time(op, r)
        k = op.kernels * (compiled if op.fusible else 1.0)
        back = 1.0 if kind == "dequant" else op.backward
        tb, tr = t * back, t * rec
        g0 += t
        g1 += tb
        g2 += tr
        k0 += k
        k1 += k * back
        k2 += k * rec
        if kind == "dequant":
            d0 += t
            d1 += tb
            d2 += tr
        elif kind == "attention":
            attention += t * (1 + back)
        acc = layers.setdefault(op.layer, [0.0, 0.0, 0.0, 0.0])
        acc[0] += t
        acc[1] += tb
        acc[2] += tr
    gpu, kern, deq, syncs = (g0, g1, g2), (k0, k1, k2), (d0, d1, d2), (s0, 0.0, s2)
    scale = [max(kern[i] * r.host / gpu[i], 1.0) if gpu[i] > 0 else 1.0 for i in range(3)]  # host-bound passes stretch
    parts = {p: (gpu[i] - deq[i]) * scale[i] + syncs[i] for i, p in enumerate(PASSES)}
    parts["dequant"] = sum(deq[i] * scale[i] for i in range(3))
    by_layer = {name: v[0] * scale[0] + v[1] * scale[1] + v[2] * scale[2] + v[3] for name, v in layers.items()}
    return parts, by_layer, attention


def optimizer_s(scn: Scenario, eff: Efficiency, trainable: int, lay: Layout | None = None) -> float:
    """The optimizer step on this GPU's shard (ZeRO-1+ and FSDP shard it over data-parallel ranks), or on the
    CPU with the transfers when offloaded."""
    gpu, mix = scn.cluster.gpu, scn.mix
    lay = lay or layout(scn)
    bw = gpu.memory_bandwidth_gbs * 1e9
    shard = trainable / (lay.tp * lay.pp) / (lay.dp if mix.shard_stage >= 1 else 1)
    state_scale = 0.5 if (mix.precision == "bf16" and mix.optimizer == "adamw") else 1.0
    if mix.offload != "none":
        transfer = shard * (2.0 + 2.0) / (gpu.host_link_gbs * 1e9 * eff.communication)
        t = shard / eff.cpu_adam_params_per_s + transfer
    else:
        t = (shard * ADAM_BYTES_PER_PARAM[mix.optimizer] * state_scale / (bw * eff.bandwidth)
             + OPTIMIZER_KERNELS * max(eff.kernel_floor_us, eff.host_us_per_kernel) * 1e-6)
    if mix.offload == "optimizer+params":  # each gather first copies the rank's shard from the host
        w = gathered_weight_bytes(scn) / scn.cluster.world_size
        t += w * gather_passes(scn) * scn.workload.gradient_accumulation / (gpu.host_link_gbs * 1e9 * eff.communication)
    return t


def _activation_offload_s(scn: Scenario, batch: int, seq: float, eff: Efficiency) -> float:
    """Seconds per micro-batch to copy saved activations to the host and back (hidden behind compute)."""
    from .memory import memory_model
    saved, _ = memory_model(scn).activation_bytes(batch, seq)
    return 2.0 * saved / (scn.cluster.gpu.host_link_gbs * 1e9 * eff.communication)


def micro_batch_times(scn: Scenario, batch: int, eff: Efficiency, ops: Sequence[Op] | None = None,
                      shared: Shared | None = None):
    """(pass_times of one `batch`-sequence micro-batch, its mean padded length, the GPU's rates): what step_time
    builds a step from, cached by model, mix, batch shape and rates unless `ops` are given; `shared` (a sweep's
    memo that covers `scn`) keeps them per GPU type, efficiency and batch."""
    if shared is not None and ops is None:
        return shared.per_gpu(("micro", batch, id(eff)), scn, lambda: _micro_batch_times(scn, batch, eff, None, shared),
                              eff)
    return _micro_batch_times(scn, batch, eff, ops, None)


def _micro_batch_times(scn: Scenario, batch: int, eff: Efficiency, ops: Sequence[Op] | None, shared: Shared | None):
    if shared is not None:  # a micro-batch's padded length and ops do not depend on the GPU
        seq = shared.get(("padded", batch), lambda: scn.workload.mean_padded_len(batch))
        ops = shared.get(("ops", batch), lambda: cached_ops(scn, batch, seq))
        r = shared_rates(scn.cluster.gpu, scn.mix, eff)
        given = None
    else:
        seq = scn.workload.mean_padded_len(batch)
        given = ops
        ops = ops if ops is not None else cached_ops(scn, batch, seq)
        r = rates(scn, eff)
    key = (scn.model, compute_mix(scn.mix), batch, seq, r)
    cached = _PASS_CACHE.get(key) if given is None else None
    if cached is None:
        cached = pass_times(ops, scn, eff, r)
        if given is None:
            if len(_PASS_CACHE) >= 4096:
                _PASS_CACHE.clear()
            _PASS_CACHE[key] = cached
    return cached, seq, r


def step_time(scn: Scenario, batch: int, eff: Efficiency, trainable: int, ops: Sequence[Op] | None = None,
              shared: Shared | None = None) -> TimeEstimate:
    """One optimizer step of `batch`-sequence micro-batches (`ops`: its micro_batch_ops, when already known;
    `shared`: a sweep's memo that covers `scn`)."""
    parts, mb_layers, runs, hidden, lay, seq, r = step_parts(scn, batch, eff, trainable, ops, shared)
    wl, mix = scn.workload, scn.mix
    ga = wl.gradient_accumulation
    by_layer = {k: v * runs for k, v in mb_layers.items()}
    step = sum(parts.values())
    world = scn.cluster.world_size
    replicas = lay.dp
    samples = batch * ga * replicas * wl.samples_per_sequence()
    tokens = samples * wl.mean_tokens_per_sample() if wl.padding != "packed" else batch * ga * replicas * wl.peak_seq_len()
    flops = (shared.get(("flops", batch, seq), lambda: model_flops(scn, batch * seq * ga, seq)) if shared is not None
             else model_flops(scn, batch * seq * ga, seq))
    useful = flops * replicas
    mfu = useful / (step * world * (r.fp8_peak if mix.fp8 else r.peak))
    return TimeEstimate(step_s=step, tokens_per_s=tokens / step, samples_per_s=samples / step, mfu=mfu,
                        breakdown_s=parts, by_layer_s=by_layer, communication_hidden_s=hidden)


def step_parts(scn: Scenario, batch: int, eff: Efficiency, trainable: int, ops: Sequence[Op] | None = None,
               shared: Shared | None = None):
    """(seconds per breakdown part of one step, in breakdown_s's order: their sum is the step; one micro-batch's
    seconds per layer; micro-batch runs per step, bubble included; hidden communication seconds; the layout; the
    mean padded length; the GPU's rates): step_time's work before its result (plan/search.py ranks on the sum)."""
    return step_parts_and_transfers(scn, batch, eff, trainable, ops, shared)[:-1]


def step_parts_and_transfers(scn: Scenario, batch: int, eff: Efficiency, trainable: int,
                             ops: Sequence[Op] | None = None, shared: Shared | None = None):
    """step_parts, and the step's collectives (comm.collectives, which it reads): plan/bounds.refined_hours reads
    both, and made the collectives a second time."""
    wl, mix = scn.workload, scn.mix
    lay = shared.per_cluster("layout", scn, lambda: layout(scn)) if shared is not None else layout(scn)
    (mb, mb_layers, att), seq, r = micro_batch_times(scn, batch, eff, ops, shared)
    ga = wl.gradient_accumulation
    runs = ga + lay.bubble   # micro-batches, plus the pipeline's idle time in micro-batch units
    parts = {k: v * runs for k, v in mb.items()}
    parts["optimizer"] = optimizer_s(scn, eff, trainable, lay)
    compute_mb = mb["forward"] + mb["backward"] + mb["recompute"] + mb["dequant"]
    windows = {"fwd_bwd": compute_mb * ga, "bwd": mb["backward"] * ga, "last_bwd": mb["backward"],
               "attention": att * ga}
    transfers = collectives(scn, eff, trainable, batch, seq, lay)
    comm, hidden = exposed(transfers, windows, eff, host_staged=not scn.cluster.gpu.peer_to_peer)
    if mix.activation_offload:
        copy = _activation_offload_s(scn, batch, seq, eff) * ga
        comm += max(copy - eff.comm_overlap * compute_mb * ga, 0.0)
        hidden += min(copy, eff.comm_overlap * compute_mb * ga)
    parts["communication"] = comm
    parts["other"] = eff.step_overhead_s + eff.microbatch_overhead_s * ga
    return parts, mb_layers, runs, hidden, lay, seq, r, transfers


def communication_s(scn: Scenario, eff: Efficiency, trainable: int) -> tuple[float, float]:
    """(collective seconds per step that can overlap compute, seconds that cannot), at one token per micro-batch."""
    ts = collectives(scn, eff, trainable)
    return sum(t.seconds for t in ts if t.window != "none"), sum(t.seconds for t in ts if t.window == "none")


def attach_time(est: Estimate, calibration: Calibration | str | None = None, shared: Shared | None = None) -> Estimate:
    """The estimate with its time and run cost filled in (left empty when nothing fits). `shared`: a sweep's
    memo (estimate/shared.py) that covers the estimate's scenario."""
    if est.reason is not None and not est.fits and est.max_micro_batch_size == 0 and est.scenario.workload.solve_batch:
        return est
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    scn = est.scenario
    eff, calibrated = cal.for_gpu(scn.cluster.gpu.key)
    t = step_time(scn, est.micro_batch_size, eff, est.model_memory.trainable_params, shared=shared)
    t = fast_replace(t, calibrated=calibrated)  # plain frozen dataclasses: copied without re-running __init__
    price = shared.per_gpu("price", scn, lambda: price_of(scn)) if shared is not None else None
    return fast_replace(est, time=t, run=run_cost(scn, t, est.micro_batch_size, price))
