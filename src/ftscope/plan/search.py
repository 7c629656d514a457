"""plan: for every GPU type x GPUs per node, solve the largest micro-batch, estimate time and dollars, rank.

The IISWC study's Table IV (GPU, memory, max batch, throughput, $/h, hours, $) is the default view; unlike the
study, every row is predicted from the GPU's datasheet and the fitted efficiencies, without profiling it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Any, Callable, Sequence, overload

from .. import catalog
from ..errors import FtscopeError
from ..estimate import estimate
from ..estimate.efficiency import Calibration, load_calibration
from ..estimate.figures import Figures, grid_figures
from ..estimate.result import Estimate
from ..estimate.shared import Shared
from ..spec.hardware import gpu_from_catalog
from ..spec.scenario import Scenario, fast_replace
from .fixes import Fix, fixes_per_gpu

DEFAULT_COUNTS = (1, 2, 4, 8)
RANK_KEYS = ("cost", "time")


class Rows(Sequence[Estimate]):
    """A plan's ranked rows, each estimated when first read (a ranking reads only its figures: estimate/figures.py);
    the same Estimate object on every read. Equal to any sequence of the same estimates."""

    def __init__(self, scenarios: Sequence[Scenario], make: Callable[[Scenario], Estimate]) -> None:
        """`scenarios`: the rows' scenarios, in order (a sequence that may make each when first read)."""
        self._scenarios = scenarios
        self._made: list[Estimate | None] = [None] * len(scenarios)
        self._make = make

    def __len__(self) -> int:
        return len(self._made)

    @overload
    def __getitem__(self, i: int) -> Estimate: ...
    @overload
    def __getitem__(self, i: slice) -> list[Estimate]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        est = self._made[i]
        if est is None:  # two threads may both build it: equal estimates, either stays
            est = self._made[i] = self._make(self._scenarios[i])
        return est

    def scenario(self, i: int) -> Scenario:
        """Row i's scenario, without estimating it."""
        return self._scenarios[i]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __repr__(self) -> str:
        return f"Rows({len(self)} candidates)"

    def __reduce__(self):  # pickled and copied as the plain list of its estimates
        return (list, (list(self),))


@dataclass(frozen=True)
class Plan:
    """Every candidate (feasible or not, with the reason), ranked; the best; the cost/time Pareto frontier."""

    rows: Sequence[Estimate]
    feasible: bool
    """Some candidate fits: the first row is then the best."""
    pareto: list[int] = field(default_factory=list)
    """Indices into rows of candidates no other candidate beats on both hours and dollars."""
    by: str = "cost"
    margin: float = 0.0
    fix_memo: dict = field(default_factory=dict, repr=False, compare=False)
    """The fixes' shared work (plan/fixes.py)."""

    @cached_property
    def best(self) -> Estimate | None:
        """The first row when it fits (estimated when first read: a sweep of plans may rank without it)."""
        return self.rows[0] if self.feasible else None

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


_INF = float("inf")
_MISFIT_KEY = (2, _INF, _INF)


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
    return pareto_points([(e.run.hours, e.run.usd) if e.fits and e.run is not None and e.run.usd is not None
                          else None for e in rows])


def pareto_points(points: Sequence[tuple[float, float] | None]) -> list[int]:
    """pareto_front of rows given as (hours, dollars), None for a row that does not fit or has no price."""
    pts = sorted([(p[0], p[1], i) for i, p in enumerate(points) if p is not None])
    front = []
    cheapest_faster = lowest = float("inf")  # the lowest dollars of the rows strictly faster than the group at hand
    hours = None
    for h, u, i in pts:  # groups of equal hours, as itertools.groupby makes them (`is` or ==)
        if not (h is hours or h == hours):  # a new group (sorted: its cheapest comes first)
            if lowest < cheapest_faster:  # min(cheapest_faster, the last group's lowest)
                cheapest_faster = lowest
            hours, lowest = h, u
        # a row is beaten by a faster one no dearer, or by an equally fast one strictly cheaper
        if cheapest_faster > u and not lowest < u:
            front.append(i)
    front.sort()
    return front


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
    shared = _sweep(scn, solve_batch)
    sites = _sites(gpus, counts, nodes, shared.scenario.cluster.inter_node_gbs)
    cands = _Candidates(shared.scenario, sites)
    # a repeated plan (the same sweep, sites, margin and key: `ftscope serve`, a sweep over layouts) reads it back
    order, feasible, front = shared.get(("ranking", id(cal), margin, by, id(sites)),
                                        lambda: _ranking(shared, sites, cands, margin, by, cal), cal, sites)
    rows = Rows(cands.reordered(order), lambda c: estimate_with_margin(c, margin, cal, shared))
    return Plan(rows=rows, feasible=feasible, pareto=list(front), by=by, margin=margin,
                fix_memo=shared.get(("fixes",), dict))


