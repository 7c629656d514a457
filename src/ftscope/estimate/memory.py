"""Per-GPU memory by phase (forward, backward, optimizer step); the peak is the max over phases, not a sum.

`MemoryModel` holds everything that does not depend on the batch shape, so the solvers can evaluate
`breakdown(batch, seq)` thousands of times a second.
(state_memory.py and weight_memory.py say how many bytes each parameter costs, by role.)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import copysign
from typing import NamedTuple, Sequence

from ..spec.hardware import GIB
from ..spec.scenario import Scenario, fast_replace
from .allocator_model import (DEFAULT_ALLOCATOR, AllocatorModel, device_capacity,  # noqa: F401 (re-exported)
                              usable_bytes)
from .activations import ActivationCoefficients
from .shared import KeyMemo
from .head_gradient import NO_HEAD_GRADIENT, HeadGradient, head_gradient  # noqa: F401 (re-exported)
from .memory_part import MixPart, mix_part
from .memory_layout import split_states
from .reserved_floor import (clone_init_cache, clone_init_groups, fsdp1_gradient_pool, fsdp1_stream_bytes,
                             small_pool_step_bytes)
from .state_memory import (OPTIMIZER_STATE_BYTES, StateBytes, sharded_states, state_bytes,  # noqa: F401 (re-exported)
                           trainable_params)
from .weight_memory import (NF4_BYTES, forward_transients, fp32_lora_base,  # noqa: F401 (re-exported)
                            frozen_weight_bytes, gathered_bytes_per_weight, kbit_bytes_per_weight, kbit_state_bytes)


@dataclass(frozen=True)
class MemoryBreakdown:
    """One batch shape's per-GPU memory (bytes) at its peak phase."""

    peak_bytes: float
    """What torch.cuda.max_memory_reserved would show."""
    allocated_bytes: float
    """Tensor bytes at that phase (torch.cuda.max_memory_allocated; another phase may allocate slightly more)."""
    phase: str
    categories: dict[str, float]
    """weights, gradients, optimizer, activations, temporary, overhead (bytes) at the peak phase."""
    phases: dict[str, float]
    """Allocated bytes per phase."""
    fit_bytes: float
    """What must fit on the device: peak_bytes less what the allocator returns when it releases its cache
    (AllocatorModel.pinned); the run runs out of memory when this exceeds the capacity."""


class PhasePoint(NamedTuple):
    """Allocated memory at one point of a step where it can peak (bytes, per GPU)."""

    phase: str
    """forward | backward | optimizer."""
    gradients: float
    activations: float
    temporary: float
    allocated: float
    """Every tensor alive at that point: weights, optimizer, gradients, activations, temporary."""


