"""Step time: roofline per op, efficiency curves, launch floors, optimizer, collectives, host overhead.

For every op: time = max(FLOPs / (peak x efficiency(rows)), bytes / (bandwidth x efficiency)) + kernels x floor.
One optimizer step = gradient_accumulation micro-batches (forward + backward [+ recompute]) + the optimizer
+ the communication that backward could not hide + host overhead. All GPUs run in lock-step.
"""
from __future__ import annotations

from dataclasses import replace

from ..spec.scenario import Scenario
from .compute import Op, micro_batch_ops, model_flops
from .cost import run_cost
from .efficiency import Calibration, Efficiency, load_calibration
from .result import Estimate, TimeEstimate

ADAM_BYTES_PER_PARAM = {"adamw": 84.0, "adamw_8bit": 24.0, "paged_adamw_8bit": 24.0, "sgd": 16.0}
"""Optimizer-step memory traffic per parameter with fp32 state: foreach AdamW reads and writes params,
grads and both moments in about 21 passes of 4 bytes; 8-bit states cut most of that."""


def _op_time(op: Op, eff: Efficiency, peak_flops: float, bandwidth: float) -> float:
    floor = op.kernels * eff.kernel_floor_us * 1e-6
    if op.kind == "dispatch":
        return op.kernels * eff.expert_dispatch_us * 1e-6
    if op.kind == "dequant":
        return op.bytes / (bandwidth * eff.dequant_bandwidth) + floor
    mem_t = op.bytes / (bandwidth * eff.bandwidth)
    if op.kind == "matmul":
        e = eff.matmul * op.rows / (op.rows + eff.matmul_half_rows)
        if op.grouped:
            e *= eff.grouped_matmul
        return max(op.flops / (peak_flops * e), mem_t) + floor
    if op.kind == "attention":
        return max(op.flops / (peak_flops * eff.attention), mem_t) + floor
    return max(op.flops / (peak_flops * eff.matmul * 0.1), mem_t) + floor if op.flops else mem_t + floor


def _ring(bytes_: float, n: int, gbs: float, eff: Efficiency, factor: float) -> float:
    """Ring collective time: factor x (n-1)/n x bytes over the link."""
    if n <= 1 or bytes_ <= 0:
        return 0.0
    return factor * (n - 1) / n * bytes_ / (gbs * 1e9 * eff.communication)


DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default gradient bucket


def _param_modules(scn: Scenario) -> int:
    """Modules holding parameters (linears, norms, LoRA A/B): what ZeRO-3 hooks fetch one by one."""
    m = scn.model
    lora = len(m.lora_targets(scn.mix.lora_targets)) if scn.mix.trains_lora else 0
    per_layer = sum(len(layer.linears) * n + 2 * n for layer, n in m.layer_groups)
    return per_layer + 2 * lora + 3


def communication_s(scn: Scenario, eff: Efficiency, trainable: int) -> tuple[float, float]:
    """(collective seconds per step that can overlap compute, seconds on the critical path)."""
    cl, mix, m = scn.cluster, scn.mix, scn.model
    n = cl.world_size
    if n <= 1:
        return 0.0, 0.0
    # the slowest link a ring crosses: the network when the job spans nodes
    gbs = min(cl.gpu.intra_node_gbs, cl.inter_node_gbs) if cl.nodes > 1 else cl.gpu.intra_node_gbs
    lat = eff.collective_latency_us * 1e-6
    g_bytes = trainable * (2.0 if mix.precision != "fp32" else 4.0)
    buckets = max(1.0, g_bytes / DDP_BUCKET_BYTES)
    stage = mix.shard_stage
    if stage == 0:
        return _ring(g_bytes, n, gbs, eff, 2.0) + buckets * lat, 0.0       # all-reduce of gradients
    # ZeRO-1 all-reduces gradients (each rank then updates its optimizer shard); ZeRO-2/3 reduce-scatter them
    overlap = _ring(g_bytes, n, gbs, eff, 2.0 if stage == 1 else 1.0) + buckets * lat
    exposed = _ring(trainable * 2.0, n, gbs, eff, 1.0) + buckets * lat     # all-gather of updated weights
    if stage == 3:
        from .memory import NF4_BYTES
        w_b = NF4_BYTES if mix.method == "qlora" else 2.0
        passes = (3.0 if mix.gradient_checkpointing else 2.0) * scn.workload.gradient_accumulation
        gathers = _ring(m.total_params * w_b, n, gbs, eff, passes)
        if mix.fsdp:  # FSDP2: one all-gather per block and pass
            units = sum(k for _, k in m.layer_groups) + 1
            overlap += gathers + units * passes * lat
        else:         # DeepSpeed ZeRO-3: a fetch/release hook per parameterised module, on the critical path
            modules = _param_modules(scn)
            overlap += gathers + modules * passes * lat
            exposed += modules * passes * eff.zero3_hook_us * 1e-6
    return overlap, exposed


