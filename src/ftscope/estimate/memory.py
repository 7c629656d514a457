"""Per-GPU memory by phase (forward, backward, optimizer step); the peak is the max over phases, not a sum.

`MemoryModel` holds everything that does not depend on the batch shape, so the solvers can evaluate
`breakdown(batch, seq)` thousands of times a second.

Bytes per parameter, by where the weights live (N = GPUs that share a shard):
- full, bf16-mixed without DeepSpeed/FSDP (torch AMP): fp32 weights 4 + fp32 grads 4 + AdamW 8; autocast keeps a
  bf16 copy of every weight used in forward (2) until backward frees it;
- full under ZeRO (bf16 weights 2, bf16 grads 2, fp32 master + AdamW 12) with ZeRO-1 sharding the 12,
  ZeRO-2 also the grads, ZeRO-3 also the weights; FSDP2 keeps fp32 sharded params and gathers bf16 per block;
- LoRA: frozen bf16 base 2; adapters fp32 (PEFT upcasts them) + grads + AdamW;
- QLoRA: NF4 with double quantization, 0.5 + 1/64 + 4/16384 bytes per quantized weight; embeddings, norms
  and LM head stay bf16; one block's weights are dequantized to bf16 at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ..spec.hardware import GIB, GpuSpec
from ..spec.scenario import Scenario, fast_replace
from .activations import ActivationCoefficients, activation_coefficients, activation_mix
from .adapter_memory import (kbit_autocast_copies, kbit_fp32_params, largest_dequantized_linear,
                             peft_merged_expert_bytes)
from .memory_layout import activation_policy, fsdp1_stream_bytes, paged_state_params, split_states
from .state_memory import OPTIMIZER_STATE_BYTES, StateBytes, sharded_states, state_bytes  # noqa: F401 (re-exported)

NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)


@dataclass(frozen=True)
class AllocatorModel:
    """Bytes outside tensors: what turns allocated into reserved and reserved into nvidia-smi."""

    cuda_context_gib: float = 0.5
    """CUDA context, cuBLAS/cuDNN kernels: visible in nvidia-smi, not in torch's reserved."""
    workspace_gib: float = 0.03
    """cuBLAS workspaces and small buffers the caching allocator holds."""
    fragmentation: float = 0.17
    """Reserved exceeds allocated by this fraction of the memory that churns (activations, temporaries).
    Fitted on 49 H200 profile points, checked on 35 others (benchmarks/allocator_fit.py): median 5.7 % held out,
    and the real ratio spreads from 0.05 to 0.6 by model and mix, so a tight fit needs a profile run."""