@dataclass(frozen=True)
class MemoryModel:
    """Shape-independent parts of one scenario's memory, per GPU."""

    weights: float
    gradients: float
    """Gradient bytes alive at the end of backward (sharded for ZeRO-2/3, FSDP)."""
    gradients_in_forward: float
    """Gradient buffers that already exist during forward (accumulation, DeepSpeed's partitions)."""
    optimizer: float
    optimizer_transient: float
    """Extra bytes during optimizer.step (foreach temporaries, fp32 grad partitions)."""
    weight_transient: float
    """Extra bytes alive in forward/backward: autocast copies, gathered ZeRO-3/FSDP blocks, PEFT's merged expert
    stacks kept for backward."""
    acts: ActivationCoefficients
    checkpointing: bool
    cpu_bytes: float
    """Host RAM the run needs for offloaded optimizer/parameters."""
    capacity_bytes: float
    """Device memory the caching allocator can reserve: total less the CUDA context and NCCL's buffers
    (allocator_model.device_capacity)."""
    trainable_params: int
    allocator: AllocatorModel = field(default=DEFAULT_ALLOCATOR)
    block_transient: float = 0.0
    """Extra bytes alive only while a block computes (not at the loss): QLoRA's dequantized weight in flight,
    under checkpointing the recomputed block's merged expert stack."""
    offload_activations: bool = False
    """Saved activations live in host memory but for the block in flight and the next one (prefetched)."""
    reserved_floor: float = 0.0
    """What the caching allocator still holds from model init when the recipe resets the peak counters without
    emptying its cache: the step's reserved peak never reads below it (its allocated peak does)."""
    small_pool_step: float = 0.0
    """The step's requests of at most 1 MiB (adapters' gradients and optimizer states) on top of such a floor: the
    caching allocator's small pool cannot use the large blocks init left cached (reserved_floor.small_pool_step_bytes)."""
    paged_optimizer: float = 0.0
    """The part of `optimizer` a paged optimizer keeps in CUDA managed memory: on the GPU while there is room (and
    in nvidia-smi), paged to host RAM under pressure, never in torch's max_memory_allocated / reserved."""
    stream_pool: float = 0.0
    """Bytes a separate allocator stream keeps reserved (FSDP1's unshard stream: the gathered units)."""
    stream_gathered: float = 0.0
    """The part of weight_transient gathered on that stream (alive in forward and backward, inside stream_pool)."""
    gradient_pool: float = 0.0
    """Bytes of sharded gradients allocated on another stream (FSDP1's post-backward stream): reserved at every phase
    point, the compute stream's part counting only the gradients beyond them (reserved_floor.fsdp1_gradient_pool)."""
    head_grad: HeadGradient = field(default_factory=lambda: NO_HEAD_GRADIENT)
    """A trained LM head's weight gradient during backward, beyond what `gradients` counts there."""

    # --- per shape -----------------------------------------------------------------------------------------
    def activation_bytes(self, batch: float, seq: float) -> tuple[float, float]:
        """(saved after forward, one block's full activations) for a micro-batch."""
        t = batch * seq
        a = self.acts
        head = a.head_per_token * t + a.logits_saved_per_token * t
        if self.checkpointing:
            saved = a.checkpoint_per_token * t + head
        else:
            saved = a.saved_per_token * t + a.saved_per_token_quadratic * t * seq + head
        layer = a.layer_per_token * t + a.layer_per_token_quadratic * t * seq
        if self.offload_activations:  # the block in flight and the prefetched one stay; under checkpointing their inputs
            kept = a.checkpoint_layer_per_token * t if self.checkpointing else layer
            saved = min(saved - head, 2 * kept) + head
        return saved, layer

    def phase_points(self, batch: float, seq: float) -> tuple[PhasePoint, ...]:
        """Each point where memory can peak:
        end of forward, the last block's forward, start of backward (all activations + loss gradients), a trained
        LM head's backward (three moments of a chunked head, then a tied embedding's gradient; repeats of the start
        of backward when the head is frozen, so every model has the same ten), under checkpointing the last block's
        recompute (the loss buffers are freed by then), end of backward (all gradients), optimizer step."""
        return tuple(PhasePoint._make(p) for p in self._points(batch, seq))

    def _points(self, batch: float, seq: float) -> tuple[tuple[str, float, float, float, float], ...]:
        """phase_points' fields as plain tuples (the solvers read only the sums; no PhasePoint per call). Mirrored,
        float for float, by memory_arrays.py and held_peak.py (their tests check ==): change them together."""
        a = self.acts
        t = batch * seq
        saved, layer = self.activation_bytes(batch, seq)
        static = self.weights + self.optimizer
        wt = self.weight_transient
        g_fwd = self.gradients_in_forward
        g_end = max(self.gradients, g_fwd)
        tile = a.loss_tile_per_token * min(t, a.loss_tile_tokens)
        held = a.logits_held_per_token * t  # output logits the training loop keeps until backward ends
        fwd_act = saved + a.logits_forward_extra_per_token * t + tile
        bwd_act = saved + a.logits_backward_extra_per_token * t + tile + held
        # once the head's backward has run, the loss tensors are freed; then each block's backward holds (under
        # checkpointing, recomputed) its activations and, in eager attention, as many bytes again per score as it
        # saved (layer_per_token_quadratic: zero for sdpa/flash). By the time the attention's backward runs, the
        # block's FFN activations are freed.
        after_head = saved - a.logits_saved_per_token * t + held
        att_bwd = a.layer_per_token_quadratic * t * seq
        if self.checkpointing:
            rec_act = after_head + max(layer, layer - a.layer_ffn_per_token * t + att_bwd)
        else:
            rec_act = after_head + att_bwd
        end_act = layer + held
        bt = wt + self.block_transient
        in_block = after_head - held - a.head_per_token * t + a.forward_transient_per_token * t  # last block's forward
        hg = self.head_grad
        g_rec, g_last = g_fwd + hg.in_blocks, g_end + hg.at_last_block
        loss_start = ("backward", g_fwd, bwd_act, wt, static + g_fwd + bwd_act + wt)
        # every model has the same points (the planner stacks them across mixes): a frozen head's repeat loss_start
        head_points = (loss_start,) * 4
        if hg.weight:
            # the head's backward, chunk by chunk from the last: the chunks done and the one in flight have released
            # their saved logits and the loss's fp32 buffers; the chunk's logits gradient is alive while its matmul
            # writes a fresh weight gradient; the second chunk's is added to the first one's out of place (that
            # one is a transposed view, which autograd never accumulates into), the later ones in place
            n, h = hg.chunks, hg.weight
            logits = a.logits_saved_per_token * t
            grad = hg.logits_grad_per_token * t / n
            moments = [(logits * (n - 1) / n + grad, h)]
            if n > 1:
                moments += [(logits * (n - 2) / n + grad, 2 * h), (logits * (n - 2) / n, 3 * h)]
            points = [("backward", g_fwd + gh, act, wt, static + g_fwd + gh + act + wt)
                      for kept, gh in moments for act in (saved - logits + kept + held,)]
            g_emb = g_end + hg.at_embedding  # a tied embedding's gradient added to the head's, after the first block
            points.append(("backward", g_emb, 0.0, wt, static + g_emb + wt) if hg.at_embedding else loss_start)
            head_points = tuple(points + [points[0]] * (4 - len(points)))
        return (
            ("forward", g_fwd, fwd_act, wt, static + g_fwd + fwd_act + wt),
            ("forward", g_fwd, in_block, bt, static + g_fwd + in_block + bt),
            loss_start,
            *head_points,
            ("backward", g_rec, rec_act, bt, static + g_rec + rec_act + bt),
            ("backward", g_last, end_act, bt, static + g_last + end_act + bt),
            ("optimizer", self.gradients, 0.0, self.optimizer_transient,
             static + self.gradients + self.optimizer_transient),
        )

    def reserved_bytes(self, point: PhasePoint) -> float:
        """What the caching allocator holds at a phase point: the compute stream's allocated + overhead, plus what
        another stream's pool holds (`reserved_floor` bounds the compute stream's part)."""
        return self._reserved_of((point,))[0]

    def breakdown(self, batch: float, seq: float) -> MemoryBreakdown:
        """Memory at the phase where reserved memory (allocated + allocator overhead) peaks. When that is more than
        the device holds but what the allocator cannot release fits (fit_bytes), torch frees its cache and retries:
        the run goes on and its reserved peak reads the capacity."""
        phases = self._points(batch, seq)  # (phase, gradients, activations, temporary, allocated), as PhasePoint
        i, peak, need = self._peak_of(phases)
        name, grads, act, temp, allocated = phases[i]
        overhead = peak - allocated
        per_phase: dict[str, float] = {}
        for phase, _, _, _, held in phases:
            per_phase[phase] = max(per_phase.get(phase, 0.0), held)
        cats = {"weights": self.weights, "gradients": grads, "optimizer": self.optimizer, "activations": act,
                "temporary": temp, "overhead": overhead}
        return MemoryBreakdown(peak_bytes=allocated + overhead, allocated_bytes=allocated, phase=name,
                               categories=cats, phases=per_phase, fit_bytes=need)

    def _peak_of(self, phases) -> tuple[int, float, float]:
        """(the phase point where reserved memory peaks, its reserved bytes, what must fit): breakdown's peak."""
        totals = self._reserved_of(phases)
        i = max(range(len(phases)), key=totals.__getitem__)
        peak = max(totals[i], self.least_reserved)
        need = max(self.least_reserved, *self._reserved_of(phases, held=True))
        if peak > self.capacity_bytes >= need:
            peak = self.capacity_bytes
        return i, peak, need

    def peak_bytes(self, batch: float, seq: float) -> float:
        """breakdown(batch, seq).fit_bytes without building the breakdown (the solvers' hot path): what must fit."""
        return max(self.least_reserved, *self._reserved_of(self._points(batch, seq), held=True))  # reserved_totals

    def reserved_totals(self, batch: float, seq: float) -> list[float]:
        """What each phase point needs on the device, in order: its reserved bytes less what releasing the cache
        returns (the fit decision's sums; capacity-free, so the solvers' curves serve every GPU type)."""
        return self._reserved_of(self._points(batch, seq), held=True)

    def _reserved_of(self, points, held: bool = False) -> list[float]:
        """reserved_bytes of these point tuples: the compute stream's part (allocated plus the allocator's overhead:
        its workspace and a fragmentation share of the churning activations and temporaries; gathered units moved to
        the other stream's pool outside the optimizer step) plus that pool and the gradient pool. `held`: only what
        releasing the cache leaves (torch frees every idle cached block, of any stream, before it reports an OOM):
        the pinned share of the fragmentation (AllocatorModel.pinned), the other stream's pool only while its units
        are gathered (not in the optimizer step), and the gradients where they are allocated."""
        al, g, pool, gp = self.allocator, self.stream_gathered, self.stream_pool, self.gradient_pool
        ws = al.workspace_gib * GIB
        fr = al.fragmentation_checkpointed if self.checkpointing else al.fragmentation
        if held:
            fr = min(fr, al.pinned)
        if g == 0.0 and gp == 0.0 and copysign(1.0, g) > 0.0:  # nothing on another stream: x - 0.0 is x, bit for bit
            return [alloc + ws + fr * (act + temp) + pool for _, _, act, temp, alloc in points]
        owns = [g if p[0] != "optimizer" else 0.0 for p in points]
        if held:
            return [p[4] - own + ws + fr * (p[2] + p[3] - own) + (pool if p[0] != "optimizer" else 0.0)
                    for p, own in zip(points, owns)]
        return [p[4] - own - min(p[1], gp) + ws + fr * (p[2] + p[3] - own) + pool + gp
                for p, own in zip(points, owns)]

    @property
    def least_reserved(self) -> float:
        """Reserved bytes no batch shape reads below: what init left cached (and the step's small-pool segments beside
        it) plus other streams' pools."""
        return self.reserved_floor + self.small_pool_step + self.stream_pool + self.gradient_pool

    def fits(self, batch: float, seq: float, margin: float = 0.0) -> bool:
        return self.peak_bytes(batch, seq) <= self.capacity_bytes * (1.0 - margin)


