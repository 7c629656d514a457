"""Which candidates fit (classify.py's rule 1 over the scan's results): per block and live mix, whether the mix runs
there and its peak is within the capacity, read only where it can be.

A candidate's capacity is its block's usable bytes less NCCL's buffers, which read the mix (Scan.cap_columns, one
column per COMM_FIELDS value), and with a fixed global batch its peak is a per-block one. Both were blocks x mixes
arrays, most of their cells of mixes that fit nowhere near (inf, or above every capacity of the block): on a
space of 176 blocks and 145,000 live mixes they took a second and a gigabyte. Here a peak is first compared with
its block's largest capacity, and the capacities and fixed-batch peaks are read only at the few that pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

UNSUPPORTED, NO_FIT, FITS = 1, 2, 3
"""classify's status codes this module sets (the same numbers)."""


@dataclass
class Fits:
    """The fit test's answer for the blocks (rows) and live mixes (columns) of a classification."""

    status: Any
    """int8, blocks x columns: UNSUPPORTED, NO_FIT or FITS."""
    tier: Any
    """int8, blocks x columns: 1 where a candidate fits only by using the margin."""
    at: Any
    """The flat positions of the candidates that fit, ascending (row-major: each block's together)."""
    capacity: Any
    """At those: the capacity (device_capacity)."""
    on_safe: Any
    """At those: whether the peak at micro-batch 1 leaves the margin free (None without a margin)."""
    peak: Any
    """At those: the peak their memory ranking reads (the fixed-batch one at their tier's layout with a global
    batch, else the peak at micro-batch 1)."""


def fit_test(np, scan: Any, cols: Any, margin: float) -> tuple[Fits, dict]:
    """The Fits of these live mixes (`cols`, ascending), and the batch terms of their slots (`_gather`'s)."""
    peak, terms = _gather(np, scan, scan.slot[cols])
    nb, n = len(scan.g_of), len(cols)
    g_of, w_of = scan.g_of, scan.w_of
    runs = np.empty((nb, n), bool)  # the mix runs on the block: GPU type supported, layout valid at its count
    supported, layout_ok = scan.supported[:, cols], scan.layout_ok[:, cols]
    for b in range(nb):  # a row at a time: no blocks x columns array per operand
        np.logical_and(supported[g_of[b]], layout_ok[w_of[b]], out=runs[b])
    status = runs.view(np.int8)
    status += UNSUPPORTED  # NO_FIT where it runs
    tier = np.zeros((nb, n), np.int8)
    capacity = np.stack(scan.cap_columns, axis=1) if scan.cap_columns and n else np.zeros((nb, 1))
    room = np.fmax.reduce(capacity, axis=1)  # the largest capacity of each block: a peak above it fits no column
    if scan.global_batch is None:
        r, c = _within(np, [peak[w_of[b]] for b in range(nb)], room)
        fixed = safe = None
    else:
        r, c, fixed, safe = _fixed_within(np, scan, cols, room)
    cap = capacity[r, scan.comm_of[cols][c]] if scan.cap_columns else np.zeros(len(c))
    safe_cap = cap * (1.0 - margin)
    # the dense arrays' comparisons, element by element, at those candidates; without a margin nothing reads
    # on_safe but the choice of the fixed-batch peak, and then both are one array
    on_safe = peak[w_of[r], c] <= safe_cap if margin or fixed is None or safe is not fixed else None
    kept = peak[w_of[r], c] if fixed is None else fixed if safe is fixed else np.where(on_safe, safe, fixed)
    fit = (status[r, c] == NO_FIT) & (kept <= cap)
    at = r[fit] * n + c[fit]
    status.ravel()[at] = FITS
    tight = ~(kept[fit] <= safe_cap[fit])
    tier.ravel()[at[tight]] = 1
    ranked = kept[fit] if fixed is None or safe is fixed else np.where(tight, fixed[fit], safe[fit])
    return Fits(status, tier, at, cap[fit], on_safe[fit] if margin else None, ranked), terms


def _within(np, rows: list, room) -> tuple[Any, Any]:
    """(block, column) of each value of `rows` (one array per block) within its block's room, block-major."""
    near = [np.flatnonzero(row <= room[b]) for b, row in enumerate(rows)]
    r = np.repeat(np.arange(len(rows)), [len(c) for c in near])
    return r, np.concatenate(near) if near else np.zeros(0, np.int64)


def _gather(np, scan: Any, slots: Any) -> tuple[Any, dict]:
    """The peak at micro-batch 1 of these slots (GPU counts x slots) read from the scan's chunks, and the fitting
    probes' batch terms with, per GPU count and slot, the column of its probe (the fixed-batch peaks: _fixed_within)."""
    scan.settle()
    peak = np.full((len(scan.worlds), len(slots)), np.inf)
    for c, at, cols in _chunks(np, scan, slots):
        peak[:, at] = scan.chunks[c].peak[:, cols]
    terms = dict(scan.terms, row=scan.terms["row"][:, slots]) if scan.terms else {}
    return peak, terms


def _fixed_within(np, scan: Any, cols: Any, room) -> tuple[Any, Any, Any, Any]:
    """(block, column, fixed-batch peak, the same at the margin's layout) where either peak is within the block's
    room, block-major and each block's columns ascending: read from the scan's chunks a chunk at a time (no blocks x
    columns array is made)."""
    parts = []
    for c, at, in_chunk in _chunks(np, scan, scan.slot[cols]):
        chunk = scan.chunks[c]
        fixed = chunk.fixed_peak[:, in_chunk]
        safe = fixed if chunk.safe_fixed_peak is chunk.fixed_peak else chunk.safe_fixed_peak[:, in_chunk]
        near = (fixed <= room[:, None]) | (safe <= room[:, None]) if safe is not fixed else fixed <= room[:, None]
        r, j = np.nonzero(near)
        parts.append((r, at[j], fixed[r, j], safe[r, j] if safe is not fixed else None))
    if not parts:
        empty = np.zeros(0, np.int64)
        return empty, empty, np.zeros(0), np.zeros(0)
    r, c, fixed, safe = (np.concatenate(p) if p[0] is not None else None for p in zip(*parts))
    if (np.diff(scan.slot[cols]) > 0).all():  # chunks in column order: a stable sort by block keeps them ascending
        order = np.argsort(r.astype(np.int16) if len(room) < 1 << 15 else r, kind="stable")
    else:
        order = np.lexsort((c, r))  # block-major, columns ascending
    r, c, fixed = r[order], c[order], fixed[order]
    return r, c, fixed, fixed if safe is None else safe[order]


def _chunks(np, scan: Any, slots: Any):
    """Per chunk of the scan holding some of these slots: its number, the slots' positions and their columns in it."""
    which, cols = slots // scan.width, slots % scan.width
    for c in np.unique(which).tolist():
        at = np.flatnonzero(which == c)
        yield c, at, cols[at]
