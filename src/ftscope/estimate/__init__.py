"""estimate(scenario): memory breakdown, fits?, limits, step time, throughput, hours and dollars."""
from __future__ import annotations

from ..errors import FtscopeError
from ..spec.scenario import Scenario
from .memory import memory_model
from .result import Estimate
from .solvers import max_micro_batch

DEFAULT_MARGIN = 0.0
"""Fraction of device memory kept free by `fits` and the solvers (`--margin`)."""


def unsupported_reason(scn: Scenario) -> str | None:
    """Why this mix cannot run on this hardware at all, or None."""
    gpu, mix = scn.cluster.gpu, scn.mix
    if mix.attention == "flash" and not gpu.flash_attention:
        return f"FlashAttention-2 needs an Ampere-or-newer GPU; {gpu.key} has none (use attention: sdpa)"
    if mix.precision.startswith("bf16") and not gpu.bf16:
        return f"{gpu.key} has no bf16 support (use precision: fp16-mixed)"
    if mix.experts_backend == "grouped_mm" and scn.model.is_moe and not gpu.bf16:
        return f"experts_backend grouped_mm needs bf16, which {gpu.key} lacks (use batched_mm)"
    if scn.model.is_moe and mix.experts_top_k and mix.experts_top_k > scn.model.arch.num_experts:
        return f"experts_top_k {mix.experts_top_k} exceeds the model's {scn.model.arch.num_experts} experts"
    return None


def _warnings(scn: Scenario, seq: int) -> tuple[str, ...]:
    out = []
    max_pos = scn.model.arch.max_position_embeddings
    if seq > max_pos:
        out.append(f"sequence length {seq} exceeds the model's max_position_embeddings {max_pos} (needs RoPE scaling)")
    if scn.mix.method == "qlora" and scn.mix.shard_stage == 3:
        out.append("QLoRA with ZeRO-3/FSDP needs bnb_4bit_quant_storage=bfloat16 so the 4-bit weights can be sharded")
    return tuple(out)


def estimate(scn: Scenario, margin: float = DEFAULT_MARGIN, strict: bool = True, with_time: bool = True,
             calibration=None) -> Estimate:
    """Estimate one scenario. With strict=True an unsupported mix raises FtscopeError (exit 2 in the CLI);
    with strict=False it comes back with `reason` set and `fits` false (what plan/recommend list)."""
    if not 0 <= margin < 1:
        raise FtscopeError(f"margin must be in [0, 1); got {margin}")
    reason = unsupported_reason(scn)
    if reason and strict:
        raise FtscopeError(reason)
    mem = memory_model(scn)
    wl = scn.workload
    seq = wl.peak_seq_len()
    max_b = max_micro_batch(mem, seq, margin)
    batch = (max_b or 1) if wl.solve_batch else int(wl.micro_batch_size)
    breakdown = mem.breakdown(batch, seq)
    if reason is None and breakdown.peak_bytes > mem.capacity_bytes * (1 - margin):
        reason = (f"does not fit: needs {breakdown.peak_bytes / 2**30:.1f} GiB per GPU at micro-batch {batch}, "
                  f"seq {seq}; {scn.cluster.gpu.key} has {mem.capacity_bytes / 2**30:.1f} GiB usable")
    result = Estimate(scenario=scn, micro_batch_size=batch, seq_len=seq, memory=breakdown, model_memory=mem,
                      max_micro_batch_size=max_b, margin=margin, reason=reason,
                      warnings=_warnings(scn, seq))
    if with_time:
        from .time import attach_time
        result = attach_time(result, calibration)
    return result
