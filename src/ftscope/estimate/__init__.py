"""estimate(scenario): memory breakdown, fits?, limits, step time, throughput, hours and dollars."""
from __future__ import annotations

from ..errors import FtscopeError
from ..spec.rules import problem
from ..spec.scenario import Scenario
from .memory import memory_model
from .result import Estimate

DEFAULT_MARGIN = 0.0
"""Fraction of device memory kept free by `fits` and the solvers (`--margin`)."""


def unsupported_reason(scn: Scenario) -> str | None:
    """Why this mix cannot run on this model and hardware at all (the first rule in spec/rules.py it breaks), or None."""
    return problem(scn.mix, scn.model, scn.cluster.gpu)


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
    from ..plan.solvers import max_micro_batch  # the plan layer's solvers read only MemoryModel

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
