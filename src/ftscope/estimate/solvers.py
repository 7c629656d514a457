"""Largest micro-batch and largest sequence length that fit.

Every phase's reserved bytes are exactly K + L*t + Q*t*s (t = batch x seq: activations, logits and allocator
overhead scale with tokens; eager attention scores with tokens x seq). Three evaluations of the memory model
give K, L, Q per phase, so both limits have closed forms; the answer is then checked against `fits` on both
sides, so it is exact on integers whatever the rounding.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

from .held_peak import (acts_at, held_terms, model_terms, peak_at, top_at,  # noqa: F401 (held_terms re-exported)
                        totals_at)
from .memory import MemoryModel

SEQ_CAP = 4_194_304
BATCH_CAP = 65_536


def phase_totals(mem: MemoryModel, batch: float, seq: float) -> list[float]:
    """Reserved bytes of every phase point at this batch shape (what max_micro_batch compares to the capacity)."""
    return mem.reserved_totals(batch, seq)


class ReservedCurve(NamedTuple):
    """One phase point's reserved bytes as a function of the batch shape: K + L*b*s + Q*b*s^2."""

    constant: float
    """K: weights, optimizer states, gradients, fixed transients, the allocator's workspace."""
    per_token: float
    """L: bytes per token (b x s)."""
    per_token_seq: float
    """Q: bytes per token per position (eager attention's scores)."""


def reserved_curves(mem: MemoryModel, terms: tuple | None = None) -> list[ReservedCurve]:
    """The curve of each phase point, from three evaluations of the memory model; once for all the copies of a
    model memory_model shares across GPU types (they differ only in the capacity, which the curves ignore).
    `terms`: held_peak.model_terms(mem) when known (the same totals, summed from it)."""
    shared = mem.__dict__.get("_curves")
    if shared:
        return shared
    p0, p1, p2 = (phase_totals(mem, b, s) if terms is None else totals_at(terms, b, s)
                  for b, s in ((0, 0), (1, 1), (1, 2)))
    out = []
    for k, a, b in zip(p0, p1, p2):
        q = (b - 2 * a + k) / 2
        out.append(ReservedCurve(k, a - k - q, q))
    if shared is not None:
        shared[:] = out  # one step: a reader on another thread sees no curve or all of them
    return out


def _settle(guess: int, fits: Callable[[int], bool], cap: int) -> int:
    """Nudge a closed-form guess to the exact largest integer n in [1, cap] with fits(n) (0 if none)."""
    n = max(0, min(guess, cap))
    while n > 0 and not fits(n):
        n -= 1
    while n < cap and fits(n + 1):
        n += 1
    return n


def max_micro_batch(mem: MemoryModel, seq: float, margin: float = 0.0, cap: int = BATCH_CAP,
                    curves: list[ReservedCurve] | None = None) -> int:
    """Largest micro-batch that fits at this (padded) sequence length; 0 if none. `curves`: reserved_curves(mem),
    when already known (they do not depend on the capacity: a search solves one model for many GPUs)."""
    return solve_batch(mem.capacity_bytes * (1.0 - margin), curves if curves is not None else reserved_curves(mem),
                       lambda b: mem.peak_bytes(b, seq), seq, cap, mem.least_reserved)


def solve_batch(limit: float, curves: list[ReservedCurve], peak: Callable[[int], float], seq: float,
                cap: int = BATCH_CAP, floor: float = 0.0) -> int:
    """max_micro_batch for a limit in bytes, given the curves and the model's peak bytes as a function of the
    micro-batch at `seq` (a search passes a memoized one: it solves one model for many capacities). `floor`: what
    init left reserved plus another stream's pool (MemoryModel.least_reserved); above the limit no
    batch fits."""
    return _solve(limit, _per_sample(curves, seq), peak, cap, floor)


def _per_sample(curves: list[ReservedCurve], seq: float) -> list[tuple[float, float]]:
    """(K, bytes per sequence of `seq` tokens) of each curve: what solve_batch reads, whatever the limit."""
    return [(k, lin * seq + q * seq * seq) for k, lin, q in curves]


def _solve(limit: float, slopes: list[tuple[float, float]], peak: Callable[[int], float], cap: int,
           floor: float) -> int:
    """solve_batch with its curves' _per_sample."""
    return _solve_on(limit, _bounds(slopes, floor), peak, cap)


def _bounds(slopes: list[tuple[float, float]], floor: float) -> tuple:
    """What _solve_on reads of a model's slopes (_per_sample) and floor, whatever the limit: (the largest of the
    floor and the constants, NaN left out; (constant, bytes per sample) of each point that grows, once each)."""
    top = -math.inf
    for k in (floor, *(k for k, _ in slopes)):
        if k > top:
            top = k
    return top, tuple(dict.fromkeys((k, per) for k, per in slopes if per > 0))  # a repeated point (a frozen head's)


