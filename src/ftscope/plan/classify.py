"""Classify every candidate of a space without estimating it: its status and lower bounds on its ranking keys.

Work is done once per mix (refusal), per mix and GPU type (support), per mix and GPU count (one memory model),
per compute signature (the FLOPs of a sequence) and then vectorized with numpy over the blocks (GPU type x
count): arrays of one byte of status and a few floats per candidate, never an object per candidate.
"""
from __future__ import annotations

import bisect
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..estimate.cost import price_of
from ..estimate.efficiency import Calibration
from ..estimate.solvers import BATCH_CAP
from .bounds import hours_per_gpu_second, ops_mix, seconds_per_sequence, shortest_sequence
from .fit_test import fit_test
from .pass_bounds import comm_key, micro_batch_seconds_per_gpu, rate_key, rates_per_gpu, work_rates
from .scan import REFUSAL_FREE, TERMS, Scan
from .space import Space, with_mix
# read_bounds under its former name here: measurement scripts wrap classify._read_bounds
from .time_tables import distinct_batches, read_bounds as _read_bounds

UNSEARCHED, UNSUPPORTED, NO_FIT, FITS, FEASIBLE, OVER_BUDGET, OVER_DEADLINE = range(7)
MIX_CHUNK = 256
"""Mixes between progress reports and clock checks."""
MB_CHUNK = 4096
"""Fitting candidates whose micro-batch bounds are computed together: their phases' arrays stay in cache."""


@dataclass
class Classification:
    """Per candidate that may run (rows: blocks, columns: the mixes in `columns`): status and lower bounds; per
    mix: what ranking needs. A mix that no block can run (refused, or unsupported on every GPU type or layout
    everywhere) has no column: all its candidates are unsupported (`dead`); one the clock left unseen has none
    either (unsearched). Candidate `idx` of the space (block idx // mixes_per_block, mix idx % mixes_per_block)
    is at position `position(idx)` of the flattened arrays when its mix has a column."""

    status: Any
    """int8 status codes (UNSUPPORTED ... OVER_DEADLINE; UNSEARCHED where the clock stopped the settling)."""
    primary: Any
    """Lower bound of the ranking's primary value (hours, dollars or peak bytes); inf unless FITS. It and the four
    below are AtFits: kept only at the candidates that fit."""
    hours: Any
    usd: Any
    """Lower bounds of hours and dollars (NaN without a price); 0 unless FITS."""
    micro_batch: Any
    """Lower bound of the micro-batch the candidate will run; 0 unless FITS."""
    micro_batch_max: Any
    """Upper bound of that micro-batch; 0 unless FITS."""
    complexity: Any
    accept: dict[str, Any]
    """Per ranking name: which mixes may enter it."""
    tier: Any = None
    """int8 per candidate: 0 fits leaving the margin free, 1 tight (fits only by using the margin); the bounds of a
    tight candidate are those of the full capacity, the way recommend's evaluate solves it."""
    columns: Any = None
    """The mixes with a column, ascending (so positions keep the space's listing order)."""
    mixes_per_block: int = 0
    dead: Any = None
    """The mixes seen that no block can run, ascending: every candidate of theirs is unsupported."""

    def index(self, pos: int) -> int:
        """The space's candidate number at flat position `pos`."""
        n = len(self.columns)
        return pos // n * self.mixes_per_block + int(self.columns[pos % n])

    def position(self, idx: int) -> int | None:
        """The flat position of the space's candidate `idx`, or None when its mix has no column."""
        b, k = divmod(idx, self.mixes_per_block)
        j = bisect.bisect_left(self.columns, k) if len(self.columns) else 0
        if j == len(self.columns) or self.columns[j] != k:
            return None
        return b * len(self.columns) + j

    def full(self, np, name: str = "status") -> Any:
        """One of the arrays over every block and mix (status: UNSUPPORTED for dead mixes, UNSEARCHED for unseen
        ones; bounds: NaN outside the columns): for tests and small spaces."""
        values = getattr(self, name)
        values = values.dense() if isinstance(values, AtFits) else values
        fill = UNSEARCHED if name == "status" else (0 if values.dtype.kind in "iu" else np.nan)
        out = np.full((values.shape[0], self.mixes_per_block), fill, values.dtype)
        out[:, self.columns] = values
        if name == "status":
            out[:, self.dead] = UNSUPPORTED
        return out


