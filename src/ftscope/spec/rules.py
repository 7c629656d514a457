"""Every rule on whether a mix can run, in one place: each a small function that says why not (or None).

Three kinds, by what they read: the mix alone (combinations the frameworks refuse), the mix with the model (MoE
knobs on a dense model, top-k beyond the experts) and the mix with the model and the GPU (kernels the GPU lacks).
`scenario_from_dict` raises on the first two; `estimate` raises on the third (plan and recommend list it as the
candidate's reason). Types and ranges of single keys are not rules: they are the field types in `mix.py`.
A new mix key that constrains others adds one function to one of the tuples below.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Callable

from ..errors import FtscopeError
from .hardware import GpuSpec
from .mix import Mix
from .model import ModelSpec
from .schema import validate

_BNB_OPTIMIZERS = ("adamw_8bit", "paged_adamw_8bit")


def _fsdp_or_zero(m: Mix) -> str | None:
    if m.fsdp and m.zero_stage:
        return "mix sets both fsdp and zero_stage: choose DeepSpeed ZeRO or torch FSDP, not both"
    return None


def _optimizer_offload_needs_sharding(m: Mix) -> str | None:
    if m.offload == "optimizer" and m.shard_stage == 0:
        return "offload: optimizer needs DeepSpeed ZeRO (zero_stage >= 1) or fsdp to move optimizer state to CPU"
    return None


def _param_offload_needs_full_sharding(m: Mix) -> str | None:
    if m.offload == "optimizer+params" and m.shard_stage != 3:
        return ("offload: optimizer+params needs zero_stage: 3 or fsdp: full_shard (only sharded parameters can be "
                "offloaded)")
    return None


def _offload_runs_cpu_adam(m: Mix) -> str | None:
    if m.offload != "none" and m.optimizer in _BNB_OPTIMIZERS:
        return (f"offload runs the optimizer step on the CPU (DeepSpeed CPUAdam); {m.optimizer} is a GPU-only "
                "bitsandbytes optimizer")
    return None


def _qlora_weights_stay(m: Mix) -> str | None:
    if m.method == "qlora" and m.offload == "optimizer+params":
        return ("QLoRA with parameter offload is not supported: bitsandbytes 4-bit weights cannot be offloaded by "
                "ZeRO-3/FSDP")
    return None


def _qlora_computes_in_half(m: Mix) -> str | None:
    if m.method == "qlora" and m.precision == "fp32":
        return "QLoRA computes in bf16 or fp16 (bnb_4bit_compute_dtype); precision fp32 is not a QLoRA setup"
    return None


MIX_RULES: tuple[Callable[[Mix], str | None], ...] = (
    _fsdp_or_zero, _optimizer_offload_needs_sharding, _param_offload_needs_full_sharding, _offload_runs_cpu_adam,
    _qlora_weights_stay, _qlora_computes_in_half,
)


def _top_k_needs_moe(m: Mix, model: ModelSpec) -> str | None:
    if not model.is_moe and m.experts_top_k:
        return f"mix.experts_top_k is for MoE models; {model.name} is dense"
    return None


def _top_k_within_experts(m: Mix, model: ModelSpec) -> str | None:
    if model.is_moe and m.experts_top_k and m.experts_top_k > model.arch.num_experts:
        return f"mix.experts_top_k ({m.experts_top_k}) exceeds the model's {model.arch.num_experts} experts"
    return None


def _grouped_mm_is_bf16(m: Mix, model: ModelSpec) -> str | None:
    if model.is_moe and m.experts_backend == "grouped_mm" and m.precision in ("fp32", "fp16-mixed"):
        return "experts_backend grouped_mm runs in bf16 only; use batched_mm or eager with fp16/fp32"
    return None


MODEL_RULES: tuple[Callable[[Mix, ModelSpec], str | None], ...] = (
    _top_k_needs_moe, _top_k_within_experts, _grouped_mm_is_bf16,
)


def _flash_needs_ampere(m: Mix, model: ModelSpec, gpu: GpuSpec) -> str | None:
    if m.attention == "flash" and not gpu.flash_attention:
        return f"FlashAttention-2 needs an Ampere-or-newer GPU; {gpu.key} has none (use attention: sdpa)"
    return None


def _bf16_needs_support(m: Mix, model: ModelSpec, gpu: GpuSpec) -> str | None:
    if m.precision.startswith("bf16") and not gpu.bf16:
        return f"{gpu.key} has no bf16 support (use precision: fp16-mixed)"
    if m.experts_backend == "grouped_mm" and model.is_moe and not gpu.bf16:
        return f"experts_backend grouped_mm needs bf16, which {gpu.key} lacks (use batched_mm)"
    return None


GPU_RULES: tuple[Callable[[Mix, ModelSpec, GpuSpec], str | None], ...] = (_flash_needs_ampere, _bf16_needs_support)


def check_mix(mix: Mix) -> Mix:
    """The mix with every value checked against its field type, then every mix rule; else one FtscopeError."""
    checked = validate(Mix, {f.name: getattr(mix, f.name) for f in fields(Mix)}, "mix")
    problem = mix_problem(checked)
    if problem:
        raise FtscopeError(problem)
    return checked


def mix_problem(mix: Mix) -> str | None:
    return next((p for rule in MIX_RULES if (p := rule(mix))), None)


def model_problem(mix: Mix, model: ModelSpec) -> str | None:
    return next((p for rule in MODEL_RULES if (p := rule(mix, model))), None)


def gpu_problem(mix: Mix, model: ModelSpec, gpu: GpuSpec) -> str | None:
    return next((p for rule in GPU_RULES if (p := rule(mix, model, gpu))), None)


def problem(mix: Mix, model: ModelSpec, gpu: GpuSpec) -> str | None:
    """The first rule of any kind this combination breaks (what plan and recommend list as the reason)."""
    return mix_problem(mix) or model_problem(mix, model) or gpu_problem(mix, model, gpu)