def step_time(scn: Scenario, batch: int, eff: Efficiency, trainable: int) -> TimeEstimate:
    gpu, mix, wl = scn.cluster.gpu, scn.mix, scn.workload
    peak = gpu.matmul_tflops(mix.precision) * 1e12
    bw = gpu.memory_bandwidth_gbs * 1e9
    seq = wl.mean_padded_len(batch)
    ops = micro_batch_ops(scn, batch, seq)
    parts = {"forward": 0.0, "backward": 0.0, "recompute": 0.0, "optimizer": 0.0, "communication": 0.0,
             "dequant": 0.0, "other": 0.0}
    by_layer: dict[str, float] = {}
    for op in ops:
        t = _op_time(op, eff, peak, bw)
        if op.kind == "dequant":
            passes = 2.0 + (1.0 if mix.gradient_checkpointing and op.recompute else 0.0)
            parts["dequant"] += t * passes
            total = t * passes
        else:
            fwd, bwd = t, t * op.backward
            rec = t if (mix.gradient_checkpointing and op.recompute) else 0.0
            parts["forward"] += fwd
            parts["backward"] += bwd
            parts["recompute"] += rec
            total = fwd + bwd + rec
        by_layer[op.layer] = by_layer.get(op.layer, 0.0) + total
    ga = wl.gradient_accumulation
    for key in ("forward", "backward", "recompute", "dequant"):
        parts[key] *= ga
    by_layer = {k: v * ga for k, v in by_layer.items()}
    # optimizer step on this GPU's shard (ZeRO-1+ shard the optimizer) or on the CPU (offload)
    n_opt = scn.cluster.world_size if mix.shard_stage >= 1 else 1
    shard = trainable / n_opt
    state_scale = 0.5 if (mix.precision == "bf16" and mix.optimizer == "adamw") else 1.0
    if mix.offload != "none":
        transfer = shard * (2.0 + 2.0) / (gpu.host_link_gbs * 1e9 * eff.communication)
        parts["optimizer"] = shard / eff.cpu_adam_params_per_s + transfer
    else:
        parts["optimizer"] = shard * ADAM_BYTES_PER_PARAM[mix.optimizer] * state_scale / (bw * eff.bandwidth) + 40 * eff.kernel_floor_us * 1e-6
    if mix.offload == "optimizer+params":
        w = scn.model.total_params * 2.0 / scn.cluster.world_size
        parts["optimizer"] += w * (3.0 if mix.gradient_checkpointing else 2.0) * ga / (gpu.host_link_gbs * 1e9 * eff.communication)
    overlap, exposed = communication_s(scn, eff, trainable)
    # prefetching overlaps gathers with forward and recompute too, reduce-scatters with backward
    hidden = min(overlap, 0.8 * (parts["forward"] + parts["backward"] + parts["recompute"]))
    parts["communication"] = overlap - hidden + exposed
    parts["other"] = eff.step_overhead_s + eff.microbatch_overhead_s * ga
    step = sum(parts.values())
    world = scn.cluster.world_size
    samples = batch * ga * world * wl.samples_per_sequence()
    tokens = samples * wl.mean_tokens_per_sample() if wl.padding != "packed" else batch * ga * world * wl.peak_seq_len()
    useful = model_flops(scn, batch * seq * ga, seq) * world
    mfu = useful / (step * world * peak)
    return TimeEstimate(step_s=step, tokens_per_s=tokens / step, samples_per_s=samples / step, mfu=mfu,
                        breakdown_s=parts, by_layer_s=by_layer)


def attach_time(est: Estimate, calibration: Calibration | str | None = None) -> Estimate:
    """The estimate with its time and run cost filled in (left empty when nothing fits)."""
    if est.reason is not None and not est.fits and est.max_micro_batch_size == 0 and est.scenario.workload.solve_batch:
        return est
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    eff, calibrated = cal.for_gpu(est.scenario.cluster.gpu.key)
    t = step_time(est.scenario, est.micro_batch_size, eff, est.model_memory.trainable_params)
    t = replace(t, calibrated=calibrated)
    return replace(est, time=t, run=run_cost(est.scenario, t, est.micro_batch_size))