def classify(np, space: Space, by: str, cal: Calibration, accepts: dict[str, Callable[[Any], bool] | None],
             global_batch: int | None, stop_at: float | None,
             progress: Callable[[str, int, int | None], None] | None, margin: float = 0.0,
             share_twins: bool = True, scan_until: float | None = None) -> tuple[Classification, bool]:
    """The classification of every candidate; True when the clock ran out before every mix was seen and bounded.
    With a `margin`, a candidate that fits only in the last `margin` of usable memory is tight (tier 1): rule 1
    read at capacity x (1 - margin) says which, since its memory grows with the micro-batch. The pass over the
    mixes stops at `scan_until` (default `stop_at`), the time bounds at `stop_at`: a candidate that fits but whose
    compute signature the clock left without a bound is unsearched."""
    nb, nm = len(space.blocks), space.mixes_per_block
    scan = Scan(np, space, accepts, global_batch, margin, share_twins, exact_peaks=by == "memory")
    cut = _scan_mixes(space, scan, progress, stop_at if scan_until is None else scan_until)
    if progress:
        progress("classify", int(scan.searched.sum()) * nb, nb * nm)
    g_of, w_of = scan.g_of, scan.w_of
    # only the mixes some block can run get a column: the others' candidates are all unsupported (or unseen)
    live = scan.valid & scan.searched
    pairs = sorted(set(zip(g_of.tolist(), w_of.tolist())))  # the (GPU type, GPU count) of some block
    runs = np.zeros(nm, bool)
    for g, w in pairs:
        runs |= scan.supported[g] & scan.layout_ok[w]
    live &= runs
    cols = np.flatnonzero(live)
    dead = np.flatnonzero(scan.searched & ~live)
    fits, terms = fit_test(np, scan, cols, margin)  # a live mix has a slot: some GPU type supports it
    status, tier, at, on_safe_at, cap_at = fits.status, fits.tier, fits.at, fits.on_safe, fits.capacity
    split = scan.split[:, cols]
    sig = scan.sig[cols]
    world = np.array([b.world for b in space.blocks])
    rows, at_col = np.divmod(at, len(cols))
    replicas = np.maximum(world[rows] // split[0][at_col], 1)  # data-parallel replicas (plan/layouts.replicas)
    per_replica = None if global_batch is None else np.maximum(global_batch // (replicas * split[1][at_col]), 1)
    batch, batch_max = _micro_batch_bounds(np, terms, w_of, cap_at, rows, at_col, per_replica)
    if margin:  # a safe candidate runs the batch that leaves the margin free, a tight one the full capacity's
        safe_at = np.flatnonzero(on_safe_at)
        low, high = _micro_batch_bounds(np, terms, w_of, cap_at[safe_at] * (1.0 - margin), rows[safe_at],
                                        at_col[safe_at], None if per_replica is None else per_replica[safe_at])
        batch[safe_at], batch_max[safe_at] = low, high
    # one representative mix per compute signature that has a candidate to rank, in the order of its first column
    fit_cols = np.zeros(len(cols), bool)
    fit_cols[at_col] = True
    fit_cols = np.flatnonzero(fit_cols)  # np.unique(at_col), without sorting millions
    _, first = np.unique(sig[fit_cols], return_index=True)
    mixes: dict[int, Any] = {int(sig[j]): space.mix(int(cols[j])) for j in fit_cols[np.sort(first)].tolist()}
    hours, usd, unbounded = _time_bounds(np, space, cal, scan.on_gpu, g_of, sig, mixes, rows, at_col, batch,
                                         batch_max, replicas, stop_at, status.size > len(at))
    if unbounded.any():  # out of time: these fit, but without a bound they cannot be ranked
        status[:, unbounded] = np.where(status[:, unbounded] == FITS, UNSEARCHED, status[:, unbounded])
        cut = True
    if by == "memory":
        primary = fits.peak
    else:
        primary = hours if by == "time" else np.where(np.isnan(usd), np.inf, usd)
    primary = np.where(status.ravel()[at] == FITS, primary, np.inf)  # the clock's unsearched ones too
    primary, hours, usd, batch, batch_max = (AtFits(np, status.shape, at, v, fill) for v, fill in (
        (primary, np.inf), (hours, 0.0), (usd, 0.0), (batch, 0.0), (batch_max, 0.0)))
    return Classification(status, primary, hours, usd, batch, batch_max, scan.complexity, scan.accept, tier, cols,
                          nm, dead), cut


def _scan_mixes(space: Space, scan: Scan, progress: Callable[[str, int, int | None], None] | None,
                scan_until: float | None) -> bool:
    """The pass over every mix (scan.run), in runs of mixes that differ only in fields refusal does not read, a refused
    run skipped whole; progress and the clock read about every MIX_CHUNK mixes. True when the clock stopped it."""
    nb, nm = len(space.blocks), space.mixes_per_block
    check = 0  # the next mix number at which to report progress and read the clock
    for start, n, first, run in space.mix_runs(REFUSAL_FREE):
        if start >= check:
            check = start - start % MIX_CHUNK + MIX_CHUNK
            if progress:
                progress("classify", start * nb, nb * nm)
            if scan_until is not None and time.perf_counter() > scan_until:
                return True
        scan.run(start, n, first, run())
    return False


class AtFits:
    """A float per candidate, kept only at the flat positions of the candidates that fit (`at`, ascending) and
    `fill` at every other: a few in a hundred of a large space fit, so five dense arrays would be most of a search's
    memory and their page faults seconds. Read as a flat array: `.flat[pos]` or `.ravel()[positions]` (a number or
    positions), `dense()` for the whole, and compared with a number into a dense bool array."""

    def __init__(self, np, shape: tuple, at: Any, values: Any, fill: float) -> None:
        self.np, self.shape, self.at, self.values, self.fill = np, shape, at, values, fill
        self.dtype = values.dtype

    @property
    def flat(self) -> "AtFits":
        return self

    def ravel(self) -> "AtFits":
        return self

    def __getitem__(self, pos):
        np = self.np
        if isinstance(pos, int):  # one candidate (the engine's refinement and checks): no arrays made
            j = int(self.at.searchsorted(pos))
            return self.values[j] if j < len(self.at) and self.at[j] == pos else self.dtype.type(self.fill)
        j = np.minimum(np.searchsorted(self.at, pos), max(len(self.at) - 1, 0))
        if not len(self.at):
            return np.full(np.shape(pos), self.fill)[()]
        return np.where(self.at[j] == pos, self.values[j], self.fill)[()]

    def dense(self):
        out = self.np.full(self.shape, self.fill)
        out.ravel()[self.at] = self.values
        return out

    def __gt__(self, x):
        return self.dense() > x

def _micro_batch_bounds(np, terms, w_of, caps, rows, cols, per_replica):
    """Bounds on the micro-batch of each fitting candidate (its block in `rows`, its column in `cols`, block by
    block) will run (bounds.py, rule 2): the floor of min over phases of (capacity - fixed bytes) / slope, with the
    first sequence's slope for the lower bound and the slope at the cap for the upper; 1e-6 either side covers
    rounding (the engine checks the solver's answer against both). Clipped to [1, the solver's cap]; with a fixed
    global batch, to the global batch per replica (and pipeline stage), as recommend picks it (`per_replica`: that
    cap per candidate, None without one). `caps`: each candidate's capacity."""
    low, high = np.ones(len(rows)), np.ones(len(rows))
    if not terms:
        return low, high
    at = terms["row"][w_of[rows], cols]  # the probe of each candidate's mix at its block's GPU count
    if (at < 0).any():
        raise AssertionError("a fitting candidate without batch terms")
    # probes x phases: a candidate's phases are one contiguous row to take (scan's phases x probes arrays are laid
    # out so, .T costs nothing), then phases x candidates for the arithmetic; gathering each phase's row apart
    # (terms[name][:, probe]) took two thirds of the time
    tables = [np.ascontiguousarray(terms[name].T) for name in TERMS]
    for start in range(0, len(rows), MB_CHUNK):
        span = slice(start, start + MB_CHUNK)
        probe = at[span]
        fixed, first, far = (np.take(table, probe, axis=0).T.copy() for table in tables)
        room = caps[span] - fixed
        lo = np.clip(np.floor(_largest(np, room, first) * (1 - 1e-6)), 1, BATCH_CAP)
        hi = np.clip(np.floor(_largest(np, room, far) * (1 + 1e-6)), 1, BATCH_CAP)
        if per_replica is not None:
            lo, hi = np.minimum(lo, per_replica[span]), np.minimum(hi, per_replica[span])
        low[span], high[span] = lo, hi
    return low, high


def _largest(np, room, per):
    """Per candidate (columns), the least over the phases (rows) of room / per where per > 0 (inf elsewhere)."""
    out = np.full(room.shape, np.inf)
    np.divide(room, per, out=out, where=per > 0)
    return out.min(axis=0)


def _signature_work(np, first, rated, seqs, shortest: float, effs, memo: dict, passes: dict, done: dict):
    """[work rates (GPU types x ops x (a, b, c, d) of op_rates_per_gpu(sequence_work(...)); one padded length
    (packed): the work at that length alone, two op lists per fit instead of six), micro-batch seconds per GPU type,
    None (the caller's one-length table)] of a signature's first mix `first` (`rated`: its rates_per_gpu), or None
    without an op. Kept in `done` per ops_mix, checkpointing and rates: a signature that differs from an earlier one
    only in what those leave out (sdpa or flash attention, whose rates are equal) has the same numbers."""
    mix, each = first.mix, rated[0]
    same = done.get(id(each))  # the rates kept in rates_per_gpu's memo: their id is not reused
    if same is None:
        same = done[id(each)] = done.setdefault(("rates", tuple(each)), len(done))
    key = (ops_mix(mix), mix.gradient_checkpointing, mix.checkpointing, mix.checkpoint_every, same)
    if key in done:
        return done[key]
    rates = (work_rates(np, first, float(seqs[0]), memo, True, [first], effs, each) if len(seqs) == 1
             else work_rates(np, first, shortest, memo, False, [first], effs, each))
    work = done[key] = None if rates is None else [
        rates, micro_batch_seconds_per_gpu(np, [first], effs, 1, shortest, passes, rated), None]
    return work


def _time_bounds(np, space: Space, cal: Calibration, on_gpu: Sequence[Any], g_of, sig, representative, rows, cols,
                 batch, batch_max, replicas, stop_at: float | None = None, others: bool = False):
    """Lower bounds of hours and dollars per fitting candidate (its block in `rows`, its column in `cols`): per
    compute signature and GPU type, the per-op seconds per sequence (bounds.op_rates) at the shortest padded length
    its micro-batch bound can have, plus per block the model-parallel communication no compute hides
    (pass_bounds.exposed_seconds_per_sequence), read per candidate in one pass (_read_bounds). Also which columns
    the clock (`stop_at`) left without a bound, the signatures taken in listing order. `others`: some candidate does
    not fit; the lengths' table of a signature then holds the length at micro-batch 1 too whenever one of its
    columns has such a candidate (the table's shape sets the order numpy sums the ops in, so the numbers stay those
    of a table over every candidate)."""
    wl = space.scenario.workload
    shortest = shortest_sequence(space.scenario)
    batches, which = distinct_batches(np, np.append(batch, 1.0) if others else batch)
    lengths = np.array([wl.mean_padded_len(int(b)) for b in batches.tolist()], float)
    # the distinct padded lengths (one when packed) and each candidate's: a signature's seconds per sequence are
    # computed per GPU type and length, then read per candidate
    seqs, seq_of = np.unique(np.maximum(lengths, shortest), return_inverse=True)
    seq_of = seq_of.reshape(-1)[which.reshape(-1)]
    at_one = seq_of[-1] if others else None  # the length of a candidate that does not fit (micro-batch 1)
    per_seq = np.zeros(len(batch))
    memo: dict = {}
    passes: dict = {}  # micro_batch_seconds_per_gpu's op times per op list and rates
    done: dict = {}  # _signature_work's: per rates object its class (equal rates, one number), per key its numbers
    comms: dict = {}  # exposed_seconds_per_sequence per distinct COMM_FIELDS value
    rate_memo: dict = {}  # rates_per_gpu per distinct RATE_MIX_FIELDS value
    effs = [cal.for_gpu(base.cluster.gpu.key)[0] for base in on_gpu]
    bases = [b.base for b in space.blocks]
    block_effs = [cal.for_gpu(b.gpu.key)[0] for b in space.blocks]
    by_sig = np.argsort(sig, kind="stable")  # the columns of each signature, ascending, without a pass per signature
    starts = np.searchsorted(sig[by_sig], np.arange(len(sig) and int(sig.max()) + 2))
    fit_sig = sig[cols]
    if len(seqs) > 1:  # the fitting candidates of each signature, likewise (their lengths make its table's)
        fit_by_sig = np.argsort(fit_sig, kind="stable")
        fit_starts = np.searchsorted(fit_sig[fit_by_sig], np.arange(len(sig) and int(sig.max()) + 2))
    unbounded = np.zeros(len(sig), bool)
    # per signature bounded, in order: its seconds per sequence (GPU types x its lengths), those lengths, its
    # micro-batch seconds per GPU type and its COMM_FIELDS value; read per candidate after the loop
    tables, lengths_of, singles, comm_at = [], [], [], []
    comm_of: dict = {}  # COMM_FIELDS value -> (its number, the first mix with it)
    k_of = np.full(len(sig) and int(sig.max()) + 1, -1)  # signature -> its place in those lists
    one_length = (np.zeros(1, np.int64), np.broadcast_to(seqs, (len(on_gpu), 1))) if len(seqs) == 1 else None
    for n, (s, mix) in enumerate(representative.items()):
        if stop_at is not None and time.perf_counter() > stop_at:
            for s in list(representative)[n:]:
                unbounded[by_sig[starts[s]:starts[s + 1]]] = True
            break
        first = with_mix(on_gpu[0], mix)
        columns = by_sig[starts[s]:starts[s + 1]]
        if not len(columns):
            continue
        rated = rate_memo.get(rate_key(mix))
        if rated is None:
            rated = rates_per_gpu(np, [with_mix(base, mix) for base in on_gpu], effs, rate_memo)
        work = _signature_work(np, first, rated, seqs, shortest, effs, memo, passes, done)
        if work is None:
            continue
        rates, single, table = work
        if len(seqs) == 1:
            used, at_used = one_length
            table = work[2] = table if table is not None else seconds_per_sequence(np, rates, at_used)
        else:
            fitting = fit_by_sig[fit_starts[s]:fit_starts[s + 1]]
            at = seq_of[fitting]
            rest = others and len(fitting) < len(g_of) * len(columns)
            used = np.unique(np.append(at, at_one) if rest else at)
            table = seconds_per_sequence(np, rates, np.broadcast_to(seqs[used], (len(on_gpu), len(used))))
        tables.append(table)
        lengths_of.append(used)
        singles.append(single)
        comm = comm_of.setdefault(comm_key(mix), (len(comm_of), mix))[0]
        k_of[s] = len(singles) - 1
        comm_at.append(comm)
    _read_bounds(np, per_seq, tables, lengths_of, singles, comm_at, comm_of, k_of, fit_sig, seq_of, len(seqs), rows,
                 g_of, batch_max, bases, block_effs, shortest, comms)
    world = np.array([b.world for b in space.blocks], float)
    prices = [price_of(b.base)[0] for b in space.blocks]
    price = np.array([np.nan if p is None else p for p in prices])
    hours = per_seq * hours_per_gpu_second(space.scenario) / replicas
    return hours, hours * world[rows] * price[rows], unbounded
