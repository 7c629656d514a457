"""The optimization mix: method, checkpointing, attention, sharding, offload, precision, optimizer, MoE knobs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import FtscopeError

METHODS = ("full", "lora", "qlora")
ATTENTION = ("eager", "sdpa", "flash")
OFFLOAD = ("none", "optimizer", "optimizer+params")
PRECISION = ("bf16-mixed", "bf16", "fp16-mixed", "fp32")
OPTIMIZERS = ("adamw", "adamw_8bit", "paged_adamw_8bit", "sgd")
FSDP = (None, "full_shard", "shard_grad_op")
EXPERT_BACKENDS = ("eager", "batched_mm", "grouped_mm", "modules")
LOSSES = ("standard", "chunked", "fused_linear")


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
    """eager (keeps the s x s scores) | sdpa | flash."""
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
        return " ".join(parts)


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
    if mix.method == "qlora" and mix.offload == "optimizer+params":
        raise FtscopeError("QLoRA with parameter offload is not supported: bitsandbytes 4-bit weights cannot be offloaded by ZeRO-3/FSDP")
    if mix.method == "qlora" and mix.precision == "fp32":
        raise FtscopeError("QLoRA computes in bf16 or fp16 (bnb_4bit_compute_dtype); precision fp32 is not a QLoRA setup")
    if mix.experts_top_k is not None and (isinstance(mix.experts_top_k, bool) or not isinstance(mix.experts_top_k, int)
                                          or mix.experts_top_k < 1):
        raise FtscopeError(f"mix.experts_top_k must be a positive integer; got {_show(mix.experts_top_k)}")