DEFAULT_ALLOCATOR = AllocatorModel()


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
    """Device memory the caching allocator can reserve (total minus CUDA context)."""
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
    paged_optimizer: float = 0.0
    """The part of `optimizer` a paged optimizer keeps in CUDA managed memory: on the GPU while there is room (and
    in nvidia-smi), paged to host RAM under pressure, never in torch's max_memory_allocated / reserved."""
    stream_pool: float = 0.0
    """Bytes a separate allocator stream keeps reserved (FSDP1's unshard stream: the gathered units)."""
    stream_gathered: float = 0.0
    """The part of weight_transient gathered on that stream (alive in forward and backward, inside stream_pool)."""

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
        end of forward, start of backward (all activations + loss gradients), under checkpointing the last
        block's recompute (the loss buffers are freed by then), end of backward (all gradients), optimizer step."""
        return tuple(PhasePoint._make(p) for p in self._points(batch, seq))

    def _points(self, batch: float, seq: float) -> tuple[tuple[str, float, float, float, float], ...]:
        """phase_points' fields as plain tuples (the solvers read only the sums; no PhasePoint per call)."""
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
        return (
            ("forward", g_fwd, fwd_act, wt, static + g_fwd + fwd_act + wt),
            ("forward", g_fwd, in_block, bt, static + g_fwd + in_block + bt),
            ("backward", g_fwd, bwd_act, wt, static + g_fwd + bwd_act + wt),
            ("backward", g_fwd, rec_act, bt, static + g_fwd + rec_act + bt),
            ("backward", g_end, end_act, bt, static + g_end + end_act + bt),
            ("optimizer", self.gradients, 0.0, self.optimizer_transient,
             static + self.gradients + self.optimizer_transient),
        )

    def reserved_bytes(self, point: PhasePoint) -> float:
        """What the caching allocator holds at a phase point: the compute stream's allocated + overhead, plus what
        another stream's pool holds (the solvers' curves; `reserved_floor` bounds the compute stream's part)."""
        return self._reserved_of((point,))[0]

    def breakdown(self, batch: float, seq: float) -> MemoryBreakdown:
        """Memory at the phase where reserved memory (allocated + allocator overhead) peaks."""
        phases = self._points(batch, seq)  # (phase, gradients, activations, temporary, allocated), as PhasePoint
        totals = self._reserved_of(phases)
        i = max(range(len(phases)), key=totals.__getitem__)
        name, grads, act, temp, allocated = phases[i]
        overhead = max(totals[i], self.least_reserved) - allocated
        per_phase: dict[str, float] = {}
        for phase, _, _, _, held in phases:
            per_phase[phase] = max(per_phase.get(phase, 0.0), held)
        cats = {"weights": self.weights, "gradients": grads, "optimizer": self.optimizer, "activations": act,
                "temporary": temp, "overhead": overhead}
        return MemoryBreakdown(peak_bytes=allocated + overhead, allocated_bytes=allocated, phase=name,
                               categories=cats, phases=per_phase)

    def peak_bytes(self, batch: float, seq: float) -> float:
        """breakdown(batch, seq).peak_bytes without building the breakdown (the solvers' hot path)."""
        return max(self.least_reserved, *self.reserved_totals(batch, seq))

    def reserved_totals(self, batch: float, seq: float) -> list[float]:
        """reserved_bytes of every phase point, in order (the same sums, without building PhasePoints)."""
        return self._reserved_of(self._points(batch, seq))

    def _reserved_of(self, points) -> list[float]:
        """reserved_bytes of these point tuples: the compute stream's part (allocated plus the allocator's overhead:
        its workspace and a fragmentation share of the churning activations and temporaries; gathered units moved to
        the other stream's pool outside the optimizer step) plus that pool."""
        al, g, pool = self.allocator, self.stream_gathered, self.stream_pool
        ws, fr = al.workspace_gib * GIB, al.fragmentation
        owns = [g if p[0] != "optimizer" else 0.0 for p in points]
        return [p[4] - own + ws + fr * (p[2] + p[3] - own) + pool for p, own in zip(points, owns)]

    @property
    def least_reserved(self) -> float:
        """Reserved bytes no batch shape reads below: what init left cached plus another stream's pool."""
        return self.reserved_floor + self.stream_pool

    def fits(self, batch: float, seq: float, margin: float = 0.0) -> bool:
        return self.peak_bytes(batch, seq) <= self.capacity_bytes * (1.0 - margin)


def trainable_params(scn: Scenario) -> int:
    m, mix = scn.model, scn.mix
    if mix.method == "full":
        return m.total_params
    return m.lora_params(mix.lora_rank, mix.lora_targets, fused_experts=m.is_moe and mix.fused_experts)


def usable_bytes(gpu: GpuSpec, allocator: AllocatorModel = DEFAULT_ALLOCATOR) -> float:
    """Device memory the caching allocator can reserve on this GPU (total minus the CUDA context)."""
    return gpu.memory_bytes - allocator.cuda_context_gib * GIB


def frozen_weight_bytes(scn: Scenario) -> float:
    """Bytes of the frozen base weights (none for full fine-tuning): NF4 for what bitsandbytes quantizes."""
    m, mix = scn.model, scn.mix
    total = m.total_params
    if mix.method == "qlora":
        quantized = m.quantizable_params()
        if m.is_moe and mix.fused_experts:
            # bitsandbytes replaces nn.Linear only: transformers 5's fused 3-D experts stay in bf16
            quantized -= sum(lin.params * k for lin, k in m.linears() if lin.group == "experts")
        return quantized * NF4_BYTES + (total - quantized) * 2.0 + kbit_fp32_params(scn, quantized) * 2.0
    frozen = 0 if mix.method == "full" else total
    return frozen * (4.0 if mix.precision == "fp32" or fp32_lora_base(scn) else 2.0)


