"""estimate(scenario): memory breakdown, fits?, limits, step time, throughput, hours and dollars."""
from __future__ import annotations

import math
from dataclasses import replace

from ..errors import FtscopeError
from ..spec.rules import problem
from ..spec.scenario import Scenario
from .memory import memory_model
from .result import TIGHT_MARGIN, Estimate
from .shared import Shared, shared_for
from .solvers import max_micro_batch

DEFAULT_MARGIN = 0.0
"""Fraction of device memory kept free by `fits` and the solvers (`--margin`)."""


def unsupported_reason(scn: Scenario) -> str | None:
    """Why this mix cannot run on this model and hardware at all (the first rule in spec/rules.py it breaks), or None."""
    return problem(scn.mix, scn.model, scn.cluster.gpu)


def _warnings(scn: Scenario, seq: int) -> tuple[str, ...]:
    out = []
    arch = scn.model.arch
    if seq > arch.max_position_embeddings and not arch.fact("rope_scaling"):
        out.append(f"sequence length {seq:,} exceeds the model's max_position_embeddings {arch.max_position_embeddings:,} "
                   "and its config.json has no rope_scaling: the model was not trained for it (add rope_scaling to "
                   "the config or shorten workload.seq_len)")
    if scn.mix.method == "qlora" and scn.mix.shard_stage == 3:
        out.append("QLoRA with ZeRO-3/FSDP needs bnb_4bit_quant_storage=bfloat16 so the 4-bit weights can be sharded")
    return tuple(out)


SLOW_STEP_S = 86_400.0
"""A step longer than a day is almost always a typo in the GPU's rates or the workload: said as a warning."""


def _sane(result: Estimate) -> Estimate:
    """The result boundary: no NaN, inf or negative figure leaves the estimator (an error naming it instead)."""
    mem, t, run = result.memory, result.time, result.run
    values = [mem.peak_bytes, mem.allocated_bytes, *mem.categories.values()]
    if t is not None:
        values += [t.step_s, t.tokens_per_s, t.samples_per_s, t.mfu, *t.breakdown_s.values()]
    if run is not None:
        values += [run.hours, run.usd if run.usd is not None else 0.0]
    if min(values) >= 0 and math.isfinite(sum(values)):  # every figure finite and not negative (else find which)
        return _slow_step_warning(result)
    figures = {"memory.peak": mem.peak_bytes, "memory.allocated": mem.allocated_bytes,
               **{f"memory.{k}": v for k, v in mem.categories.items()}}
    if t is not None:
        figures |= {"time.step_s": t.step_s, "time.tokens_per_s": t.tokens_per_s, "time.samples_per_s": t.samples_per_s,
                    "time.mfu": t.mfu, **{f"time.{k}": v for k, v in t.breakdown_s.items()}}
    if run is not None:
        figures |= {"run.hours": run.hours, "run.usd": run.usd if run.usd is not None else 0.0}
    bad = next(((k, v) for k, v in figures.items() if not (math.isfinite(v) and v >= 0)), None)
    if bad is not None:
        raise FtscopeError(f"the estimate of {scn_name(result.scenario)} came out {bad[0]} = {bad[1]}: check the GPU's "
                           "rates and memory (hardware.gpu) and the workload sizes")
    return _slow_step_warning(result)


def _slow_step_warning(result: Estimate) -> Estimate:
    t = result.time
    if t is not None and t.step_s > SLOW_STEP_S:
        result = replace(result, warnings=(*result.warnings, f"one step takes {t.step_s:,.0f} s (over a day): check the "
                                                             "GPU's rates (hardware.gpu) and the workload sizes"))
    return result


def scn_name(scn: Scenario) -> str:
    return f"{scn.model.name} on {scn.cluster.world_size}x {scn.cluster.gpu.key} ({scn.mix.label()})"


def estimate(scn: Scenario, margin: float = DEFAULT_MARGIN, strict: bool = True, with_time: bool = True,
             calibration=None, tight_margin: float = TIGHT_MARGIN, shared: Shared | None = None) -> Estimate:
    """Estimate one scenario. With strict=True an unsupported mix raises FtscopeError (exit 2 in the CLI);
    with strict=False it comes back with `reason` set and `fits` false (what plan/recommend list). A fit with
    less than `tight_margin` of usable memory left is "tight" (Estimate.status). `shared`: a sweep's memo of the
    work its candidates share (estimate/shared.py); the same numbers, computed once."""
    sh, reason, mem, seq, max_b, batch, breakdown = memory_stage(scn, margin, strict, tight_margin, shared)
    if reason is None and breakdown.fit_bytes > mem.capacity_bytes * (1 - margin):
        reason = (f"does not fit: needs {breakdown.fit_bytes / 2**30:.1f} GiB per GPU at micro-batch {batch}, "
                  f"seq {seq}; {scn.cluster.gpu.key} has {mem.capacity_bytes / 2**30:.1f} GiB usable")
    result = Estimate(scenario=scn, micro_batch_size=batch, seq_len=seq, memory=breakdown, model_memory=mem,
                      max_micro_batch_size=max_b, margin=margin, reason=reason,
                      warnings=sh.get(("warnings",), lambda: _warnings(scn, seq)) if sh else _warnings(scn, seq),
                      tight_margin=tight_margin)
    if with_time:
        from .time import attach_time
        result = attach_time(result, calibration, sh)
    return _sane(result)


def memory_stage(scn: Scenario, margin: float, strict: bool, tight_margin: float, shared: Shared | None):
    """(the memo that covers scn or None, unsupported reason, memory model, padded length, largest micro-batch,
    micro-batch, breakdown): what `estimate` reads before its result (also plan/search.py's ranking figures, so
    both see the same numbers)."""
    for name, value in (("margin", margin), ("tight_margin", tight_margin)):
        if not 0 <= value < 1:
            raise FtscopeError(f"{name} must be in [0, 1); got {value}")
    sh = shared_for(shared, scn)
    reason = sh.per_gpu("reason", scn, lambda: unsupported_reason(scn)) if sh else unsupported_reason(scn)
    if reason and strict:
        raise FtscopeError(reason)
    world = scn.cluster.world_size
    # per GPU type and node layout: the capacity reads both (NCCL's buffers)
    mem = (sh.per_gpu(("memory", world, scn.cluster.gpus_per_node), scn, lambda: memory_model(scn)) if sh
           else memory_model(scn))
    if not mem.capacity_bytes > 0:
        raise FtscopeError(f"{scn.cluster.gpu.key} has {scn.cluster.gpu.memory_gib:.2f} GiB: nothing is left after the "
                           f"CUDA context ({mem.allocator.cuda_context_gib} GiB); give hardware.gpu more memory")
    wl = scn.workload
    seq = wl.peak_seq_len()
    if sh:  # the memory models of one GPU count differ only in the capacity
        max_b = sh.get(("max_b", world, mem.capacity_bytes, margin), lambda: max_micro_batch(mem, seq, margin))
    else:
        max_b = max_micro_batch(mem, seq, margin)
    batch = (max_b or 1) if wl.solve_batch else int(wl.micro_batch_size)
    # the breakdown reads the capacity only where a reserved peak above it stops there (the allocator's retry)
    breakdown = (sh.get(("breakdown", world, batch, mem.capacity_bytes), lambda: mem.breakdown(batch, seq)) if sh
                 else mem.breakdown(batch, seq))
    return sh, reason, mem, seq, max_b, batch, breakdown
