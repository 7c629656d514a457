"""The optimization mix: method, checkpointing, attention, sharding, offload, precision, optimizer, MoE knobs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import FtscopeError

METHODS = ("full", "lora", "qlora")
ATTENTION = ("eager", "sdpa", "flash", "flash3", "flash1")
OFFLOAD = ("none", "optimizer", "optimizer+params")
PRECISION = ("bf16-mixed", "bf16", "fp16-mixed", "fp32")
OPTIMIZERS = ("adamw", "adamw_8bit", "paged_adamw_8bit", "sgd")
FSDP = (None, "full_shard", "shard_grad_op")
EXPERT_BACKENDS = ("eager", "batched_mm", "grouped_mm", "modules")
LOSSES = ("standard", "chunked", "fused_linear")
CHECKPOINTING = ("full", "selective", "per-op")
PIPELINE_SCHEDULES = ("1f1b", "interleaved")
CONTEXT_PARALLEL_IMPLS = ("ring", "all_to_all")
MAX_DEGREE = 1024


@dataclass(frozen=True)
class Mix:
    """How the run is optimized. Field names are the scenario's `mix:` keys."""

    method: str = "lora"
    """full | lora | qlora (LoRA over an NF4 double-quantized frozen base)."""
    lora_rank: int = 16
    lora_targets: str | tuple[str, ...] = "all-linear"
    """all-linear | attention | mlp | list of module names (q_proj, w1, ...)."""
    gradient_checkpointing: bool = False
    """Keep only block inputs; recompute each block in backward (one extra forward)."""
    attention: str = "sdpa"
    """eager (keeps the s x s scores) | sdpa | flash (FlashAttention-2) | flash3 (FlashAttention-3, Hopper) |
    flash1 (the 2022 kernels: FlashAttention v1 and its Triton port, as in 2023 llm-foundry)."""
    zero_stage: int = 0
    """DeepSpeed ZeRO: 0 none (DDP), 1 optimizer, 2 +gradients, 3 +parameters sharded."""
    fsdp: str | None = None
    """torch FSDP2 sharding instead of ZeRO: full_shard (like ZeRO-3) | shard_grad_op (like ZeRO-2)."""
    offload: str = "none"
    """none | optimizer | optimizer+params (to CPU RAM)."""
    precision: str = "bf16-mixed"
    """bf16-mixed (fp32 master weights) | bf16 (pure) | fp16-mixed | fp32."""
    optimizer: str = "adamw"
    """adamw | adamw_8bit | paged_adamw_8bit | sgd."""
    experts_top_k: int | None = None
    """Override the model's experts per token (sparse vs dense MoE)."""
    experts_backend: str = "grouped_mm"
    """transformers 5 fused 3-D experts: eager (loop) | batched_mm | grouped_mm; or modules: one nn.Linear per
    expert (transformers 4.x), which bitsandbytes quantizes and PEFT adapts without merging the stack."""

    @property
    def fused_experts(self) -> bool:
        """Experts stored as fused 3-D parameters (transformers 5): bitsandbytes leaves them unquantized and
        PEFT's LoRA on them materializes W + BA of the whole stack."""
        return self.experts_backend != "modules"
    loss: str = "standard"
    """standard (HF: fp32 logits for the whole batch) | chunked (torchtune / LitGPT: the LM head and the
    cross-entropy per chunk of tokens) | fused_linear (TRL's fused LM head, Liger, Unsloth: no logits kept).
    A `framework:` recipe sets it unless the scenario does."""
    lora_dropout: float = 0.0
    """LoRA dropout probability; above 0 every adapted linear keeps its own dropped-out input and mask."""
    checkpointing: str = "full"
    """What gradient checkpointing recomputes: full (whole blocks) | selective (Megatron: the attention core only)
    | per-op (torchtitan op-level: keep matmul outputs, recompute the elementwise ops)."""
    checkpoint_every: int = 1
    """With full checkpointing: checkpoint every N-th block only (torchtitan's per-layer policy); 1 = every block."""
    tensor_parallel: int = 1
    """Megatron tensor parallelism: each matmul split over this many GPUs of a node."""
    sequence_parallel: bool = False
    """With tensor_parallel > 1: norms and dropouts split along the sequence too (Megatron SP)."""
    tp_comm_overlap: bool = False
    """With tensor_parallel > 1: tensor-parallel collectives overlapped with the GEMMs (Megatron / Transformer
    Engine --tp-comm-overlap) instead of on the critical path."""
    pipeline_parallel: int = 1
    """Pipeline stages (layers split over this many GPUs); micro-batches = gradient_accumulation."""
    pipeline_schedule: str = "1f1b"
    """1f1b | interleaved (virtual_stages model chunks per GPU: a smaller bubble)."""
    virtual_stages: int = 1
    """Model chunks per pipeline stage under the interleaved schedule."""
    context_parallel: int = 1
    """Sequence split over this many GPUs (long context)."""
    context_parallel_impl: str = "ring"
    """ring (Megatron CP / ring attention: K,V passed around) | all_to_all (DeepSpeed-Ulysses: heads exchanged)."""
    expert_parallel: int = 1
    """MoE experts split over this many GPUs (all-to-all token dispatch)."""
    fp8: bool = False
    """Matmuls in FP8 (Transformer Engine / torchao float8) on GPUs with FP8 units; attention stays bf16."""
    compile: bool = False
    """torch.compile: elementwise ops fused (fewer memory passes and kernels)."""
    optimizer_in_backward: bool = False
    """Step each parameter as soon as its gradient exists (torchtune): gradients are never all held at once."""
    activation_offload: bool = False
    """Saved activations copied to CPU memory in forward and back in backward (overlapped with compute)."""

    @property
    def trains_lora(self) -> bool:
        return self.method in ("lora", "qlora")

    @property
    def shard_stage(self) -> int:
        """What is sharded, on ZeRO's scale: FSDP full_shard = 3, shard_grad_op = 2."""
        if self.fsdp == "full_shard":
            return 3
        if self.fsdp == "shard_grad_op":
            return 2
        return self.zero_stage

    def label(self) -> str:
        """Short human name: 'qlora r16 +gc flash zero2'."""
        parts = [self.method if self.method == "full" else f"{self.method} r{self.lora_rank}"]
        if self.gradient_checkpointing:
            parts.append("+gc")
        parts.append(self.attention)
        if self.fsdp:
            parts.append(f"fsdp-{self.fsdp}")
        elif self.zero_stage:
            parts.append(f"zero{self.zero_stage}")
        if self.offload != "none":
            parts.append(f"offload-{self.offload}")
        if self.optimizer != "adamw":
            parts.append(self.optimizer)
        if self.precision != "bf16-mixed":
            parts.append(self.precision)
        if self.experts_top_k:
            parts.append(f"top{self.experts_top_k}")
        if self.loss != "standard":
            parts.append(f"{self.loss}-loss")
        if self.gradient_checkpointing and self.checkpointing != "full":
            parts.append(f"{self.checkpointing}-ckpt")
        for key, short in (("tensor_parallel", "tp"), ("pipeline_parallel", "pp"), ("context_parallel", "cp"),
                           ("expert_parallel", "ep")):
            if getattr(self, key) > 1:
                parts.append(f"{short}{getattr(self, key)}")
        for flag in ("fp8", "compile"):
            if getattr(self, flag):
                parts.append(flag)
        return " ".join(parts)

    @property
    def model_parallel(self) -> int:
        """GPUs one model replica spans: tensor x pipeline x context parallel."""
        return self.tensor_parallel * self.pipeline_parallel * self.context_parallel


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _choice(value: object, options: Sequence[object], key: str) -> None:
    try:
        ok = value in options
    except TypeError:  # unhashable garbage
        ok = False
    if not ok:
        shown = ", ".join(str(o) for o in options if o is not None)
        raise FtscopeError(f"mix.{key} must be one of {shown}; got {_show(value)}")


