"""recommend: search every valid optimization mix on the user's model, data and GPUs; rank; explain.

Singh et al. (2024) give rules (ZeRO-2 + LoRA by default, ZeRO-3 + LoRA + checkpointing for the largest
models, FlashAttention for long context). Here the rules are replaced by a search with the estimator, so the
answer fits the actual model, sequence lengths, GPU and count, and every rejected mix keeps its reason.
The search (engine.py) estimates only the candidates that can reach the top; `exhaustive=True` estimates every
one and returns the same answer.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from .. import catalog
from ..errors import FtscopeError
from ..estimate import estimate, unsupported_reason
from ..estimate.comm import gather_passes
from ..estimate.efficiency import Calibration, load_calibration
from ..estimate.memory import memory_model
from ..estimate.weight_memory import gathered_weight_bytes
from ..estimate.result import Estimate
from ..spec.hardware import GpuSpec, gpu_from_catalog
from ..spec.scenario import Scenario
from .layouts import keep_global_batch, layout_reason, replicas
from .engine import Engine, Progress, Ranking, SearchSummary
from .ranking import RANK_BY, complexity, rank_key, refusal
from ..estimate.solvers import max_micro_batch
from .space import ENGINES, LAYOUTS, MIX_DIMENSIONS, SHARDING, SearchSpace, Space, for_engine

__all__ = ["Candidate", "Recommendation", "SearchSpace", "SHARDING", "ENGINES", "RANK_BY", "complexity", "recommend",
           "mix_reason", "explain", "best_deepspeed", "parse_gpu_budget"]


@dataclass(frozen=True)
class Candidate:
    """One evaluated configuration: its estimate, or why it cannot run."""

    scenario: Scenario
    estimate: Estimate | None
    reason: str | None

    @property
    def feasible(self) -> bool:
        return self.reason is None and self.estimate is not None and self.estimate.fits

    def to_dict(self) -> dict[str, Any]:
        if self.estimate is not None:
            d = self.estimate.to_dict()
            d["reason"] = self.reason or d.get("reason")
            d["memory"]["fits"] = self.feasible
            return d
        return {"scenario": self.scenario.to_dict(), "label": _label(self.scenario), "memory": {"fits": False},
                "limits": None, "time": None, "run": None, "reason": self.reason}


@dataclass(frozen=True)
class Recommendation:
    rows: list[Candidate]
    """The best `top` feasible candidates, ranked, then the first rejected ones in listing order with their
    reasons (what the old full list showed first)."""
    best: Candidate | None
    explanation: list[str] = field(default_factory=list)
    by: str = "time"
    summary: SearchSummary = field(default_factory=SearchSummary)
    """Exact counts per reason, how much of the space was covered, how many estimates it took."""
    best_deepspeed: Candidate | None = None
    """The best feasible candidate that runs under DeepSpeed ZeRO (for users who launch with deepspeed)."""
    engine: str | None = None
    """The launcher the search was restricted to (`--engine deepspeed|fsdp`), or None for every one."""

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [c.to_dict() for c in self.rows], "best": self.best.to_dict() if self.best else None,
                "by": self.by, "explanation": self.explanation, "counts": self.summary.counts(),
                "search": self.summary.search(), "engine": self.engine,
                "best_deepspeed": self.best_deepspeed.to_dict() if self.best_deepspeed else None}


def _label(scn: Scenario) -> str:
    return f"{scn.cluster.world_size}x {scn.cluster.gpu.key} | {scn.mix.label()}"


def parse_gpu_budget(spec: str, default_gpu: GpuSpec | None = None) -> tuple[GpuSpec | None, int]:
    """'a100-80gb:8' -> (A100-80GB, up to 8 GPUs); a bare name means up to 8; a bare count ('8') means up to that
    many of the scenario's GPU (`default_gpu`, None when not known yet)."""
    name, _, count = spec.partition(":") if not spec.strip().isdigit() else ("", "", spec.strip())
    try:
        n = int(count) if count else 8
    except ValueError:
        raise FtscopeError(f"--gpus takes NAME:COUNT like a100-80gb:8; got {spec!r}") from None
    if not 1 <= n <= 4096:
        raise FtscopeError(f"GPU count in {spec!r} must be from 1 to 4096")
    return (gpu_from_catalog(name) if name else default_gpu), n


def mix_reason(scn: Scenario) -> str | None:
    """Why this candidate cannot run at all (refused combination, or not on this GPU), or None."""
    reason = refusal(scn.model, scn.mix)
    if reason:
        return reason
    reason = unsupported_reason(scn)
    return f"unsupported: {reason}" if reason else None


