"""The search behind recommend: the same answer as estimating every candidate, from a small fraction of estimates.

Classify (every mix once, vectorized over the GPU blocks with numpy): refused combinations (`check_mix` reads
only the mix), unsupported on a GPU type (`unsupported_reason` reads the GPU and the mix, not the count), does
not fit at micro-batch 1 (one memory model per mix and GPU count, see bounds.py). Every candidate gets a
status, so the counts per reason are exact without an estimate.
Rank: per ranking, the candidates that fit in increasing order of a cheap lower bound on their ranking key
(bounds.py, rules 1-3); a candidate whose bound could enter the top-k gets the sharper bound (rule 4), then,
if that could too, an exact estimate (the same `evaluate` the exhaustive search runs). The loop stops at the
first cheap bound that cannot enter: `tie` rounding is monotone, so a bound whose rounded value is above the
k-th key's is above every key left. Equal keys keep listing order (the candidate number), as the old stable sort did. With a budget or a
deadline, candidates whose bound is already over are counted with that reason; the rest are estimated, so the
feasible count stays exact.
Every exact estimate is checked against its bound and against its classification; if any disagrees (an
estimator change broke an assumption) the search repeats exhaustively and says so.
"""
from __future__ import annotations

import bisect
import gc
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from ..estimate.cost import price_of
from ..estimate.efficiency import Calibration
from .bounds import refined_hours
from .classify import (FEASIBLE, FITS, NO_FIT, OVER_BUDGET, OVER_DEADLINE, UNSEARCHED, UNSUPPORTED,
                       Classification, classify)
from .ranking import tie
from .space import Space

REASONS = {UNSUPPORTED: "unsupported", NO_FIT: "does not fit", OVER_BUDGET: "over budget", OVER_DEADLINE: "over deadline"}
REJECTED = tuple(REASONS)

SCAN_SHARE, BOUND_SHARE = 0.35, 0.7
"""With a time budget, the shares of it by which the pass over the mixes and then the time bounds of what it saw
stop: the exact estimates that rank them take the rest (a scan that took all of it would leave nothing ranked)."""

Progress = Callable[[str, int, int | None], None]
"""progress(stage, done, total): 'classify' and 'exhaustive' count candidates, 'limits' the ones held to a budget
or deadline; 'estimate' counts exact estimates (total None: not known in advance)."""


def status_of(reason: str | None) -> int:
    """The status code of an evaluated candidate's reason."""
    if reason is None:
        return FEASIBLE
    for code, prefix in REASONS.items():
        if reason.startswith(prefix):
            return code
    return UNSUPPORTED


@dataclass(frozen=True)
class Ranking:
    """One ranked list the search keeps: its length and which mixes may enter it."""

    name: str
    k: int
    accept: Callable[[Any], bool] | None = None
    """A filter on the Mix (None: every candidate)."""


