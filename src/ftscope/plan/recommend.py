"""recommend: search every valid optimization mix on the user's model, data and GPUs; rank; explain.

Singh et al. (2024) give rules (ZeRO-2 + LoRA by default, ZeRO-3 + LoRA + checkpointing for the largest
models, FlashAttention for long context). Here the rules are replaced by a search with the estimator, so the
answer fits the actual model, sequence lengths, GPU and count, and every rejected mix keeps its reason.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Sequence

from .. import catalog
from ..errors import FtscopeError
from ..estimate import estimate, unsupported_reason
from ..estimate.efficiency import Calibration, load_calibration
from ..estimate.memory import NF4_BYTES, memory_model
from ..estimate.result import Estimate
from ..spec.hardware import GpuSpec, gpu_from_catalog
from ..spec.mix import Mix, check_mix
from ..spec.scenario import Scenario
from ..estimate.solvers import max_micro_batch

RANK_BY = ("time", "cost", "memory")
SHARDING = ((0, None), (1, None), (2, None), (3, None), (0, "full_shard"), (0, "shard_grad_op"))


@dataclass(frozen=True)
class SearchSpace:
    """The mix dimensions recommend enumerates (the scenario's LoRA rank and targets are kept)."""

    methods: tuple[str, ...] = ("full", "lora", "qlora")
    gradient_checkpointing: tuple[bool, ...] = (False, True)
    sharding: tuple[tuple[int, str | None], ...] = SHARDING
    offload: tuple[str, ...] = ("none", "optimizer", "optimizer+params")
    attention: tuple[str, ...] = ("eager", "sdpa", "flash")
    optimizer: tuple[str, ...] = ("adamw", "adamw_8bit")
    experts_backend: tuple[str, ...] = ("eager", "batched_mm", "grouped_mm", "modules")


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
    """Feasible candidates ranked first, then the rejected ones with their reasons."""
    best: Candidate | None
    explanation: list[str] = field(default_factory=list)
    by: str = "time"

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [c.to_dict() for c in self.rows], "best": self.best.to_dict() if self.best else None,
                "by": self.by, "explanation": self.explanation,
                "counts": {"candidates": len(self.rows), "feasible": sum(c.feasible for c in self.rows)}}


def _label(scn: Scenario) -> str:
    return f"{scn.cluster.world_size}x {scn.cluster.gpu.key} | {scn.mix.label()}"


def parse_gpu_budget(spec: str) -> tuple[GpuSpec, int]:
    """'a100-80gb:8' -> (A100-80GB, up to 8 GPUs); a bare name means up to 8."""
    name, _, count = spec.partition(":")
    try:
        n = int(count) if count else 8
    except ValueError:
        raise FtscopeError(f"--gpus takes NAME:COUNT like a100-80gb:8; got {spec!r}") from None
    if not 1 <= n <= 4096:
        raise FtscopeError(f"GPU count in {spec!r} must be from 1 to 4096")
    return gpu_from_catalog(name), n


def _counts(limit: int) -> list[int]:
    out = [c for c in (1, 2, 4, 8) if c <= limit]
    if limit not in out and limit > 8:
        out.append(limit)
    return out


def _mixes(scn: Scenario, space: SearchSpace) -> Iterator[Mix]:
    backends = space.experts_backend if scn.model.is_moe else (scn.mix.experts_backend,)
    for method, gc, (zero, fsdp), off, att, opt, be in itertools.product(
            space.methods, space.gradient_checkpointing, space.sharding, space.offload, space.attention,
            space.optimizer, backends):
        yield replace(scn.mix, method=method, gradient_checkpointing=gc, zero_stage=zero, fsdp=fsdp, offload=off,
                      attention=att, optimizer=opt, experts_backend=be)


def mix_reason(scn: Scenario) -> str | None:
    try:
        check_mix(scn.mix)
    except FtscopeError as exc:
        return f"unsupported: {exc}"
    if scn.model.is_moe and scn.mix.experts_backend == "grouped_mm" and scn.mix.precision in ("fp32", "fp16-mixed"):
        return "unsupported: grouped_mm needs bf16"
    reason = unsupported_reason(scn)
    return f"unsupported: {reason}" if reason else None


