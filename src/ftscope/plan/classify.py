"""Classify every candidate of a space without estimating it: its status and lower bounds on its ranking keys.

Work is done once per mix (refusal), per mix and GPU type (support), per mix and GPU count (one memory model),
per compute signature (the FLOPs of a sequence) and then vectorized with numpy over the blocks (GPU type x
count): arrays of one byte of status and a few floats per candidate, never an object per candidate.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..estimate import unsupported_reason
from ..estimate.cost import price_of
from ..estimate.efficiency import Calibration
from ..estimate.memory import usable_bytes
from .bounds import (MemoryProbe, hours_per_gpu_second, micro_batch_seconds, op_rates, seconds_per_sequence,
                     sequence_work,
                     shortest_sequence)
from .ranking import mix_complexity, refusal
from ..estimate.solvers import BATCH_CAP
from .space import Space, with_mix

UNSEARCHED, UNSUPPORTED, NO_FIT, FITS, FEASIBLE, OVER_BUDGET, OVER_DEADLINE = range(7)
MIX_CHUNK = 256
"""Mixes between progress reports and clock checks."""


@dataclass
class Classification:
    """Per candidate (rows: blocks, columns: mixes): status and lower bounds; per mix: what ranking needs."""

    status: Any
    """int8 status codes (UNSEARCHED ... OVER_DEADLINE)."""
    primary: Any
    """Lower bound of the ranking's primary value (hours, dollars or peak bytes); inf unless FITS."""
    hours: Any
    usd: Any
    """Lower bounds of hours and dollars (NaN without a price)."""
    micro_batch: Any
    """Lower bound of the micro-batch the candidate will run."""
    micro_batch_max: Any
    """Upper bound of that micro-batch."""
    complexity: Any
    accept: dict[str, Any]
    """Per ranking name: which mixes may enter it."""
    tier: Any = None
    """int8 per candidate: 0 fits leaving the margin free, 1 tight (fits only by using the margin); the bounds of a
    tight candidate are those of the full capacity, the way recommend's evaluate solves it."""