def _estimate(cand: Scenario, global_batch: int | None, cal: Calibration, margin: float = 0.0) -> Candidate:
    """The candidate at the largest micro-batch that leaves `margin` of usable memory free, or, when none does,
    at the largest that fits at all (then it is tight)."""
    reason = mix_reason(cand) or layout_reason(cand, global_batch)
    if reason:
        return Candidate(cand, None, reason)
    mem = memory_model(cand)
    seq = cand.workload.peak_seq_len()
    mb_max = (margin and max_micro_batch(mem, seq, margin)) or max_micro_batch(mem, seq)
    if mb_max == 0:
        est = estimate(cand.with_(micro_batch_size=1), strict=False, calibration=cal, tight_margin=margin)
        return Candidate(cand, est, est.reason)
    if global_batch is None:
        mb, ga = mb_max, cand.workload.gradient_accumulation
    else:  # keep the scenario's global batch: same optimization, different layout
        mb, ga = keep_global_batch(mb_max, global_batch, replicas(cand), cand.mix.pipeline_parallel)
    est = estimate(cand.with_(micro_batch_size=mb, gradient_accumulation=ga), strict=False, calibration=cal,
                   tight_margin=margin)
    return Candidate(est.scenario, est, est.reason)


def evaluator(global_batch: int | None, cal: Calibration, budget_usd: float | None,
              deadline_hours: float | None, margin: float = 0.0) -> Callable[[Scenario], Candidate]:
    """The exact evaluation of one candidate: estimate it, then hold it to the budget and the deadline."""
    def evaluate(cand: Scenario) -> Candidate:
        c = _estimate(cand, global_batch, cal, margin)
        if c.feasible and budget_usd is not None and c.estimate.run.usd is not None and c.estimate.run.usd > budget_usd:
            c = replace(c, reason=f"over budget: ${c.estimate.run.usd:,.2f} > ${budget_usd:,.2f}")
        if c.feasible and deadline_hours is not None and c.estimate.run.hours > deadline_hours:
            c = replace(c, reason=f"over deadline: {c.estimate.run.hours:,.1f} h > {deadline_hours:g} h")
        return c
    return evaluate


def _targets(scn: Scenario, gpus: Sequence[str] | None, any_gpu: bool, max_gpus: int = 8) -> list[tuple[GpuSpec, int]]:
    if any_gpu:
        return [(gpu_from_catalog(k), max_gpus) for k in catalog.gpu_table() if catalog.prices_for(k)]
    if gpus:
        return [parse_gpu_budget(g, scn.cluster.gpu) for g in gpus]
    return [(scn.cluster.gpu, scn.cluster.world_size)]


def recommend(scn: Scenario, gpus: Sequence[str] | None = None, any_gpu: bool = False, max_gpus: int = 8,
              layouts: bool = False, budget_usd: float | None = None, deadline_hours: float | None = None, by: str = "time",
              space: SearchSpace = SearchSpace(), calibration: Calibration | str | None = None, top: int = 10,
              exhaustive: bool = False, time_budget_s: float | None = None, progress: Progress | None = None,
              on_row: Callable[[Candidate], None] | None = None, margin: float = 0.0,
              engine: str | None = None) -> Recommendation:
    """Search every mix x GPU count (x GPU type); return the `top` feasible ones ranked by time, cost or memory,
    the first rejected ones, exact counts per reason and an explanation of the winner. `exhaustive` estimates
    every candidate (same answer, slower); `on_row` receives every candidate in listing order (implies it).
    `time_budget_s` stops early with the best found so far and says how much of the space it covered. A candidate
    runs at the largest micro-batch that leaves `margin` of usable memory free; one that fits only inside the
    margin is tight and ranks after every one that does not. `max_gpus` is --any-gpu's largest count; `layouts`
    adds the parallel layouts of space.LAYOUTS to `space`. `engine` ("deepspeed" or "fsdp") searches only that
    launcher's sharding values."""
    started = time.perf_counter()
    if by not in RANK_BY:
        raise FtscopeError(f"--by must be one of {', '.join(RANK_BY)}; got {by!r}")
    for name, v in (("--budget-usd", budget_usd), ("--deadline-hours", deadline_hours), ("--time-budget", time_budget_s)):
        if v is not None and not v > 0:
            raise FtscopeError(f"{name} must be above 0; got {v}")
    if not 0 <= margin < 1:
        raise FtscopeError(f"--margin must be from 0 to below 1; got {margin}")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise FtscopeError(f"--top must be a positive integer; got {top!r}")
    if layouts:
        space = replace(space, **LAYOUTS)
    space = for_engine(space, engine)
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    wl = scn.workload
    global_batch = None if wl.solve_batch else int(wl.micro_batch_size) * wl.gradient_accumulation * replicas(scn)
    search = Engine(Space(scn, _targets(scn, gpus, any_gpu, max_gpus), space),
                    evaluator(global_batch, cal, budget_usd, deadline_hours, margin), lambda c: rank_key(c, by),
                    [Ranking("top", top), Ranking("deepspeed", 1, lambda mix: mix.zero_stage > 0)], by, cal,
                    budget_usd=budget_usd, deadline_hours=deadline_hours, global_batch=global_batch,
                    progress=progress, time_budget_s=time_budget_s, margin=margin)
    out = search.exhaustive(on_row) if (exhaustive or on_row is not None) else search.run()
    ranked = out.ranked["top"]
    best = ranked[0] if ranked else None
    summary = replace(out.summary, seconds=time.perf_counter() - started)
    return Recommendation(rows=ranked + out.rejected, best=best, by=by, summary=summary,
                          explanation=explain(best, out.neighbours, by) if best else [],
                          best_deepspeed=(out.ranked["deepspeed"] or [None])[0], engine=engine)


