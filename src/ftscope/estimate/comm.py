"""Collectives of one optimizer step per GPU, each with the compute window it can hide behind.

Data parallelism: DDP and ZeRO-1 all-reduce gradients once per step, during the last micro-batch's backward;
ZeRO-2/3 and FSDP reduce-scatter them every micro-batch; ZeRO-3 and FSDP full_shard all-gather the weights
for every forward, recompute and backward, prefetching the next block while one computes; DeepSpeed
all-gathers updated weights after the optimizer step (exposed). Model parallelism: tensor parallelism
all-reduces activations twice per block and pass (exposed unless overlapped), ring context parallelism passes
keys and values around while attention computes, all-to-all context parallelism (Ulysses) and expert
parallelism exchange tokens (exposed), pipeline stages send activations to their neighbours (behind the next
chunk's compute in the interleaved schedule, exposed in plain 1F1B).

A collective of B bytes over a ring of n GPUs moves (n-1)/n x B per GPU (all-gather, reduce-scatter) or twice
that (all-reduce) at the link bandwidth x the `communication` fraction.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..spec.scenario import Scenario
from .efficiency import Efficiency
from .layout import Layout, layout
from .weight_memory import gathered_weight_bytes

DDP_BUCKET_BYTES = 25 * 2**20
"""torch DDP's default gradient bucket (also about DeepSpeed's reduce bucket under HF's "auto")."""


@dataclass(frozen=True)
class Transfer:
    """Seconds of one kind of collective per step, and which compute can hide it."""

    seconds: float
    window: str
    """fwd_bwd (each micro-batch's forward, recompute and backward) | bwd (each micro-batch's backward) |
    last_bwd (the last micro-batch's backward) | attention (the attention kernels) | none (exposed)."""
    unhidden: float = 0.0
    """Part that no schedule hides (the first gather before any compute, the last bucket after it)."""


def ring_s(bytes_: float, n: int, gbs: float, eff: Efficiency, factor: float = 1.0) -> float:
    """Ring collective time: factor x (n-1)/n x bytes over a link of `gbs` GB/s."""
    if n <= 1 or bytes_ <= 0 or gbs <= 0:
        return 0.0
    return factor * (n - 1) / n * bytes_ / (gbs * 1e9 * eff.communication)


def _param_modules(scn: Scenario) -> int:
    """Modules holding parameters (linears, norms, LoRA A/B): what ZeRO-3 hooks fetch one by one."""
    m = scn.model
    lora = len(m.lora_targets(scn.mix.lora_targets)) if scn.mix.trains_lora else 0
    per_layer = sum(len(layer.linears) * n + 2 * n for layer, n in m.layer_groups)
    return per_layer + 2 * lora + 3


def data_parallel(scn: Scenario, eff: Efficiency, trainable: int, lay: Layout) -> list[Transfer]:
    """Gradient reduction and weight gathers over the data-parallel ranks, per step."""
    mix, m = scn.mix, scn.model
    n = lay.dp
    if n <= 1:
        return []
    ga = scn.workload.gradient_accumulation
    gbs = lay.dp_gbs
    lat = eff.collective_latency_us * 1e-6
    shard = lay.tp * lay.pp
    g_bytes = trainable / shard * (2.0 if mix.precision != "fp32" else 4.0)
    buckets = max(1.0, g_bytes / DDP_BUCKET_BYTES)
    last_bucket = ring_s(min(g_bytes, DDP_BUCKET_BYTES), n, gbs, eff, 2.0)
    stage = mix.shard_stage
    if stage <= 1:   # DDP / ZeRO-1: one all-reduce per step, behind the last backward
        out = [Transfer(ring_s(g_bytes, n, gbs, eff, 2.0) + buckets * lat, "last_bwd", last_bucket)]
        if stage == 1:
            out.append(Transfer(ring_s(trainable / shard * 2.0, n, gbs, eff) + buckets * lat, "none"))
        return out
    reduce = ga * (ring_s(g_bytes, n, gbs, eff) + buckets * lat)
    out = [Transfer(reduce, "bwd", ga * last_bucket / 2)]
    if stage == 2 and not mix.fsdp:
        out.append(Transfer(ring_s(trainable / shard * 2.0, n, gbs, eff) + buckets * lat, "none"))
    if stage == 2 and mix.fsdp:   # shard_grad_op gathers the weights once per step, in the first forward
        out.append(Transfer(ring_s(gathered_weight_bytes(scn) / shard, n, gbs, eff), "fwd_bwd"))
    if stage == 3:
        passes = gather_passes(scn)
        units = sum(k for _, k in m.layer_groups) / lay.pp + 1
        gathers = ga * passes * ring_s(gathered_weight_bytes(scn) / shard, n, gbs, eff)
        if mix.fsdp:   # FSDP: one all-gather per block and pass
            out.append(Transfer(gathers + ga * units * passes * lat, "fwd_bwd", gathers / units))
        else:          # DeepSpeed ZeRO-3: a fetch/release hook per parameterised module, on the critical path
            modules = _param_modules(scn) / lay.pp
            out.append(Transfer(gathers + ga * modules * passes * lat, "fwd_bwd", gathers / units))
            out.append(Transfer(ga * modules * passes * eff.zero3_hook_us * 1e-6, "none"))
    return out