def check_mix(mix: Mix) -> None:
    """Reject values out of range and combinations that real frameworks refuse, saying why."""
    _choice(mix.method, METHODS, "method")
    _choice(mix.attention, ATTENTION, "attention")
    _choice(mix.offload, OFFLOAD, "offload")
    _choice(mix.precision, PRECISION, "precision")
    _choice(mix.optimizer, OPTIMIZERS, "optimizer")
    _choice(mix.fsdp, FSDP, "fsdp")
    _choice(mix.experts_backend, EXPERT_BACKENDS, "experts_backend")
    _choice(mix.loss, LOSSES, "loss")
    if isinstance(mix.lora_dropout, bool) or not isinstance(mix.lora_dropout, (int, float)) or not 0 <= mix.lora_dropout < 1:
        raise FtscopeError(f"mix.lora_dropout must be a number from 0 to below 1; got {_show(mix.lora_dropout)}")
    if isinstance(mix.zero_stage, bool) or mix.zero_stage not in (0, 1, 2, 3):
        raise FtscopeError(f"mix.zero_stage must be 0, 1, 2 or 3; got {_show(mix.zero_stage)}")
    if isinstance(mix.lora_rank, bool) or not isinstance(mix.lora_rank, int) or not 1 <= mix.lora_rank <= 4096:
        raise FtscopeError(f"mix.lora_rank must be an integer from 1 to 4096; got {_show(mix.lora_rank)}")
    if not isinstance(mix.gradient_checkpointing, bool):
        raise FtscopeError(f"mix.gradient_checkpointing must be true or false; got {_show(mix.gradient_checkpointing)}")
    if mix.fsdp and mix.zero_stage:
        raise FtscopeError("mix sets both fsdp and zero_stage: choose DeepSpeed ZeRO or torch FSDP, not both")
    if mix.offload == "optimizer" and mix.shard_stage == 0:
        raise FtscopeError("offload: optimizer needs DeepSpeed ZeRO (zero_stage >= 1) or fsdp to move optimizer state to CPU")
    if mix.offload == "optimizer+params" and mix.shard_stage != 3:
        raise FtscopeError("offload: optimizer+params needs zero_stage: 3 or fsdp: full_shard (only sharded parameters can be offloaded)")
    if mix.offload != "none" and mix.optimizer in ("adamw_8bit", "paged_adamw_8bit"):
        raise FtscopeError(f"offload runs the optimizer step on the CPU (DeepSpeed CPUAdam); {mix.optimizer} is a GPU-only bitsandbytes optimizer")
    if mix.method == "qlora" and mix.offload == "optimizer+params" and not mix.fsdp:
        raise FtscopeError("QLoRA with parameter offload needs fsdp: full_shard (Answer.AI's fsdp_qlora, 4-bit weights "
                           "stored as bf16 for FSDP); DeepSpeed ZeRO-3 cannot offload bitsandbytes 4-bit weights")
    if mix.method == "qlora" and mix.precision == "fp32":
        raise FtscopeError("QLoRA computes in bf16 or fp16 (bnb_4bit_compute_dtype); precision fp32 is not a QLoRA setup")
    if mix.experts_top_k is not None and (isinstance(mix.experts_top_k, bool) or not isinstance(mix.experts_top_k, int)
                                          or mix.experts_top_k < 1):
        raise FtscopeError(f"mix.experts_top_k must be a positive integer; got {_show(mix.experts_top_k)}")
    check_layout_keys(mix)