_MODELS: dict[tuple, tuple[MixPart, dict[int, MemoryModel]]] = {}
"""Memory models by what they read of the scenario: a search asks for the same one on every GPU type. Per model, mix
(as memory_mix), accumulation, recipe and allocator: their mix_part (it reads no GPU count) and the models by GPU
count."""
FUSED_ATTENTION = "sdpa"
"""The attention memory_mix gives every fused kernel: the memory model tells eager attention (its saved scores)
from the fused ones (sdpa, flash, flash1, flash3: none saves them) and nothing more."""
_MEMORY_MIXES = KeyMemo(lambda mix: mix if mix.attention in ("eager", FUSED_ATTENTION)
                        else fast_replace(mix, attention=FUSED_ATTENTION))


def memory_mix(mix):
    """The mix with the fields the memory model does not read at one value (fused attention kernels as
    FUSED_ATTENTION): mixes with the same memory_mix have equal memory models (tests/estimate/test_memory.py
    checks it on every attention choice), so memory_model builds one for them."""
    return _MEMORY_MIXES[mix]


def memory_model(scn: Scenario, allocator: AllocatorModel = DEFAULT_ALLOCATOR) -> MemoryModel:
    """The per-GPU memory model of a scenario. It reads the GPU only for its capacity, so one model is built per
    model, mix (as memory_mix), accumulation, recipe and GPU count, and shared across GPU types and node layouts with
    the capacity (device_capacity) replaced."""
    allocator = step_allocator(scn, allocator)
    capacity = device_capacity(scn, allocator)
    mm = _shared_model(scn, allocator, capacity)
    if mm.capacity_bytes == capacity:
        return mm
    return fast_replace(mm, capacity_bytes=capacity)