def _solve_on(limit: float, bounds: tuple, peak: Callable[[int], float], cap: int) -> int:
    """The largest micro-batch n in [0, cap] whose peak(n) <= limit, from its closed-form guess (`bounds`: _bounds
    of the model). As the loop it replaces: 0 where the floor or a point's constant exceeds the limit (some does
    exactly when the largest, NaN left out, does); else the guess is the least of the cap and each growing point's
    room, (limit - k) / bytes per sample, replacing the least so far only when smaller (a NaN room never does),
    then settled by peak: exact whatever the rounding."""
    top, grow = bounds
    if top > limit:
        return 0
    best = float(cap)
    for k, per in grow:
        room = (limit - k) / per
        if room < best:
            best = room
    n = int(best)  # within [0, cap]: best <= cap, and a room below 0 makes n 0 or less
    if n < 0:
        n = 0
    while n > 0 and not peak(n) <= limit:  # _settle, its fits(n) being peak(n) <= limit
        n -= 1
    while n < cap and peak(n + 1) <= limit:
        n += 1
    return n


class BatchSolver:
    """One memory model at one length, solved for many capacities (a search's GPU types): its peak bytes per
    micro-batch and its largest micro-batch per limit in bytes, each computed once (the capacity-free curves too)."""

    def __init__(self, mem: MemoryModel, seq: float) -> None:
        self.mem, self.seq = mem, seq
        self.least = mem.least_reserved  # (a property: a sum read by every peak and solve)
        self.peaks: dict[int, float] = {}
        self.solved: dict[float, int] = {}
        self.curves: list[ReservedCurve] | None = None
        self.bounds: tuple | None = None  # _bounds of the curves' slopes
        self.per_batch: dict[int, object] = {}  # figures._sane_on's values that read no capacity, by micro-batch
        self.recent: dict[int, tuple] = {}  # the phase points (or acts_at) of the last few peaks made from them
        self.lean: tuple | None | bool = False  # held_peak.model_terms(mem), made on first use

    def peak(self, batch: int) -> float:
        """mem.peak_bytes(batch, seq): what must fit, whatever the capacity."""
        hit = self.peaks.get(batch)
        if hit is None:
            lean = self.lean
            if lean is False:
                lean = self.lean = model_terms(self.mem)
            recent = self.recent  # (a plan reads top, or points, at the batch it solved for: a recent peak's)
            if len(recent) >= 4:
                recent.clear()
            if lean is not None:  # nothing on another stream: the sums without the phase points
                acts = recent[batch] = acts_at(lean, batch, self.seq)
                hit = self.peaks[batch] = peak_at(lean, acts, self.least)
                return hit
            mem = self.mem
            points = recent[batch] = mem._points(batch, self.seq)
            hit = self.peaks[batch] = max(self.least, *mem._reserved_of(points, held=True))  # peak_bytes
        return hit

    def top(self, batch: int) -> tuple | None:
        """held_peak.top_at: mem.breakdown's reserved peak at this micro-batch (its floor left out) and that point's
        (gradients, activations, temporary, allocated); None where another stream holds memory (then read
        points(batch))."""
        lean = self.lean
        if lean is False:
            lean = self.lean = model_terms(self.mem)
        if lean is None:
            return None
        acts = self.recent.get(batch)  # a recent peak's acts_at
        return top_at(lean, acts_at(lean, batch, self.seq) if acts is None else acts)

    def points(self, batch: int) -> tuple:
        """mem._points(batch, seq), kept from a recent peak where it was one (where top is None)."""
        hit = self.recent.get(batch) if self.lean is None else None
        return hit if hit is not None else self.mem._points(batch, self.seq)

    def largest(self, limit: float) -> int:
        """max_micro_batch of the model where the capacity x (1 - margin) is `limit` bytes."""
        hit = self.solved.get(limit)
        if hit is None:
            bounds = self.bounds
            if bounds is None:
                if self.lean is False:
                    self.lean = model_terms(self.mem)
                self.curves = reserved_curves(self.mem, self.lean)
                bounds = self.bounds = _bounds(_per_sample(self.curves, self.seq), self.least)
            hit = self.solved[limit] = _solve_on(limit, bounds, self.peak, BATCH_CAP)
        return hit


def max_seq_len(mem: MemoryModel, batch: int, margin: float = 0.0, cap: int = SEQ_CAP) -> int:
    """Largest sequence length that fits at this micro-batch; 0 if none."""
    limit = mem.capacity_bytes * (1.0 - margin)
    if mem.least_reserved > limit:
        return 0
    best = float(cap)
    for k, lin, q in reserved_curves(mem):
        room = limit - k
        if room < 0:
            return 0
        a, b = q * batch, lin * batch  # a s^2 + b s <= room
        if a > 0:
            s = (-b + math.sqrt(b * b + 4 * a * room)) / (2 * a)
        elif b > 0:
            s = room / b
        else:
            continue
        best = min(best, s)
    return _settle(int(best), lambda s: mem.fits(batch, s, margin), cap)
