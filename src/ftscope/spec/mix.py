"""The optimization mix: method, checkpointing, attention, sharding, offload, precision, optimizer, MoE knobs.

Each field's type lists what it allows (a `Literal`, or a range), as litgpt's `Config` does; `schema.validate`
checks a scenario's `mix:` mapping against them, `choices(Mix, name)` gives plan/recommend their search space
and `--help` its lists. Rules on combinations live in `rules.py`. A new mix key is one field here (and, when it
constrains other keys, one rule there).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from .schema import Choice, Flag, Int, Number, Text, choices, forbid_extra


def _unset(to: object, *spellings: object) -> BeforeValidator:
    """Accept YAML's ways of saying "off" (null, false, no) for a key whose off value is `to`."""
    return BeforeValidator(lambda v: to if v is None or v is False or v in spellings else v)


LoraTargets = Annotated[
    Annotated[str, Field(min_length=1)] | Annotated[tuple[Text(min_length=1), ...], Field(min_length=1)],
    Field(description="all-linear, attention, mlp or a list of module names"),
]
ZeroStage = Annotated[Choice(0, 1, 2, 3), _unset(0)]
Rank = Int(1, 4096)
TopK = Int(1, 4096)
MAX_DEGREE = 1024
Degree = Int(1, MAX_DEGREE)