def classify(np, space: Space, by: str, cal: Calibration, accepts: dict[str, Callable[[Any], bool] | None],
             global_batch: int | None, stop_at: float | None,
             progress: Callable[[str, int, int | None], None] | None, margin: float = 0.0) -> tuple[Classification, bool]:
    """The classification of every candidate; True when the clock ran out before every mix was seen. With a
    `margin`, a candidate that fits only in the last `margin` of usable memory is tight (tier 1): rule 1 read at
    capacity x (1 - margin) says which, since its memory grows with the micro-batch."""
    nb, nm = len(space.blocks), space.mixes_per_block
    gpus = list(dict.fromkeys(b.gpu.key for b in space.blocks))
    worlds = list(dict.fromkeys(b.world for b in space.blocks))
    g_of = np.array([gpus.index(b.gpu.key) for b in space.blocks])
    w_of = np.array([worlds.index(b.world) for b in space.blocks])
    on_gpu = [next(b.base for b in space.blocks if b.gpu.key == g) for g in gpus]
    at_world = [next(b.base for b in space.blocks if b.world == w) for w in worlds]
    caps = np.array([usable_bytes(b.gpu) for b in space.blocks], float)
    safe_caps = caps * (1.0 - margin)  # the same product max_micro_batch's limit computes
    seq = space.scenario.workload.peak_seq_len()
    searched, valid = np.zeros(nm, bool), np.zeros(nm, bool)
    supported = np.zeros((len(gpus), nm), bool)
    peak = np.full((len(worlds), nm), np.inf)
    fixed_peak = np.full((nb, nm), np.inf) if global_batch is not None else None
    safe_fixed_peak = np.full((nb, nm), np.inf) if global_batch is not None and margin else fixed_peak
    terms: dict[str, Any] = {}  # fixed bytes and bytes per sequence: worlds x mixes x phases
    sig = np.zeros(nm, np.int32)
    signatures: dict[tuple, int] = {}
    accept = {name: np.zeros(nm, bool) for name in accepts}
    complexity = np.zeros(nm, np.int16)
    compute_dims = [d for d in space.dimensions if d.affects_compute]
    cut = False
    for k, mix in enumerate(space.mixes()):
        if k % MIX_CHUNK == 0:
            if progress:
                progress("classify", k * nb, nb * nm)
            if stop_at is not None and time.perf_counter() > stop_at:
                cut = True
                break
        searched[k] = True
        if refusal(space.scenario.model, mix):
            continue
        valid[k] = True
        complexity[k] = mix_complexity(mix)
        for name, f in accepts.items():
            accept[name][k] = f is None or f(mix)
        sig[k] = signatures.setdefault(tuple(d.get(mix) for d in compute_dims), len(signatures))
        for g, base in enumerate(on_gpu):
            supported[g, k] = unsupported_reason(with_mix(base, mix)) is None
        if not supported[:, k].any():
            continue
        for w, base in enumerate(at_world):
            probe = MemoryProbe(with_mix(base, mix), seq)
            peak[w, k] = probe.peak_at_one
            phases = probe.batch_terms()
            if not terms:
                terms = {key: np.full((len(worlds), nm, len(phases)), np.nan) for key in ("fixed", "first", "far")}
            terms["fixed"][w, k], terms["first"][w, k], terms["far"][w, k] = zip(*phases)
            if fixed_peak is not None:  # at the full capacity, and less the margin when there is one
                for cap, out in {id(fixed_peak): (caps, fixed_peak), id(safe_fixed_peak): (safe_caps, safe_fixed_peak)}.values():
                    _fixed_batch(np, probe, k, np.flatnonzero(w_of == w), g_of, supported, cap, out, global_batch)
    if progress:
        progress("classify", int(searched.sum()) * nb, nb * nm)
    status = np.full((nb, nm), UNSEARCHED, np.int8)
    ok = valid[None, :] & supported[g_of]
    fits = (peak[w_of] <= caps[:, None]) if fixed_peak is None else (fixed_peak <= caps[:, None])
    safe = (peak[w_of] <= safe_caps[:, None]) if fixed_peak is None else (safe_fixed_peak <= safe_caps[:, None])
    status[:, searched] = UNSUPPORTED
    status[ok & ~fits] = NO_FIT
    status[ok & fits] = FITS
    tier = np.where(ok & fits & ~safe, 1, 0).astype(np.int8)
    batch, batch_max = _tiered_batch_bounds(np, terms, w_of, (caps, safe_caps), status == FITS, tier, space,
                                            global_batch)
    mixes = {i: None for i in range(len(signatures))}
    for k in np.flatnonzero(valid).tolist():
        if mixes[sig[k]] is None:
            mixes[sig[k]] = space.mix(k)
    hours, usd = _time_bounds(np, space, cal, on_gpu, g_of, sig, [mixes[i] for i in range(len(signatures))], batch,
                              batch_max)
    chosen_peak = fixed_peak if safe_fixed_peak is None else np.where(tier == 0, safe_fixed_peak, fixed_peak)
    primary = {"time": hours, "cost": np.where(np.isnan(usd), np.inf, usd),
               "memory": peak[w_of] if fixed_peak is None else chosen_peak}[by]
    return Classification(status, np.where(status == FITS, primary, np.inf), hours, usd, batch, batch_max,
                          complexity, accept, tier), cut


def _fixed_batch(np, probe: MemoryProbe, k: int, blocks, g_of, supported, caps, fixed_peak, global_batch: int) -> None:
    """Peak bytes of the layout that keeps the global batch, for every block at this GPU count that fits at
    micro-batch 1 (one solve per distinct capacity)."""
    memo: dict[float, float] = {}
    for b in blocks.tolist():
        cap = float(caps[b])
        if supported[g_of[b], k] and probe.peak_at_one <= cap:
            if cap not in memo:
                memo[cap] = probe.fixed_batch_peak(cap, global_batch)
            fixed_peak[b, k] = memo[cap]