def _ranking(shared: Shared, sites: Sequence[tuple], cands: "_Candidates", margin: float, by: str,
             cal: Calibration) -> tuple[list[int], bool, list[int]]:
    """(the candidates' order, whether the first fits, the Pareto front as indices into that order) of a plan."""
    figs = grid_figures(shared, sites, margin, cal, cands.at_site)  # in the listing's order: site i is cands[i]
    if None in figs:
        for i, f in enumerate(figs):
            if f is None:  # a figure that is not a finite number: the estimate's own checks say which
                figs[i] = _figures_of(estimate_with_margin(cands[i], margin, cal, shared))
    # the _rank_key of each candidate's estimate, from its figures (fits, tight, hours, usd, does_not_fit)
    if by == "cost":
        keys = [((1 if tight else 0), (_INF if usd is None else usd), hours) if fits else _MISFIT_KEY
                for fits, tight, hours, usd, _ in figs]
    else:
        keys = [((1 if tight else 0), hours, (_INF if usd is None else usd)) if fits else _MISFIT_KEY
                for fits, tight, hours, usd, _ in figs]
    order = sorted(range(len(figs)), key=keys.__getitem__)  # stable: equal keys keep the listing order, as
    ranked = [figs[i] for i in order]  # sorting the estimates did
    front = pareto_points([(hours, usd) if fits and usd is not None else None for fits, _, hours, usd, _ in ranked])
    return order, bool(ranked) and ranked[0].fits, front


_SITES: dict[tuple, tuple] = {}
"""A plan's sites by (GPU names or None, counts, nodes, network GB/s per GPU, the catalog's tables by identity): the
plans of every mix over one layout list the same ones."""


def _sites(gpus: Sequence[str] | None, counts: list[int], nodes: int, inter: float) -> tuple:
    """(GPU type, GPUs per node, nodes, network) of each candidate: every GPU of candidate_gpus(gpus) x counts."""
    names = tuple(gpus) if gpus else None
    key = (names, tuple(counts), nodes, inter, id(catalog.gpu_table()), id(catalog.price_list()))
    hit = _SITES.get(key)
    if hit is None:
        if len(_SITES) >= 1024:
            _SITES.clear()
        sites = tuple((gpu, count, nodes, inter) for gpu in map(_catalog_gpu, candidate_gpus(names))
                      for count in counts)
        hit = _SITES[key] = (catalog.gpu_table(), catalog.price_list(), sites)  # the tables kept alive with their ids
    return hit[2]


class _Candidates(Sequence[Scenario]):
    """A plan's candidate scenarios: the sweep's scenario on each site (GPU type, GPUs per node, nodes, network),
    each made when first read (a ranking reads none of them; a table, a few)."""

    def __init__(self, base: Scenario, sites: Sequence[tuple], order: list[int] | None = None,
                 made: dict[int, Scenario] | None = None) -> None:
        self._base, self._sites = base, sites
        self._order = order if order is not None else range(len(sites))
        self._made: dict[int, Scenario] = made if made is not None else {}  # by site

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.at_site(self._order[i])

    def at_site(self, site: int) -> Scenario:
        """The candidate on sites[site] (the listing's i-th: what grid_figures reads)."""
        scn = self._made.get(site)
        if scn is None:
            gpu, count, nodes, _ = self._sites[site]
            base = self._base  # base.with_(gpu=..., gpus_per_node=..., nodes=...)
            scn = self._made[site] = fast_replace(base, cluster=_cluster(base.cluster, gpu, count, nodes))
        return scn

    def reordered(self, order: list[int]) -> "_Candidates":
        """The same candidates in this order (of listing indices), sharing the ones already made."""
        mine = self._order  # range(len(sites)) when in the listing's order: then the order is the sites'
        return _Candidates(self._base, self._sites, order if isinstance(mine, range) else [mine[i] for i in order],
                           self._made)


_CLUSTERS: dict[tuple, tuple] = {}
"""The candidates' clusters by (base cluster, GPU type, GPUs per node, nodes), the first two by id (kept alive in the
value): the plans of every mix of one scenario place their candidates on the same clusters."""


def _cluster(base, gpu, count: int, nodes: int):
    """fast_replace(base, gpu=gpu, gpus_per_node=count, nodes=nodes), one object per value."""
    key = (id(base), id(gpu), count, nodes)
    hit = _CLUSTERS.get(key)
    if hit is None or hit[0] is not base or hit[1] is not gpu:
        if len(_CLUSTERS) >= 4096:
            _CLUSTERS.clear()
        hit = _CLUSTERS[key] = (base, gpu, fast_replace(base, gpu=gpu, gpus_per_node=count, nodes=nodes))
    return hit[2]


def _figures_of(est: Estimate) -> Figures:
    """An estimate's ranking figures (for the rare candidate rank_figures leaves to the estimate)."""
    fits = est.fits and est.time is not None
    dnf = (est.reason or "").startswith("does not fit")
    if not fits:
        return Figures(False, False, None, None, dnf)
    return Figures(True, est.status == "tight", est.run.hours, est.run.usd, dnf)


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
    rows = p.rows
    for i in range(len(rows)):  # Rows knows each row's scenario without estimating it
        scn = rows.scenario(i) if isinstance(rows, Rows) else rows[i].scenario
        key = scn.cluster.gpu.key
        if key not in seen:
            seen.add(key)
            out.append(rows[i])
    return out