class TopK:
    """The k smallest (key, candidate number) pairs seen, in order: bounded, whatever the space size."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.items: list[tuple[tuple, int, Any]] = []

    def push(self, key: tuple, idx: int, item: Any) -> None:
        if self.full and (key, idx) >= self.items[-1][:2]:
            return
        bisect.insort(self.items, (key, idx, item), key=lambda t: t[:2])
        del self.items[self.k:]

    @property
    def full(self) -> bool:
        return len(self.items) >= self.k

    @property
    def worst(self) -> tuple[tuple, int]:
        return self.items[-1][:2]


@dataclass(frozen=True)
class SearchSummary:
    """Exact counts over the whole space, and how the search got them."""

    candidates: int = 0
    feasible: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    """Candidates that cannot run, per reason: unsupported, does not fit, over budget, over deadline."""
    unsearched: int = 0
    """Candidates a time budget left unclassified (not in any count above)."""
    covered: float = 1.0
    """Fraction of the space whose standing is settled: classified, and estimated or proven unable to rank."""
    estimates: int = 0
    """Exact estimates the search ran."""
    exhaustive: bool = False
    bound_violations: int = 0
    """Exact estimates below their bound or off their classification (then the search ran exhaustively)."""
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        return self.covered >= 1.0

    def counts(self) -> dict[str, Any]:
        return {"candidates": self.candidates, "feasible": self.feasible, "reasons": dict(self.reasons),
                "unsearched": self.unsearched}

    def search(self) -> dict[str, Any]:
        return {"complete": self.complete, "covered": round(self.covered, 6), "estimates": self.estimates,
                "exhaustive": self.exhaustive, "bound_violations": self.bound_violations,
                "seconds": round(self.seconds, 3)}


@dataclass
class Outcome:
    """What a search found: ranked lists, the first rejected candidates, exact counts and coverage."""

    ranked: dict[str, list[Any]]
    rejected: list[Any]
    """The first rejected candidates in listing order (as many as the first ranking holds)."""
    neighbours: list[Any]
    """Candidates one dimension away from the best, ranked (for the explanation)."""
    summary: SearchSummary


def _first_rejected(np, cls: Classification, k: int) -> list[int]:
    """The first k candidate numbers, in listing order, that are rejected: those of the columns' rejected
    statuses and every candidate of a dead mix, merged block by block."""
    out: list[int] = []
    nm, status = cls.mixes_per_block, cls.status
    for b in range(status.shape[0]):
        if len(out) >= k:
            break
        want = k - len(out)  # both ascend: the first `want` of their union are among each one's first `want`
        cols = cls.columns[np.isin(status[b], REJECTED)][:want]
        out += (np.union1d(cols, cls.dead[:want])[:want] + b * nm).tolist()
    return out


class Engine:
    """One search over a Space. `evaluate(scenario)` is the exact estimate of one candidate; `key(candidate)`
    its ranking key ((1, ...) when it cannot run)."""

    def __init__(self, space: Space, evaluate: Callable[[Any], Any], key: Callable[[Any], tuple],
                 rankings: Sequence[Ranking], by: str, calibration: Calibration, budget_usd: float | None = None,
                 deadline_hours: float | None = None, global_batch: int | None = None,
                 progress: Progress | None = None, time_budget_s: float | None = None, margin: float = 0.0) -> None:
        self.space, self._evaluate, self.key, self.rankings = space, evaluate, key, list(rankings)
        self.by, self.cal, self.budget, self.deadline = by, calibration, budget_usd, deadline_hours
        self.global_batch, self.progress, self.margin = global_batch, progress, margin
        now = time.perf_counter()
        self.stop_at = None if time_budget_s is None else now + time_budget_s
        self.scan_until, self.bound_until = ((None, None) if time_budget_s is None else
                                             (now + SCAN_SHARE * time_budget_s, now + BOUND_SHARE * time_budget_s))
        self.cache: dict[int, Any] = {}
        self.estimates = 0
        self.refined: dict[int, tuple[float, float, float]] = {}
        self.violations = 0

    # ---- shared -------------------------------------------------------------------------------------------
    def _out_of_time(self) -> bool:
        return self.stop_at is not None and time.perf_counter() > self.stop_at

    def evaluate(self, idx: int, keep: bool = True) -> Any:
        c = self.cache.get(idx)
        if c is None:
            self.estimates += 1
            c = self._evaluate(self.space.candidate(idx))
            if keep:
                self.cache[idx] = c
        return c

    def _finish(self, ranked: dict[str, TopK], rejected: Iterable[int], tally: dict[int, int], classified: int,
                settled: int, exhaustive: bool) -> Outcome:
        lists = {name: [item for _, _, item in top.items] for name, top in ranked.items()}
        top = ranked[self.rankings[0].name].items
        neighbours: list[Any] = []
        if top:
            ids = self.space.neighbours(top[0][1])
            neighbours = [c for _, _, c in sorted(((self.key(self.evaluate(i)), i, self.evaluate(i)) for i in ids),
                                                  key=lambda t: t[:2])]
        total = len(self.space)
        summary = SearchSummary(candidates=total, feasible=tally[FEASIBLE],
                                reasons={REASONS[c]: tally[c] for c in REJECTED}, unsearched=total - classified,
                                covered=settled / max(total, 1), estimates=self.estimates, exhaustive=exhaustive,
                                bound_violations=self.violations)
        return Outcome(lists, [self.evaluate(i) for i in rejected], neighbours, summary)

    # ---- exhaustive reference -------------------------------------------------------------------------------
    def exhaustive(self, on_row: Callable[[Any], None] | None = None) -> Outcome:
        """Estimate every candidate (the reference the pruned search must equal; `--all` streams it)."""
        ranked = {r.name: TopK(r.k) for r in self.rankings}
        want = self.rankings[0].k
        rejected: list[int] = []
        tally = {code: 0 for code in (FEASIBLE, *REJECTED)}
        total, done = len(self.space), 0
        for idx in range(total):
            if idx % 2048 == 0:
                if self.progress:
                    self.progress("exhaustive", idx, total)
                if self._out_of_time():
                    break
            c = self.evaluate(idx, keep=False)
            done += 1
            code = status_of(c.reason)
            tally[code] += 1
            if on_row:
                on_row(c)
            if code == FEASIBLE:
                key = self.key(c)
                for r in self.rankings:
                    if r.accept is None or r.accept(c.scenario.mix):
                        ranked[r.name].push(key, idx, c)
            elif len(rejected) < want:
                rejected.append(idx)
        return self._finish(ranked, rejected, tally, done, done, exhaustive=True)

    # ---- pruned search --------------------------------------------------------------------------------------
    def run(self) -> Outcome:
        with _collector_paused():
            out = self._pruned()
        if out is None:  # an estimate broke its bound: the exhaustive search, with the collector at work
            self.cache.clear()
            out = self.exhaustive()
        return out

    def _pruned(self) -> Outcome | None:
        """The pruned search's outcome; None when an exact estimate disagreed with its bound or classification."""
        import numpy as np

        cls, _ = classify(np, self.space, self.by, self.cal, {r.name: r.accept for r in self.rankings},
                          self.global_batch, self.bound_until, self.progress, self.margin,
                          scan_until=self.scan_until)
        status = cls.status
        self._settle_limits(np, cls)
        ranked = {}
        unsettled = 0
        for r in self.rankings:
            top, left = self._rank(np, r, cls)
            ranked[r.name] = top
            unsettled = max(unsettled, left)
        if self.violations:
            return None
        flat = status.ravel()
        dead = len(cls.dead) * len(self.space.blocks)  # the candidates of mixes no block can run: unsupported
        rejected = _first_rejected(np, cls, self.rankings[0].k)
        tally = {code: int((flat == code).sum()) for code in (FEASIBLE, *REJECTED)}
        tally[UNSUPPORTED] += dead
        classified = int((flat != UNSEARCHED).sum()) + dead
        return self._finish(ranked, rejected, tally, classified, classified - unsettled, exhaustive=False)

    def _settle_limits(self, np, cls: Classification) -> None:
        """FITS becomes FEASIBLE, OVER_BUDGET or OVER_DEADLINE: by the bounds where they decide, else exactly."""
        status = cls.status
        fits = status == FITS
        if self.budget is None and self.deadline is None:
            status[fits] = FEASIBLE
            return
        over_budget = fits & (cls.usd > self.budget) if self.budget is not None else np.zeros_like(fits)
        status[over_budget] = OVER_BUDGET
        if self.deadline is not None and self.budget is None:
            status[fits & (cls.hours > self.deadline)] = OVER_DEADLINE
        todo = np.flatnonzero((status == FITS).ravel())
        for n, pos in enumerate(todo.tolist()):
            if self.progress and n % 64 == 0:
                self.progress("limits", n, len(todo))
            if self._out_of_time():
                status.ravel()[todo[n:]] = UNSEARCHED
                return
            _, hours, usd = self._refine(pos, cls)
            if self.budget is not None and usd > self.budget:
                status.ravel()[pos] = OVER_BUDGET
            elif self.deadline is not None and hours > self.deadline and self.budget is None:
                status.ravel()[pos] = OVER_DEADLINE
            else:
                c = self.evaluate(cls.index(pos))
                self._check(c, pos, cls)
                status.ravel()[pos] = status_of(c.reason)

    def _rank(self, np, ranking: Ranking, cls: Classification) -> tuple[TopK, int]:
        """Exact top-k of one ranking; also how many candidates it left unsettled (out of time)."""
        # read at the candidates that fit (cls.primary.at, ascending): a feasible one is one of them (its status was
        # FITS), and their bounds are the stored values, not a search for each position among them
        fit = cls.primary.at
        keep = (cls.status.ravel()[fit] == FEASIBLE) & cls.accept[ranking.name][cls.columns][fit % len(cls.columns)]
        places = fit[keep]  # positions in listing order (columns ascend)
        bounds, tiers = cls.primary.values[keep], cls.tier.ravel()[places]
        top = TopK(ranking.k)
        # tight candidates (tier 1) after every safe one; stable within
        for pos, o in enumerate(_ascending(np, bounds, tiers)):
            at, bound, tier = int(places[o]), float(bounds[o]), int(tiers[o])
            idx = cls.index(at)  # the candidate's number: what ties compare and the cache keeps
            if top.full:
                worst_key, worst_idx = top.worst
                rounded = tie(bound)
                if (tier, rounded) > worst_key[:2]:
                    break
                cx = int(cls.complexity[idx % self.space.mixes_per_block])
                if ((tier, rounded, cx, bound), idx) > (worst_key, worst_idx):
                    continue
                sharper = self._refine(at, cls)[0]
                if ((tier, tie(sharper), cx, sharper), idx) > (worst_key, worst_idx):
                    continue
            if self._out_of_time():
                return top, len(places) - pos
            if self.progress and len(self.cache) % 64 == 0:
                self.progress("estimate", len(self.cache), None)
            c = self.evaluate(idx)
            self._check(c, at, cls)
            if c.feasible:
                top.push(self.key(c), idx, c)
        return top, 0

    def _refine(self, idx: int, cls: Classification) -> tuple[float, float, float]:
        """(primary, hours, dollars) lower bounds from the estimator's step time (bounds.refined_hours), for a
        candidate whose cheap bound could not rule it out; memory has no sharper bound than its own. `idx`: its
        position in the classification's arrays."""
        hit = self.refined.get(idx)
        if hit is None:
            scn = self.space.candidate(cls.index(idx))
            eff, _ = self.cal.for_gpu(scn.cluster.gpu.key)
            hours = max(refined_hours(scn, int(cls.micro_batch.flat[idx]), int(cls.micro_batch_max.flat[idx]),
                                      self.global_batch, eff), float(cls.hours.flat[idx]))
            price = price_of(scn)[0]
            usd = math.nan if price is None else hours * scn.cluster.world_size * price
            primary = {"time": hours, "cost": math.inf if price is None else usd}.get(self.by, cls.primary.flat[idx])
            hit = self.refined[idx] = (primary, hours, usd)
        return hit

    def _check(self, c: Any, idx: int, cls: Classification) -> None:
        """An exact estimate of a candidate classified as fitting must fit and respect its bounds (`idx`: its
        position in the classification's arrays)."""
        if status_of(c.reason) in (UNSUPPORTED, NO_FIT) or (c.feasible and self.key(c)[0] != cls.tier.flat[idx]):
            self.violations += 1
            return
        run = c.estimate.run
        primary, hours, usd = self._refine(idx, cls)
        mb = c.estimate.micro_batch_size
        bounds = [(self.key(c)[3] if c.feasible else math.inf, primary), (run.hours, hours),
                  (mb, cls.micro_batch.flat[idx]), (cls.micro_batch_max.flat[idx], mb)]
        if run.usd is not None:
            bounds.append((run.usd, usd))
        if any(not exact >= bound for exact, bound in bounds):
            self.violations += 1


@contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off for the block (as it was after). A search over a large space keeps
    hundreds of thousands of objects alive (probes, mixes, memos) while it makes more, so the collector's passes,
    each over every live object, came back again and again: a fifth of a 17 s search (deepseek-v3 on 1,024 GPUs).
    Nothing is freed later than it would be but reference cycles, which the first collection after it takes."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _ascending(np, bounds, tiers, chunk: int = 4096):
    """The positions of `bounds` in np.lexsort((bounds, tiers))'s order (by tier, then bound, then position), sorted
    a chunk at a time: a ranking stops after the first few thousand of millions, so sorting them all was most of
    its time. Each chunk is every remaining bound up to the chunk's largest, ties included, so none is split."""
    for tier in np.unique(tiers).tolist():
        at = np.flatnonzero(tiers == tier)
        left = bounds[at]
        while len(at):
            take = None
            if len(at) > chunk:
                kth = np.partition(left, chunk)[chunk]
                take = None if kth != kth else left <= kth  # NaN (sorted last): the rest in one chunk
            if take is None:
                yield from at[np.argsort(left, kind="stable")].tolist()
                break
            yield from at[take][np.argsort(left[take], kind="stable")].tolist()
            at, left = at[~take], left[~take]
            chunk *= 4