def _degree(mix: Mix, key: str, upper: int = MAX_DEGREE) -> None:
    v = getattr(mix, key)
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= upper:
        raise FtscopeError(f"mix.{key} must be an integer from 1 to {upper}; got {_show(v)}")


def check_layout_keys(mix: Mix) -> None:
    """The parallel layout, checkpointing policy and kernel options on their own (the model and GPU count are
    checked by check_layout)."""
    _choice(mix.checkpointing, CHECKPOINTING, "checkpointing")
    _choice(mix.pipeline_schedule, PIPELINE_SCHEDULES, "pipeline_schedule")
    _choice(mix.context_parallel_impl, CONTEXT_PARALLEL_IMPLS, "context_parallel_impl")
    for key in ("tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel", "virtual_stages",
                "checkpoint_every"):
        _degree(mix, key)
    for key in ("sequence_parallel", "tp_comm_overlap", "fp8", "compile", "optimizer_in_backward", "activation_offload"):
        if not isinstance(getattr(mix, key), bool):
            raise FtscopeError(f"mix.{key} must be true or false; got {_show(getattr(mix, key))}")
    if mix.checkpointing != "full" and not mix.gradient_checkpointing:
        raise FtscopeError(f"mix.checkpointing: {mix.checkpointing} needs gradient_checkpointing: true")
    if mix.checkpoint_every > 1 and mix.checkpointing != "full":
        raise FtscopeError("mix.checkpoint_every applies to full checkpointing (whole blocks), not to "
                           f"{mix.checkpointing}")
    if mix.sequence_parallel and mix.tensor_parallel == 1:
        raise FtscopeError("mix.sequence_parallel splits what tensor parallelism replicates: it needs tensor_parallel > 1")
    if mix.tp_comm_overlap and mix.tensor_parallel == 1:
        raise FtscopeError("mix.tp_comm_overlap overlaps tensor-parallel collectives: it needs tensor_parallel > 1")
    if mix.virtual_stages > 1 and (mix.pipeline_schedule != "interleaved" or mix.pipeline_parallel == 1):
        raise FtscopeError("mix.virtual_stages > 1 needs pipeline_schedule: interleaved and pipeline_parallel > 1")
    if mix.pipeline_parallel > 1 and mix.shard_stage >= 2:
        raise FtscopeError("pipeline_parallel > 1 works with zero_stage 0 or 1 (DeepSpeed and Megatron refuse "
                           "ZeRO-2/3 and FSDP sharding of gradients with pipelines)")
    if mix.fp8 and mix.precision == "fp32":
        raise FtscopeError("mix.fp8 runs matmuls in FP8 under a bf16/fp16 recipe; precision fp32 is not one")
    if mix.fp8 and mix.method == "qlora":
        raise FtscopeError("mix.fp8 with QLoRA: the NF4 base is dequantized to bf16 for its matmuls, not to FP8")