def fp32_lora_base(scn: Scenario) -> bool:
    """A LoRA base the recipe loads in fp32 and keeps so under mixed precision (DeepSpeed's bf16 engine casts it)."""
    mix = scn.mix
    return (scn.recipe.lora_base_fp32 and mix.method == "lora" and mix.zero_stage == 0
            and mix.precision in ("bf16-mixed", "fp16-mixed"))


def forward_transients(scn: Scenario, shards: int) -> tuple[float, float]:
    """(bytes alive through forward and backward, bytes alive while one block computes): autocast's weight cache,
    dequantized and merged weights, ZeRO-3 / FSDP gathers."""
    m, mix = scn.model, scn.mix
    deepspeed, fsdp = mix.zero_stage > 0, mix.fsdp is not None
    mixed = mix.precision in ("bf16-mixed", "fp16-mixed")
    transient = block = 0.0
    if mix.method == "full" and mixed and not deepspeed and not fsdp:
        transient += m.total_params * 2.0       # autocast's bf16 weight cache, kept for backward
    if mix.method == "qlora":
        largest = largest_dequantized_linear(m, mix.fused_experts)
        block += largest * scn.recipe.dequant_bytes_per_weight  # the dequantized weight of the matmul in flight
        if scn.recipe.compiled_dequant_saved and (mix.compile or scn.recipe.compile):
            block = m.largest_layer_params() * 2.0  # compiled: each fused bf16 dequantization saved for backward
    head_copy, stack_copies = kbit_autocast_copies(scn)
    transient += head_copy
    if mix.gradient_checkpointing:
        block += max(stack_copies, default=0.0)
        block += peft_merged_expert_bytes(scn)  # one recomputed layer's
    else:
        transient += sum(stack_copies)
        transient += peft_merged_expert_bytes(scn)  # every layer's, saved for backward
    if mix.shard_stage == 3:
        # ZeRO-3/FSDP gather the current block and prefetch the next (MoE blocks are gathered whole)
        per_param = NF4_BYTES if mix.method == "qlora" else 2.0
        transient += 2 * m.largest_layer_params() * per_param * (1 - 1 / shards)
        if scn.recipe.fsdp_root_gathered and fsdp:
            root = m.embedding_params + m.lm_head_params + m.final_norm_params
            transient += root * (4.0 if mix.precision == "fp32" else 2.0) * (1 - 1 / shards)
    elif fsdp and mix.method == "full":
        transient += m.total_params * 2.0       # shard_grad_op keeps the unsharded bf16 weights until backward ends
    return transient, block


_MODELS: dict[tuple, MemoryModel] = {}
"""Memory models by what they read of the scenario: a search asks for the same one on every GPU type."""
FUSED_ATTENTION = "sdpa"
"""The attention memory_mix gives every fused kernel: the memory model tells eager attention (its saved scores)
from the fused ones (sdpa, flash, flash1, flash3: none saves them) and nothing more."""
_MEMORY_MIXES: dict = {}


def memory_mix(mix):
    """The mix with the fields the memory model does not read at one value (fused attention kernels as
    FUSED_ATTENTION): mixes with the same memory_mix have equal memory models (tests/estimate/test_memory.py
    checks it on every attention choice), so memory_model builds one for them."""
    hit = _MEMORY_MIXES.get(mix)
    if hit is None:
        if len(_MEMORY_MIXES) >= 4096:
            _MEMORY_MIXES.clear()
        hit = _MEMORY_MIXES[mix] = (mix if mix.attention in ("eager", FUSED_ATTENTION)
                                    else fast_replace(mix, attention=FUSED_ATTENTION))
    return hit