def capacity_free_model(scn: Scenario, allocator: AllocatorModel = DEFAULT_ALLOCATOR) -> MemoryModel:
    """memory_model(scn, allocator) but for its capacity_bytes, which is another GPU's (0.0 where this call builds
    it): for what reads no capacity, such as solvers.BatchSolver (it solves for each), without device_capacity's
    NCCL buffers."""
    return _shared_model(scn, step_allocator(scn, allocator), 0.0)


def _shared_model(scn: Scenario, allocator: AllocatorModel, capacity: float) -> MemoryModel:
    """memory_model's shared model (`allocator`: the step's; `capacity`: the one it gets where this builds it)."""
    key = (scn.model, memory_mix(scn.mix), scn.workload.gradient_accumulation > 1, scn.recipe, allocator)
    hit = _MODELS.get(key)
    if hit is None:
        if len(_MODELS) >= 4096:
            _MODELS.clear()
        hit = _MODELS[key] = (mix_part(scn, allocator), {})
    world = scn.cluster.world_size
    part, models = hit
    mm = models.get(world)
    if mm is None:
        if len(models) >= 256:
            models.clear()
        mm = models[world] = models_of(part, [scn], [capacity])[0]  # build_memory_models([scn], allocator)[0]
    return mm


def step_allocator(scn: Scenario, allocator: AllocatorModel = DEFAULT_ALLOCATOR) -> AllocatorModel:
    """The allocator model of this scenario's step: the framework's own replayed fraction where its recipe has one."""
    frag = scn.recipe.allocator_fragmentation_checkpointed
    if frag is not None and frag != allocator.fragmentation_checkpointed:
        return fast_replace(allocator, fragmentation_checkpointed=float(frag))
    return allocator