# ---- explanation --------------------------------------------------------------------------------------------

DIMENSIONS = tuple((d.label, lambda s, d=d: d.get(s.mix), d.show) for d in MIX_DIMENSIONS) + (
    ("GPU count", lambda s: s.cluster.world_size, lambda v: f"{v} GPU{'s' if v > 1 else ''}"),
    ("GPU type", lambda s: s.cluster.gpu.key, lambda v: v),
)


def differences(base: Scenario, other: Scenario) -> list[str]:
    """Each dimension along which `other` differs from `base`, in words ("sharding (ZeRO-3 instead of FSDP
    shard_grad_op)")."""
    return [f"{name} ({show(get(other))} instead of {show(get(base))})" for name, get, show in DIMENSIONS
            if get(other) != get(base)]


def gathered_gb_per_step(scn: Scenario) -> float:
    """Weight bytes ZeRO-3/FSDP all-gather per step on each GPU (full_shard / ZeRO-3: forward, backward, DeepSpeed's
    recompute, every micro-batch; shard_grad_op: once a step): what comm.data_parallel times, from the same
    functions."""
    mix, n = scn.mix, scn.cluster.world_size
    if n == 1 or mix.shard_stage < 2 or (mix.shard_stage == 2 and not mix.fsdp):
        return 0.0
    passes = gather_passes(scn) * scn.workload.gradient_accumulation if mix.shard_stage == 3 else 1
    return gathered_weight_bytes(scn) * (n - 1) / n * passes / 1e9


def _why(win: Estimate, other: Estimate) -> str:
    """The step-time component that moved most per sample between the winner and an alternative, in words."""
    def per_sample(e: Estimate) -> dict[str, float]:
        n = e.micro_batch_size * e.scenario.workload.gradient_accumulation * e.scenario.cluster.world_size
        return {k: v / n for k, v in e.time.breakdown_s.items()}

    a, b = per_sample(win), per_sample(other)
    comp = max(a, key=lambda k: abs(b[k] - a[k]))
    text = f"{comp} {win.time.breakdown_s[comp]:.2f} -> {other.time.breakdown_s[comp]:.2f} s per step"
    gb = gathered_gb_per_step(other.scenario)
    if comp == "communication" and gb:
        text += f" (ZeRO-3/FSDP all-gathers {gb:,.1f} GB of weights per step over {other.scenario.cluster.gpu.intra_node_link})"
    return text


def signed_percent(pct: float) -> str:
    """+2 %, -98 %, and 0 % (never -0 %) for a change that rounds to nothing."""
    text = f"{pct:.0f}"
    return "0 %" if text in ("0", "-0") else f"{pct:+.0f} %"


def signed_usd(usd: float) -> str:
    """+$0.77, -$1,234.50, and $0.00 (never $-0.00) for a difference that rounds to nothing."""
    text = f"{abs(usd):,.2f}"
    return f"${text}" if text == "0.00" else f"{'+' if usd > 0 else '-'}${text}"


def explain(best: Candidate, rows: Sequence[Candidate], by: str) -> list[str]:
    """Plain-words comparison of the winner with the best alternative along each dimension. `rows` holds the
    alternatives (at least every candidate one dimension away from the winner), ranked."""
    w = best.estimate
    ws = best.scenario
    lines = [f"best by {by}: {_label(ws)}, micro-batch {w.micro_batch_size} x grad-accum "
             f"{ws.workload.gradient_accumulation}: {w.run.hours:,.2f} h, "
             + (f"${w.run.usd:,.2f}, " if w.run.usd is not None else "")
             + f"peak {w.memory.peak_bytes / 2**30:.1f} GiB of {w.model_memory.capacity_bytes / 2**30:.1f} per GPU"]
    for name, get, show in DIMENSIONS:
        mine = get(ws)
        others = [c for c in rows if get(c.scenario) != mine and all(
            g(c.scenario) == g(ws) for n2, g, _ in DIMENSIONS if n2 != name)]
        if not others:
            continue
        alt = next((c for c in others if c.feasible), None)
        if alt is None:
            c = others[0]
            lines.append(f"{show(get(c.scenario))} instead of {show(mine)}: cannot run ({c.reason})")
            continue
        e = alt.estimate
        dt = (e.run.hours / w.run.hours - 1) * 100
        mem = f"peak {w.memory.peak_bytes / 2**30:.1f} -> {e.memory.peak_bytes / 2**30:.1f} GiB"
        cost = ""
        if e.run.usd is not None and w.run.usd is not None:
            cost = f", {signed_usd(e.run.usd - w.run.usd)}"
        lines.append(f"{show(get(alt.scenario))} instead of {show(mine)}: {signed_percent(dt)} time{cost}, {mem}; "
                     f"{_why(w, e)}")
    return lines


def best_deepspeed(rec: Recommendation) -> Candidate | None:
    """The best feasible candidate that runs under DeepSpeed ZeRO (for users who launch with deepspeed)."""
    return rec.best_deepspeed