@forbid_extra
@dataclass(frozen=True)
class Mix:
    """How the run is optimized. Field names are the scenario's `mix:` keys."""

    method: Literal["full", "lora", "qlora"] = "lora"
    """full | lora | qlora (LoRA over a bitsandbytes NF4 frozen base)."""
    nested_quant: Flag() = True
    """QLoRA: bitsandbytes' nested (double) quantization of the 4-bit weights' absmax scales, 0.516 bytes per
    4-bit weight; false keeps one fp32 absmax per 64 weights, 0.5625 (transformers' bnb_4bit_use_double_quant,
    TRL's use_bnb_nested_quant, LLaMA-Factory's double_quantization). A `framework:` recipe sets it unless the
    scenario does; other methods ignore it."""
    lora_rank: Rank = 16
    """LoRA rank r: adapter matrices of r x hidden per adapted linear (also QLoRA's)."""
    lora_targets: LoraTargets = "all-linear"
    """all-linear | attention | mlp | list of module names (q_proj, w1, ...)."""
    gradient_checkpointing: Flag() = False
    """Keep only block inputs; recompute each block in backward (one extra forward)."""
    attention: Literal["eager", "sdpa", "flash", "flash3", "flash1"] = "sdpa"
    """eager (keeps the s x s scores) | sdpa | flash (FlashAttention-2) | flash3 (FlashAttention-3, Hopper) |
    flash1 (the 2022 kernels: FlashAttention v1 and its Triton port, as in 2023 llm-foundry)."""
    zero_stage: ZeroStage = 0
    """DeepSpeed ZeRO: 0 none (DDP), 1 optimizer, 2 +gradients, 3 +parameters sharded."""
    fsdp: Annotated[Literal["full_shard", "shard_grad_op"] | None, _unset(None, "none", "no")] = None
    """torch FSDP2 sharding instead of ZeRO: full_shard (like ZeRO-3) | shard_grad_op (like ZeRO-2)."""
    offload: Annotated[Literal["none", "optimizer", "optimizer+params"], _unset("none")] = "none"
    """none | optimizer | optimizer+params (to CPU RAM)."""
    precision: Literal["bf16-mixed", "bf16", "fp16-mixed", "fp32"] = "bf16-mixed"
    """bf16-mixed (fp32 master weights) | bf16 (pure) | fp16-mixed | fp32."""
    optimizer: Literal["adamw", "adamw_8bit", "paged_adamw_8bit", "sgd"] = "adamw"
    """adamw | adamw_8bit | paged_adamw_8bit | sgd."""
    experts_top_k: TopK | None = None
    """Override the model's experts per token (sparse vs dense MoE)."""
    experts_backend: Literal["eager", "batched_mm", "grouped_mm", "modules"] = "grouped_mm"
    """transformers 5 fused 3-D experts: eager (loop) | batched_mm | grouped_mm; or modules: one nn.Linear per
    expert (transformers 4.x), which bitsandbytes quantizes and PEFT adapts without merging the stack."""
    loss: Literal["standard", "chunked", "fused", "fused_linear"] = "standard"
    """standard (HF: fp32 logits for the whole batch) | chunked (torchtune / LitGPT: the LM head and the
    cross-entropy per chunk of tokens) | fused (one cross-entropy kernel over the compute-dtype logits:
    flash-attn's CrossEntropyLoss, llm-foundry's default) | fused_linear (TRL's fused LM head, Liger, Unsloth:
    no logits kept).
    A `framework:` recipe sets it unless the scenario does."""
    fused_elementwise: bool = False
    """Norms, residual adds, RoPE and the gated activation run as fused kernels (Transformer Engine / Megatron,
    llm-foundry's MPT, Triton or Liger norms); false: eager PyTorch (Hugging Face, torchtune without compile)."""
    lora_dropout: Number(ge=0, lt=1) = 0.0
    """LoRA dropout probability; above 0 every adapted linear keeps its own dropped-out input and mask."""
    checkpointing: Literal["full", "selective", "per-op"] = "full"
    """What gradient checkpointing recomputes: full (whole blocks) | selective (Megatron: the attention core only)
    | per-op (torchtitan op-level: keep matmul outputs, recompute the elementwise ops)."""
    checkpoint_every: Degree = 1
    """With full checkpointing: checkpoint every N-th block only (torchtitan's per-layer policy); 1 = every block."""
    tensor_parallel: Degree = 1
    """Megatron tensor parallelism: each matmul split over this many GPUs of a node."""
    sequence_parallel: Flag() = False
    """With tensor_parallel > 1: norms and dropouts split along the sequence too (Megatron SP)."""
    tp_comm_overlap: Flag() = False
    """With tensor_parallel > 1: tensor-parallel collectives overlapped with the GEMMs (Megatron / Transformer
    Engine --tp-comm-overlap) instead of on the critical path."""
    pipeline_parallel: Degree = 1
    """Pipeline stages (layers split over this many GPUs); micro-batches = gradient_accumulation."""
    pipeline_schedule: Literal["1f1b", "interleaved"] = "1f1b"
    """1f1b | interleaved (virtual_stages model chunks per GPU: a smaller bubble)."""
    virtual_stages: Degree = 1
    """Model chunks per pipeline stage under the interleaved schedule."""
    context_parallel: Degree = 1
    """Sequence split over this many GPUs (long context)."""
    context_parallel_impl: Literal["ring", "all_to_all"] = "ring"
    """ring (Megatron CP / ring attention: K,V passed around) | all_to_all (DeepSpeed-Ulysses: heads exchanged)."""
    expert_parallel: Degree = 1
    """MoE experts split over this many GPUs (all-to-all token dispatch)."""
    fp8: Flag() = False
    """Matmuls in FP8 (Transformer Engine / torchao float8) on GPUs with FP8 units; attention stays bf16."""
    compile: Flag() = False
    """torch.compile: elementwise ops fused (fewer memory passes and kernels)."""
    optimizer_in_backward: Flag() = False
    """Step each parameter as soon as its gradient exists (torchtune): gradients are never all held at once."""
    activation_offload: Flag() = False
    """Saved activations copied to CPU memory in forward and back in backward (overlapped with compute)."""

    @property
    def fused_experts(self) -> bool:
        """Experts stored as fused 3-D parameters (transformers 5): bitsandbytes leaves them unquantized and
        PEFT's LoRA on them materializes W + BA of the whole stack."""
        return self.experts_backend != "modules"

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


def mix_help() -> str:
    """'mix.method: full | lora | qlora; mix.attention: ...' for every choice field (the --help text)."""
    from dataclasses import fields
    parts = []
    for f in fields(Mix):
        values = choices(Mix, f.name)
        if values:
            parts.append(f"mix.{f.name}: {' | '.join(str(v) for v in values)}")
    return "; ".join(parts)