def _tiered_batch_bounds(np, terms, w_of, caps: tuple[Any, Any], fits, tier, space: Space, global_batch: int | None):
    """Micro-batch bounds at the full capacity for tight candidates and at the capacity less the margin for the
    others (the batch recommend's evaluate solves for each)."""
    batch, batch_max = _micro_batch_bounds(np, terms, w_of, caps[0], fits, space, global_batch)
    if (caps[1] == caps[0]).all():
        return batch, batch_max
    low, high = _micro_batch_bounds(np, terms, w_of, caps[1], fits & (tier == 0), space, global_batch)
    return np.where(tier == 0, low, batch), np.where(tier == 0, high, batch_max)


def _micro_batch_bounds(np, terms, w_of, caps, fits, space: Space, global_batch: int | None):
    """Bounds on the micro-batch each fitting candidate will run (bounds.py, rule 2): the floor of min over
    phases of (capacity - fixed bytes) / slope, with the first sequence's slope for the lower bound and the
    slope at the cap for the upper; 1e-6 either side covers rounding (the engine checks the solver's answer
    against both). Clipped to [1, the solver's cap]; with a fixed global batch, to the global batch per GPU, as
    recommend picks it."""
    low, high = np.ones(fits.shape), np.ones(fits.shape)
    if not terms:
        return low, high

    def largest(fixed, per, cap):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(per > 0, (cap - fixed) / per, np.inf).min(axis=1)

    for b in range(fits.shape[0]):
        w = w_of[b]
        lo = np.clip(np.floor(largest(terms["fixed"][w], terms["first"][w], caps[b]) * (1 - 1e-6)), 1, BATCH_CAP)
        hi = np.clip(np.floor(largest(terms["fixed"][w], terms["far"][w], caps[b]) * (1 + 1e-6)), 1, BATCH_CAP)
        if global_batch is not None:
            per_gpu = max(1, global_batch // space.blocks[b].world)
            lo, hi = np.minimum(lo, per_gpu), np.minimum(hi, per_gpu)
        low[b], high[b] = np.where(fits[b], lo, 1), np.where(fits[b], hi, BATCH_CAP)
    return low, high


def _time_bounds(np, space: Space, cal: Calibration, on_gpu: Sequence[Any], g_of, sig, representative, batch,
                 batch_max):
    """Lower bounds of hours and dollars per candidate: per compute signature and GPU type, the per-op
    seconds per sequence (bounds.op_rates) at the shortest padded length its micro-batch bound can have."""
    wl = space.scenario.workload
    shortest = shortest_sequence(space.scenario)
    lengths = {b: wl.mean_padded_len(int(b)) for b in np.unique(batch).tolist()}
    seq = np.maximum(np.vectorize(lengths.__getitem__, otypes=[float])(batch), shortest)
    per_seq = np.zeros(batch.shape)
    for s, mix in enumerate(representative):
        work = sequence_work(with_mix(on_gpu[0], mix), shortest)
        columns = np.flatnonzero(sig == s)
        if not work or not len(columns):
            continue
        rates = np.zeros((len(on_gpu), len(work), 4))  # GPU types x ops x (a, b, c, d)
        single = np.zeros(len(on_gpu))
        for g, base in enumerate(on_gpu):
            eff = cal.for_gpu(base.cluster.gpu.key)[0]
            rates[g, :len(work)] = op_rates(work, with_mix(base, mix), eff) or 0.0
            single[g] = micro_batch_seconds(with_mix(base, mix), 1, shortest, eff)
        per_seq[:, columns] = np.maximum(seconds_per_sequence(np, rates[g_of], seq[:, columns]),
                                         single[g_of][:, None] / batch_max[:, columns])
    world = np.array([b.world for b in space.blocks], float)[:, None]
    prices = [price_of(b.base)[0] for b in space.blocks]
    price = np.array([np.nan if p is None else p for p in prices])[:, None]
    hours = per_seq * hours_per_gpu_second(space.scenario) / world
    return hours, hours * world * price