def memory_model(scn: Scenario, allocator: AllocatorModel = DEFAULT_ALLOCATOR) -> MemoryModel:
    """The per-GPU memory model of a scenario. It reads the GPU only for its capacity, so one model is built per
    model, mix (as memory_mix), accumulation, recipe and GPU count, and shared across GPU types with the capacity
    replaced."""
    key = (scn.model, memory_mix(scn.mix), scn.workload.gradient_accumulation > 1, scn.recipe,
           scn.cluster.world_size, allocator)
    mm = _MODELS.get(key)
    if mm is None:
        if len(_MODELS) >= 4096:
            _MODELS.clear()
        mm = _MODELS[key] = _build_memory_model(scn, allocator)
        mm.__dict__["_curves"] = []  # solvers.reserved_curves fills it once for every copy: it ignores the capacity
    capacity = usable_bytes(scn.cluster.gpu, allocator)
    if mm.capacity_bytes == capacity:
        return mm
    return fast_replace(mm, capacity_bytes=capacity)


def _build_memory_model(scn: Scenario, allocator: AllocatorModel) -> MemoryModel:
    m, mix, cl = scn.model, scn.mix, scn.cluster
    n = cl.world_size // mix.model_parallel  # ZeRO / FSDP shard over the data-parallel ranks
    stage = mix.shard_stage
    deepspeed = mix.zero_stage > 0
    mixed = mix.precision in ("bf16-mixed", "fp16-mixed")
    trainable = trainable_params(scn)
    per = state_bytes(scn)

    shard_w = n if (stage == 3 or mix.fsdp is not None) else 1
    shard_o = n if stage >= 1 else 1
    weights, grads, optimizer, cpu = sharded_states(mix, n, frozen_weight_bytes(scn), trainable, per)

    if stage == 0 and n > 1:
        # DDP copies every gradient into its communication buckets (HF Trainer / accelerate default)
        grads *= 2.0
    # gradients already allocated during forward
    grads_fwd = grads if (scn.workload.gradient_accumulation > 1 or deepspeed) else 0.0
    if deepspeed and stage >= 2:
        # ZeRO-2/3 reduce-scatter through a bucket of about hidden^2 elements (HF "auto"), double-buffered
        bucket = min(trainable, m.arch.hidden_size ** 2) * per.gradient * 2
        grads, grads_fwd = grads + bucket, grads_fwd + bucket
    transient, block = forward_transients(scn, n)

    # optimizer step transients
    opt_transient = 0.0
    if mix.offload == "none" and mix.optimizer in ("adamw",) and not scn.recipe.adamw_fused:
        # foreach AdamW: one temporary per parameter, in the optimizer state's dtype
        opt_transient += trainable * (2.0 if per.low_states else 4.0) / shard_o
    if deepspeed and mixed and mix.offload == "none":
        opt_transient += trainable * 4.0 / shard_o   # fp32 gradient partition fed to the optimizer

    floor = 0.0
    if mix.method == "qlora" and shard_w == 1 and scn.recipe.init_quantize_bytes_per_weight:  # built on this GPU
        floor = weights + m.largest_linear_params() * scn.recipe.init_quantize_bytes_per_weight
    init_cache, pool, gathered = fsdp1_stream_bytes(scn, NF4_BYTES if mix.method == "qlora" else 2.0, n)
    if mix.fsdp is not None and init_cache:
        floor = weights + init_cache
    paged = 0.0
    if mix.optimizer.startswith("paged_"):
        paged = optimizer * min(paged_state_params(scn) / max(trainable, 1), 1.0)
    acts, checkpointing = activation_policy(activation_coefficients(m, activation_mix(mix), scn.top_k, scn.recipe),
                                            scn)
    return split_states(MemoryModel(
        weights=weights, gradients=grads, gradients_in_forward=grads_fwd, optimizer=optimizer,
        optimizer_transient=opt_transient, weight_transient=transient, block_transient=block, acts=acts,
        checkpointing=checkpointing, cpu_bytes=cpu, capacity_bytes=usable_bytes(cl.gpu, allocator),
        trainable_params=trainable, allocator=allocator, offload_activations=mix.activation_offload,
        paged_optimizer=paged, reserved_floor=floor, stream_pool=pool if mix.fsdp is not None else 0.0,
        stream_gathered=gathered if mix.fsdp is not None else 0.0,
    ), scn)