def _evaluate(cand: Scenario, global_batch: int | None, cal: Calibration) -> Candidate:
    reason = mix_reason(cand)
    if reason:
        return Candidate(cand, None, reason)
    world = cand.cluster.world_size
    mem = memory_model(cand)
    mb_max = max_micro_batch(mem, cand.workload.peak_seq_len())
    if mb_max == 0:
        est = estimate(cand.with_(micro_batch_size=1), strict=False, calibration=cal)
        return Candidate(cand, est, est.reason)
    if global_batch is None:
        mb, ga = mb_max, cand.workload.gradient_accumulation
    else:  # keep the scenario's global batch: same optimization, different layout
        mb = max(1, min(mb_max, global_batch // world))
        ga = max(1, math.ceil(global_batch / (mb * world)))
    est = estimate(cand.with_(micro_batch_size=mb, gradient_accumulation=ga), strict=False, calibration=cal)
    return Candidate(est.scenario, est, est.reason)


def complexity(scn: Scenario) -> int:
    """How much machinery a mix needs; among equally good candidates the simpler one wins."""
    mix = scn.mix
    return (mix.shard_stage + (1 if mix.fsdp else 0) + {"none": 0, "optimizer": 2, "optimizer+params": 4}[mix.offload]
            + (1 if mix.optimizer != "adamw" else 0) + (1 if mix.attention == "flash" else 0)
            + (1 if mix.method == "qlora" else 0) + (1 if mix.gradient_checkpointing else 0))


def _tie(x: float) -> float:
    """Round to 3 significant digits: differences below ~0.5 % are noise in an estimate."""
    return float(f"{x:.3g}") if math.isfinite(x) else x


def _key(c: Candidate, by: str) -> tuple:
    if not c.feasible:
        return (1, 0.0, 0, 0.0)
    e = c.estimate
    usd = e.run.usd if e.run.usd is not None else math.inf
    primary = {"memory": e.memory.peak_bytes, "cost": usd, "time": e.run.hours}[by]
    return (0, _tie(primary), complexity(c.scenario), primary)


def recommend(scn: Scenario, gpus: Sequence[str] | None = None, any_gpu: bool = False,
              budget_usd: float | None = None, deadline_hours: float | None = None, by: str = "time",
              space: SearchSpace = SearchSpace(), calibration: Calibration | str | None = None) -> Recommendation:
    """Evaluate every mix x GPU count (x GPU type) and rank the feasible ones by time, cost or memory."""
    if by not in RANK_BY:
        raise FtscopeError(f"--by must be one of {', '.join(RANK_BY)}; got {by!r}")
    for name, v in (("--budget-usd", budget_usd), ("--deadline-hours", deadline_hours)):
        if v is not None and not v > 0:
            raise FtscopeError(f"{name} must be above 0; got {v}")
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    if any_gpu:
        targets = [(gpu_from_catalog(k), 8) for k in catalog.gpu_table() if catalog.prices_for(k)]
    elif gpus:
        targets = [parse_gpu_budget(g) for g in gpus]
    else:
        targets = [(scn.cluster.gpu, scn.cluster.world_size)]
    wl = scn.workload
    global_batch = None if wl.solve_batch else int(wl.micro_batch_size) * wl.gradient_accumulation * scn.cluster.world_size
    rows: list[Candidate] = []
    for gpu, limit in targets:
        for count in _counts(limit):
            base = scn.with_(gpu=gpu, gpus_per_node=count, nodes=1)
            for mix in _mixes(base, space):
                cand = replace(base, mix=mix)
                c = _evaluate(cand, global_batch, cal)
                if c.feasible and budget_usd is not None and c.estimate.run.usd is not None and c.estimate.run.usd > budget_usd:
                    c = replace(c, reason=f"over budget: ${c.estimate.run.usd:,.2f} > ${budget_usd:,.2f}")
                if c.feasible and deadline_hours is not None and c.estimate.run.hours > deadline_hours:
                    c = replace(c, reason=f"over deadline: {c.estimate.run.hours:,.1f} h > {deadline_hours:g} h")
                rows.append(c)
    rows.sort(key=lambda c: _key(c, by))
    best = rows[0] if rows and rows[0].feasible else None
    return Recommendation(rows=rows, best=best, explanation=explain(best, rows, by) if best else [], by=by)


# ---- explanation --------------------------------------------------------------------------------------------

DIMENSIONS = (
    ("method", lambda s: s.mix.method, lambda v: {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA"}[v]),
    ("gradient checkpointing", lambda s: s.mix.gradient_checkpointing, lambda v: "with checkpointing" if v else "without checkpointing"),
    ("sharding", lambda s: (s.mix.zero_stage, s.mix.fsdp), lambda v: f"FSDP {v[1]}" if v[1] else (f"ZeRO-{v[0]}" if v[0] else "no sharding (DDP)")),
    ("offload", lambda s: s.mix.offload, lambda v: "no offload" if v == "none" else f"{v} offload"),
    ("attention", lambda s: s.mix.attention, lambda v: f"{v} attention"),
    ("optimizer", lambda s: s.mix.optimizer, lambda v: v),
    ("experts backend", lambda s: s.mix.experts_backend, lambda v: f"experts {v}"),
    ("GPU count", lambda s: s.cluster.world_size, lambda v: f"{v} GPU{'s' if v > 1 else ''}"),
    ("GPU type", lambda s: s.cluster.gpu.key, lambda v: v),
)


def gathered_gb_per_step(scn: Scenario) -> float:
    """Weight bytes ZeRO-3/FSDP all-gather per step on each GPU (forward, recompute, backward)."""
    if scn.mix.shard_stage != 3 or scn.cluster.world_size == 1:
        return 0.0
    per_param = NF4_BYTES if scn.mix.method == "qlora" else 2.0
    passes = 3 if scn.mix.gradient_checkpointing else 2
    n = scn.cluster.world_size
    return scn.model.total_params * per_param * (n - 1) / n * passes * scn.workload.gradient_accumulation / 1e9


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


def explain(best: Candidate, rows: Sequence[Candidate], by: str) -> list[str]:
    """Plain-words comparison of the winner with the best alternative along each dimension."""
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
            cost = f", ${e.run.usd - w.run.usd:+,.2f}"
        lines.append(f"{show(get(alt.scenario))} instead of {show(mine)}: {dt:+.0f} % time{cost}, {mem}; {_why(w, e)}")
    return lines


def best_deepspeed(rec: Recommendation) -> Candidate | None:
    """The best feasible candidate that runs under DeepSpeed ZeRO (for users who launch with deepspeed)."""
    return next((c for c in rec.rows if c.feasible and c.scenario.mix.zero_stage > 0), None)