def gather_passes(scn: Scenario) -> float:
    """All-gathers of every weight per micro-batch under ZeRO-3 / FSDP full_shard: forward and backward, and under
    DeepSpeed a third for the recompute (FSDP recomputes a checkpointed block inside its backward, while it is
    gathered; DeepSpeed's hooks fetch again)."""
    return 3.0 if scn.mix.gradient_checkpointing and not scn.mix.fsdp else 2.0


def model_parallel(scn: Scenario, eff: Efficiency, batch: int, seq: float, lay: Layout) -> list[Transfer]:
    """Tensor, context, expert and pipeline parallel traffic of one step."""
    mix, a, m = scn.mix, scn.model.arch, scn.model
    ga = scn.workload.gradient_accumulation
    c = 4.0 if mix.precision == "fp32" else 2.0
    tokens = batch * seq / lay.cp
    act = tokens * a.hidden_size * c
    blocks = m.num_layers / lay.pp
    passes = 3.0 if mix.gradient_checkpointing and mix.checkpointing == "full" else 2.0
    out: list[Transfer] = []
    if lay.tp > 1:   # two all-reduces (or reduce-scatter + all-gather) per block and pass
        t = ga * blocks * passes * 2 * ring_s(act, lay.tp, lay.tp_gbs, eff, 2.0)
        out.append(Transfer(t, "fwd_bwd" if mix.tp_comm_overlap else "none"))
    if lay.cp > 1:
        n_att = sum(k for layer, k in m.layer_groups if layer.mixer == "attention") / lay.pp
        if mix.context_parallel_impl == "ring":   # K and V chunks around the ring: fwd once, bwd K, V, dK, dV
            kv = 2 * tokens * a.num_kv_heads / lay.tp * a.head_dim * c
            t = ga * n_att * 3 * (lay.cp - 1) * kv / (lay.cp_gbs * 1e9 * eff.communication)
            out.append(Transfer(t, "attention"))
        else:                                      # Ulysses: q, k, v and output all-to-all, forward and backward
            t = ga * n_att * passes * 4 * ring_s(act / lay.tp, lay.cp, lay.cp_gbs, eff)
            out.append(Transfer(t, "none"))
    if lay.ep > 1:   # token dispatch and combine per MoE layer and pass
        n_moe = sum(k for layer, k in m.layer_groups if layer.ffn == "moe") / lay.pp
        t = ga * n_moe * passes * 2 * ring_s(act * scn.top_k, lay.ep, lay.ep_gbs, eff)
        out.append(Transfer(t, "none"))
    if lay.pp > 1:   # activations forward, their gradients back, per micro-batch and model chunk
        p2p = act / (lay.tp if lay.sequence_parallel else 1)
        t = ga * 2 * lay.virtual_stages * p2p / (lay.pp_gbs * 1e9 * eff.communication)
        # Megatron's interleaved schedule posts each send while the next chunk computes (overlap_p2p_comm, on by
        # default: megatron/training/arguments.py --no-overlap-p2p-communication); plain 1F1B waits for them
        out.append(Transfer(t, "fwd_bwd" if lay.virtual_stages > 1 else "none"))
    return out


def collectives(scn: Scenario, eff: Efficiency, trainable: int, batch: int = 1, seq: float = 0.0,
                lay: Layout | None = None) -> list[Transfer]:
    """Every collective of one step on one GPU."""
    if scn.cluster.world_size <= 1:
        return []
    lay = lay or layout(scn)
    return data_parallel(scn, eff, trainable, lay) + model_parallel(scn, eff, batch, seq or 1.0, lay)


def exposed(transfers: list[Transfer], windows: dict[str, float], eff: Efficiency,
            host_staged: bool = False) -> tuple[float, float]:
    """(exposed, hidden) seconds: each window hides up to `comm_overlap` of its compute, shared by its transfers;
    the windows overlap (a backward is inside forward + backward), so all of them together hide no more than
    `comm_overlap` of the whole compute. Collectives staged through host memory (GPUs without peer-to-peer) hide
    `comm_overlap_host` instead."""
    overlap = eff.comm_overlap_host if host_staged else eff.comm_overlap
    by: dict[str, list[Transfer]] = {}
    for t in transfers:
        by.setdefault(t.window, []).append(t)
    total_all = hidden = 0.0
    for window, ts in by.items():
        total = sum(t.seconds for t in ts)
        fixed = sum(min(t.unhidden, t.seconds) for t in ts)
        room = overlap * windows.get(window, 0.0) if window != "none" else 0.0
        hidden += min(total - fixed, room)
        total_all += total
    hidden = min(hidden, overlap * windows.get("fwd_bwd", 0.0))
    return total_all - hidden, hidden
