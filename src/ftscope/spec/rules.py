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
    if m.method == "qlora" and m.offload == "optimizer+params" and not m.fsdp:
        return ("QLoRA with parameter offload needs fsdp: full_shard (Answer.AI's fsdp_qlora, 4-bit weights stored "
                "as bf16 for FSDP); DeepSpeed ZeRO-3 cannot offload bitsandbytes 4-bit weights")
    return None


def _qlora_computes_in_half(m: Mix) -> str | None:
    if m.method == "qlora" and m.precision == "fp32":
        return "QLoRA computes in bf16 or fp16 (bnb_4bit_compute_dtype); precision fp32 is not a QLoRA setup"
    return None


def _policy_needs_checkpointing(m: Mix) -> str | None:
    if m.checkpointing != "full" and not m.gradient_checkpointing:
        return f"mix.checkpointing: {m.checkpointing} needs gradient_checkpointing: true"
    if m.checkpoint_every > 1 and m.checkpointing != "full":
        return f"mix.checkpoint_every applies to full checkpointing (whole blocks), not to {m.checkpointing}"
    return None


def _tensor_parallel_options(m: Mix) -> str | None:
    if m.sequence_parallel and m.tensor_parallel == 1:
        return "mix.sequence_parallel splits what tensor parallelism replicates: it needs tensor_parallel > 1"
    if m.tp_comm_overlap and m.tensor_parallel == 1:
        return "mix.tp_comm_overlap overlaps tensor-parallel collectives: it needs tensor_parallel > 1"
    return None


def _pipeline_options(m: Mix) -> str | None:
    if m.virtual_stages > 1 and (m.pipeline_schedule != "interleaved" or m.pipeline_parallel == 1):
        return "mix.virtual_stages > 1 needs pipeline_schedule: interleaved and pipeline_parallel > 1"
    if m.pipeline_parallel > 1 and m.shard_stage >= 2:
        return ("pipeline_parallel > 1 works with zero_stage 0 or 1 (DeepSpeed and Megatron refuse ZeRO-2/3 and FSDP "
                "sharding of gradients with pipelines)")
    return None


def _fp8_needs_a_half_recipe(m: Mix) -> str | None:
    if m.fp8 and m.precision == "fp32":
        return "mix.fp8 runs matmuls in FP8 under a bf16/fp16 recipe; precision fp32 is not one"
    if m.fp8 and m.method == "qlora":
        return "mix.fp8 with QLoRA: the NF4 base is dequantized to bf16 for its matmuls, not to FP8"
    return None


MIX_RULES: tuple[Callable[[Mix], str | None], ...] = (
    _fsdp_or_zero, _optimizer_offload_needs_sharding, _param_offload_needs_full_sharding, _offload_runs_cpu_adam,
    _qlora_weights_stay, _qlora_computes_in_half, _policy_needs_checkpointing, _tensor_parallel_options,
    _pipeline_options, _fp8_needs_a_half_recipe,
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


def _fp8_needs_fp8_units(m: Mix, model: ModelSpec, gpu: GpuSpec) -> str | None:
    if m.fp8 and not gpu.fp8_tflops:
        return f"mix.fp8 needs FP8 tensor cores (Ada, Hopper, Blackwell, CDNA3); {gpu.key} has none"
    return None


def _flash3_needs_hopper(m: Mix, model: ModelSpec, gpu: GpuSpec) -> str | None:
    if m.attention == "flash3" and gpu.architecture != "hopper":
        return f"FlashAttention-3 runs on Hopper only; {gpu.key} is {gpu.architecture or 'not Hopper'} (use flash)"
    return None


GPU_RULES: tuple[Callable[[Mix, ModelSpec, GpuSpec], str | None], ...] = (
    _flash_needs_ampere, _bf16_needs_support, _fp8_needs_fp8_units, _flash3_needs_hopper,
)
GPU_FIELDS = ("attention", "precision", "experts_backend", "fp8")
"""The Mix fields GPU_RULES read: a search decides gpu_problem once per distinct value of them and GPU type
(tests/spec/test_rules.py changes every other field and checks the answer stays)."""


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


def check_layout(mix: Mix, *, heads: int, kv_heads: int, layers: int, experts: int, world: int, gpus_per_node: int,
                 gradient_accumulation: int, seq_len: int | None) -> None:
    """The parallel layout against the model and the GPUs it runs on (one-line errors, saying why)."""
    reason = layout_problem(mix, heads=heads, kv_heads=kv_heads, layers=layers, experts=experts, world=world,
                            gpus_per_node=gpus_per_node, gradient_accumulation=gradient_accumulation, seq_len=seq_len)
    if reason:
        raise FtscopeError(reason)


def layout_problem(mix: Mix, *, heads: int, kv_heads: int, layers: int, experts: int, world: int,
                   gpus_per_node: int, gradient_accumulation: int | None, seq_len: int | None) -> str | None:
    """Why this parallel layout cannot run this model on these GPUs, or None. `gradient_accumulation` None: not
    known yet (recommend picks it per candidate and checks the pipeline's micro-batches itself)."""
    tp, pp, cp, ep = mix.tensor_parallel, mix.pipeline_parallel, mix.context_parallel, mix.expert_parallel
    if world % mix.model_parallel:
        return (f"tensor_parallel x pipeline_parallel x context_parallel = {mix.model_parallel} must divide the {world} "
                "GPUs")
    if tp > 1 and (heads % tp or kv_heads % tp and tp % kv_heads):
        return (f"mix.tensor_parallel ({tp}) must divide the model's {heads} attention heads (and its {kv_heads} "
                "key/value heads, or be a multiple of them)")
    if tp > gpus_per_node:
        return (f"mix.tensor_parallel ({tp}) exceeds the {gpus_per_node} GPUs of a node: its per-layer collectives "
                "need NVLink, not the network")
    if pp * mix.virtual_stages > layers:
        return f"pipeline_parallel x virtual_stages ({pp * mix.virtual_stages}) exceeds the model's {layers} layers"
    if pp > 1 and gradient_accumulation is not None and gradient_accumulation < pp:
        return (f"pipeline_parallel {pp} needs at least {pp} micro-batches per step (workload.gradient_accumulation "
                f"is {gradient_accumulation}): the pipeline would never fill")
    if cp > 1 and seq_len is not None and seq_len % (2 * cp if mix.context_parallel_impl == "ring" else cp):
        return (f"workload.seq_len ({seq_len}) must split evenly over context_parallel {cp}"
                + (" x 2 (ring attention balances causal chunks)" if mix.context_parallel_impl == "ring" else ""))
    if cp > 1 and mix.context_parallel_impl == "all_to_all" and heads % (cp * tp):
        return (f"all_to_all context parallelism exchanges heads: {heads} heads must split over context_parallel x "
                f"tensor_parallel = {cp * tp}")
    if ep > 1 and not experts:
        return "mix.expert_parallel is for MoE models; this model has no experts"
    if ep > 1 and (experts % ep or (world // mix.model_parallel) % ep):
        return (f"mix.expert_parallel ({ep}) must divide the {experts} experts and the {world // mix.model_parallel} "
                "data-parallel ranks")
    if mix.optimizer_in_backward and gradient_accumulation is not None and gradient_accumulation > 1:
        return ("mix.optimizer_in_backward steps during backward: it cannot accumulate gradients "
                "(gradient_accumulation must be 1)")
    return None
