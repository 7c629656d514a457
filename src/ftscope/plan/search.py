"""plan: for every GPU type x GPUs per node, solve the largest micro-batch, estimate time and dollars, rank.

The IISWC study's Table IV (GPU, memory, max batch, throughput, $/h, hours, $) is the default view; unlike the
study, every row is predicted from the GPU's datasheet and the fitted efficiencies, without profiling it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from itertools import groupby
from typing import Any, Sequence

from .. import catalog
from ..errors import FtscopeError
from ..estimate import estimate
from ..estimate.efficiency import Calibration, load_calibration
from ..estimate.result import Estimate
from ..estimate.shared import Shared
from ..spec.hardware import gpu_from_catalog
from ..spec.scenario import Scenario, fast_replace
from .fixes import Fix, fixes_per_gpu

DEFAULT_COUNTS = (1, 2, 4, 8)
RANK_KEYS = ("cost", "time")


@dataclass(frozen=True)
class Plan:
    """Every candidate (feasible or not, with the reason), ranked; the best; the cost/time Pareto frontier."""

    rows: list[Estimate]
    best: Estimate | None
    pareto: list[int] = field(default_factory=list)
    """Indices into rows of candidates no other candidate beats on both hours and dollars."""
    by: str = "cost"
    margin: float = 0.0
    fix_memo: dict = field(default_factory=dict, repr=False, compare=False)
    """The fixes' shared work (plan/fixes.py)."""

    @cached_property
    def fixes(self) -> dict[str, list[Fix]]:
        """Per GPU type on which nothing fits: the single changes (checkpointing, ZeRO-3, QLoRA, more GPUs) that fit
        (tried when first read: a ranking does not need them)."""
        return fixes_per_gpu(self.rows, self.margin, self.fix_memo)

    def to_dict(self) -> dict[str, Any]:
        rows = []
        front = set(self.pareto)
        for i, est in enumerate(self.rows):
            d = est.to_dict()
            d["pareto"] = i in front
            rows.append(d)
        return {"rows": rows, "best": self.best.to_dict() if self.best else None, "by": self.by,
                "fixes": {gpu: [f.to_dict() for f in found] for gpu, found in self.fixes.items()}}


def _rank_key(est: Estimate, by: str) -> tuple:
    """(tier, primary, secondary): tier 0 fits with the margin free, 1 tight, 2 cannot run."""
    if not est.fits or est.time is None:
        return (2, float("inf"), float("inf"))
    hours = est.run.hours if est.run else float("inf")
    usd = est.run.usd if (est.run and est.run.usd is not None) else float("inf")
    tier = 1 if est.status == "tight" else 0
    return (tier, usd, hours) if by == "cost" else (tier, hours, usd)


def estimate_with_margin(cand: Scenario, margin: float, cal: Calibration, shared: Shared | None = None) -> Estimate:
    """The candidate at the largest micro-batch that leaves `margin` of usable memory free; when none does (or the
    batch is fixed), as it is, tight when it eats into the margin (Estimate.status). `shared`: the sweep's memo."""
    if margin and cand.workload.solve_batch:
        est = estimate(cand, margin=margin, strict=False, calibration=cal, tight_margin=margin, shared=shared)
        if est.fits or not (est.reason or "").startswith("does not fit"):
            return est
    return estimate(cand, strict=False, calibration=cal, tight_margin=margin, shared=shared)


def pareto_front(rows: Sequence[Estimate]) -> list[int]:
    """Indices of feasible rows with a price that no other row beats on both hours and dollars."""
    pts = sorted((e.run.hours, e.run.usd, i) for i, e in enumerate(rows)
                 if e.fits and e.run is not None and e.run.usd is not None)
    front = []
    cheapest_faster = float("inf")  # the lowest dollars of the rows strictly faster than the group at hand
    for _, group in groupby(pts, key=lambda p: p[0]):
        group = list(group)
        lowest = group[0][1]  # sorted: the group's cheapest comes first
        # a row is beaten by a faster one no dearer, or by an equally fast one strictly cheaper
        front += [i for _, u, i in group if cheapest_faster > u and not lowest < u]
        cheapest_faster = min(cheapest_faster, lowest)
    return sorted(front)


def candidate_gpus(gpus: Sequence[str] | None) -> list[str]:
    """Catalog keys to search: the named ones, or every GPU with a price."""
    if gpus:
        return [catalog.resolve_gpu_name(g) for g in gpus]
    return [k for k in catalog.gpu_table() if catalog.prices_for(k)]


def plan(scn: Scenario, gpus: Sequence[str] | None = None, counts: Sequence[int] = DEFAULT_COUNTS,
         max_gpus: int | None = None, nodes: int = 1, by: str = "cost", solve_batch: bool = True,
         calibration: Calibration | str | None = None, margin: float = 0.0) -> Plan:
    """Estimate the scenario on each GPU type and count; the micro-batch is solved (the largest that leaves
    `margin` of usable memory free) unless solve_batch is False. Tight candidates (inside the margin) rank after
    the others; unsupported mixes and misfits stay in the rows, last, with their reason."""
    if not 0 <= margin < 1:
        raise FtscopeError(f"--margin must be from 0 to below 1; got {margin}")
    if by not in RANK_KEYS:
        raise FtscopeError(f"--by must be one of {', '.join(RANK_KEYS)}; got {by!r}")
    counts = [c for c in counts if max_gpus is None or c * nodes <= max_gpus]
    if not counts:
        raise FtscopeError(f"no GPU count fits --max-gpus {max_gpus}")
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    rows: list[Estimate] = []
    shared = _sweep(scn, solve_batch)
    base = shared.scenario
    for key in candidate_gpus(gpus):
        gpu = _catalog_gpu(key)
        for count in counts:  # base.with_(gpu=..., gpus_per_node=..., nodes=...), without sorting the names
            cand = fast_replace(base, cluster=fast_replace(base.cluster, gpu=gpu, gpus_per_node=count, nodes=nodes))
            rows.append(estimate_with_margin(cand, margin, cal, shared))
    rows.sort(key=lambda e: _rank_key(e, by))
    best = rows[0] if rows and rows[0].fits and rows[0].time is not None else None
    return Plan(rows=rows, best=best, pareto=pareto_front(rows), by=by, margin=margin,
                fix_memo=shared.get(("fixes",), dict))


_catalog_gpu = lru_cache(maxsize=None)(gpu_from_catalog)
"""One GpuSpec per catalog GPU (the catalog is read once): the sweeps' memos know a GPU type by its object."""
_SWEEPS: dict[tuple, Shared] = {}
"""The shared work of the plans of one scenario (by value): plans over other counts and nodes reuse what does not
depend on them (support and price per GPU type, pass times per GPU and micro-batch)."""


def _sweep(scn: Scenario, solve_batch: bool) -> Shared:
    key = (scn, solve_batch)
    hit = _SWEEPS.get(key)
    if hit is None:
        if len(_SWEEPS) >= 64:
            _SWEEPS.clear()
        hit = _SWEEPS[key] = Shared(scn.with_(micro_batch_size="max") if solve_batch else scn)
    return hit


def one_row_per_gpu(p: Plan) -> list[Estimate]:
    """The best-ranked row of each GPU type (the IISWC Table IV view)."""
    seen: set[str] = set()
    out = []
    for est in p.rows:
        key = est.scenario.cluster.gpu.key
        if key not in seen:
            seen.add(key)
            out.append(est)
    return out
