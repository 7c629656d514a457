"""Largest micro-batch and largest sequence length that fit: grow, then bisect, on the memory model.

Memory grows monotonically with batch and with sequence length, so bisection is exact on integers.
"""
from __future__ import annotations

from ..estimate.memory import MemoryModel

SEQ_CAP = 4_194_304
BATCH_CAP = 65_536


def _largest(fits, cap: int) -> int:
    """Largest n in [1, cap] with fits(n), or 0 when even 1 does not fit."""
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= cap and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, cap + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def max_micro_batch(mem: MemoryModel, seq: float, margin: float = 0.0, cap: int = BATCH_CAP) -> int:
    """Largest micro-batch that fits at this (padded) sequence length; 0 if none."""
    return _largest(lambda b: mem.fits(b, seq, margin), cap)


def max_seq_len(mem: MemoryModel, batch: int, margin: float = 0.0, cap: int = SEQ_CAP) -> int:
    """Largest sequence length that fits at this micro-batch; 0 if none."""
    return _largest(lambda s: mem.fits(batch, s, margin), cap)
