"""Large temporaries kept in the process heap for one-shot runs (glibc only).

glibc serves every allocation above its mmap threshold (dynamic, at most 32 MB by default) with a fresh mmap and
unmaps it on free, so a search that makes and drops numpy arrays of tens to hundreds of MB faults in every page of
each one anew: about 1 s of system time of the DeepSeek-V3 `recommend --layouts` search. Raising the mmap and trim
thresholds serves those arrays from the heap and keeps what they freed for the next one. The process then holds
what it freed until it exits, so only a one-shot CLI command calls this, never `serve`.
"""
from __future__ import annotations

import os

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
"""glibc's mallopt parameters (malloc.h)."""
SETTINGS = ((M_MMAP_THRESHOLD, 1 << 30), (M_TRIM_THRESHOLD, (1 << 31) - 1), (M_TOP_PAD, 256 << 20))
"""Allocations up to 1 GiB from the heap, up to 2 GiB of freed heap kept, the heap grown 256 MiB at a time."""


def keep_large_allocations() -> bool:
    """Apply SETTINGS to this process's allocator; False (and nothing changed) where the C library is not glibc
    or refuses a setting."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return False
        import ctypes
        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):  # not glibc (confstr name unknown), or no mallopt symbol
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in SETTINGS)