def check_layout(mix: Mix, *, heads: int, kv_heads: int, layers: int, experts: int, world: int, gpus_per_node: int,
                 gradient_accumulation: int, seq_len: int | None) -> None:
    """The parallel layout against the model and the GPUs it runs on (one-line errors, saying why)."""
    tp, pp, cp, ep = mix.tensor_parallel, mix.pipeline_parallel, mix.context_parallel, mix.expert_parallel
    if world % mix.model_parallel:
        raise FtscopeError(f"tensor_parallel x pipeline_parallel x context_parallel = {mix.model_parallel} must divide "
                           f"the {world} GPUs")
    if tp > 1 and (heads % tp or kv_heads % tp and tp % kv_heads):
        raise FtscopeError(f"mix.tensor_parallel ({tp}) must divide the model's {heads} attention heads "
                           f"(and its {kv_heads} key/value heads, or be a multiple of them)")
    if tp > gpus_per_node:
        raise FtscopeError(f"mix.tensor_parallel ({tp}) exceeds the {gpus_per_node} GPUs of a node: its per-layer "
                           "collectives need NVLink, not the network")
    if pp * mix.virtual_stages > layers:
        raise FtscopeError(f"pipeline_parallel x virtual_stages ({pp * mix.virtual_stages}) exceeds the model's "
                           f"{layers} layers")
    if pp > 1 and gradient_accumulation < pp:
        raise FtscopeError(f"pipeline_parallel {pp} needs at least {pp} micro-batches per step "
                           f"(workload.gradient_accumulation is {gradient_accumulation}): the pipeline would never fill")
    if cp > 1 and seq_len is not None and seq_len % (2 * cp if mix.context_parallel_impl == "ring" else cp):
        raise FtscopeError(f"workload.seq_len ({seq_len}) must split evenly over context_parallel {cp}"
                           + (" x 2 (ring attention balances causal chunks)" if mix.context_parallel_impl == "ring" else ""))
    if cp > 1 and mix.context_parallel_impl == "all_to_all" and heads % (cp * tp):
        raise FtscopeError(f"all_to_all context parallelism exchanges heads: {heads} heads must split over "
                           f"context_parallel x tensor_parallel = {cp * tp}")
    if ep > 1 and not experts:
        raise FtscopeError("mix.expert_parallel is for MoE models; this model has no experts")
    if ep > 1 and (experts % ep or (world // mix.model_parallel) % ep):
        raise FtscopeError(f"mix.expert_parallel ({ep}) must divide the {experts} experts and the "
                           f"{world // mix.model_parallel} data-parallel ranks")
    if mix.optimizer_in_backward and gradient_accumulation > 1:
        raise FtscopeError("mix.optimizer_in_backward steps during backward: it cannot accumulate gradients "
                           "(gradient_accumulation must be 1)")