def build_memory_models(scns: Sequence[Scenario], allocator: AllocatorModel, policy: tuple | None = None,
                        states: tuple | None = None, capacities: Sequence[float] | None = None) -> list[MemoryModel]:
    """The memory model of each scenario, for scenarios that differ only in their cluster (GPU count and type: one
    mix on every GPU count a search probes): what does not read the GPU count is computed once (`policy`, `states`:
    the activation_policy and the (trainable, state_bytes, frozen, kbit) below when the caller has them;
    `capacities`: device_capacity of each scenario under `allocator`, likewise)."""
    if not scns:
        return []
    return models_of(mix_part(scns[0], allocator, policy, states), scns, capacities)


def models_of(part: MixPart, scns: Sequence[Scenario], capacities: Sequence[float] | None = None
              ) -> list[MemoryModel]:
    """build_memory_models' per-cluster part: the models of these scenarios (their mix's part given)."""
    m, mix, allocator = part.scn.model, part.scn.mix, part.allocator
    stage, deepspeed, mixed = mix.shard_stage, mix.zero_stage > 0, mix.precision in ("bf16-mixed", "fp16-mixed")
    trainable, per, frozen, kbit, in_forward = part.trainable, part.per, part.frozen, part.kbit, part.in_forward
    transient, block, acts, checkpointing, head = part.transient, part.block, part.acts, part.checkpointing, part.head
    per_weight, paged_share, share, split_head = part.per_weight, part.paged_share, part.share, None
    out = []
    for i, s in enumerate(scns):
        n = s.cluster.world_size // mix.model_parallel  # ZeRO / FSDP shard over the data-parallel ranks
        shard_w = n if (stage == 3 or mix.fsdp is not None) else 1
        shard_o = n if stage >= 1 else 1
        weights, grads, optimizer, cpu = sharded_states(mix, n, frozen, trainable, per, kbit)
        if stage == 0 and n > 1:
            # DDP copies every gradient into its communication buckets (HF Trainer / accelerate default)
            grads *= 2.0
        grads_fwd = grads if in_forward else 0.0
        if deepspeed and stage >= 2:
            # ZeRO-2/3 reduce-scatter through a bucket of about hidden^2 elements (HF "auto"), double-buffered
            bucket = min(trainable, m.arch.hidden_size ** 2) * per.gradient * 2
            grads, grads_fwd = grads + bucket, grads_fwd + bucket
        opt_transient = 0.0  # optimizer step transients
        if mix.offload == "none" and mix.optimizer in ("adamw",) and not s.recipe.adamw_fused:
            # foreach AdamW: one temporary per parameter, in the optimizer state's dtype
            opt_transient += trainable * (2.0 if per.low_states else 4.0) / shard_o
        if deepspeed and mixed and mix.offload == "none":
            opt_transient += trainable * 4.0 / shard_o   # fp32 gradient partition fed to the optimizer
        floor = 0.0
        # built, cloned, loaded on this GPU (torchtune 0.1 built no MoE model; a replay over every expert would take
        # seconds)
        if mix.method == "qlora" and shard_w == 1 and s.recipe.init_layer_clones and not m.is_moe:
            floor = weights + clone_init_cache(*clone_init_groups(s))
        elif mix.method == "qlora" and shard_w == 1 and s.recipe.init_quantize_bytes_per_weight:  # built on this GPU
            floor = weights + m.largest_linear_params() * s.recipe.init_quantize_bytes_per_weight
        init_cache, pool, gathered = fsdp1_stream_bytes(s, per_weight, n) if mix.fsdp is not None else (0.0,) * 3
        grad_pool = fsdp1_gradient_pool(s, grads, n) if mix.fsdp is not None else 0.0
        if mix.fsdp is not None and init_cache:
            floor = weights + init_cache
        # gradients on FSDP1's post-backward stream sit in that stream's pool (gradient_pool), not the small pool
        small = small_pool_step_bytes(s, 0.0 if grad_pool else per.gradient, per.optimizer, shard_w) if floor else 0.0
        paged = 0.0 if paged_share is None else optimizer * paged_share
        values = dict(
            weights=weights, gradients=grads, gradients_in_forward=grads_fwd, optimizer=optimizer,
            optimizer_transient=opt_transient, weight_transient=transient, block_transient=block, acts=acts,
            checkpointing=checkpointing, cpu_bytes=cpu,
            capacity_bytes=device_capacity(s, allocator) if capacities is None else capacities[i],
            trainable_params=trainable, allocator=allocator, offload_activations=mix.activation_offload,
            paged_optimizer=paged, reserved_floor=floor, small_pool_step=small,
            stream_pool=pool if mix.fsdp is not None else 0.0, stream_gathered=gathered if mix.fsdp is not None else 0.0,
            gradient_pool=grad_pool,
            head_grad=head,
            _curves=[])  # solvers.reserved_curves fills it once for every copy: it ignores the capacity
        changes = split_states(values, s, share, split_head)
        if changes is not None:
            if split_head is None:  # the same for every GPU count
                split_head = changes["head_grad"]
            values.update(changes)
        model = object.__new__(MemoryModel)  # MemoryModel(...) without its frozen __init__ (test_memory_probe checks)
        model.__dict__.update(values)
        out.append(model)
    return out
