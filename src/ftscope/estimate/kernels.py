"""Kernel efficiency from the shapes a GPU runs: GEMMs by (M, N, K) on its SM count, attention by
implementation, architecture and sequence length.

A GEMM is cut into 128 x 128 output tiles (64-row tiles when M is short and they run faster), one tile per SM at a time. It reaches
the architecture's large-GEMM fraction of peak only when the tiles fill every SM and the padded tile area is
used; a short K leaves the tensor-core pipeline half empty (K / (K + k_half)). Split-K and stream-K kernels
spread the last partial wave, so a GEMM with more tiles than SMs counts as filling them.
"""
from __future__ import annotations

import math
from functools import lru_cache

from .efficiency import Efficiency

TILE = 128
"""Output tile edge (elements) of the tensor-core GEMM kernels cuBLAS picks for large bf16 GEMMs."""
SHORT_TILE = 64
"""Row tile for GEMMs with fewer than TILE rows."""
UNKNOWN_SMS = 108
"""SM count assumed for an inline GPU that does not give one (an A100's)."""
_ceil = math.ceil


@lru_cache(maxsize=65536)
def gemm_utilization(m: float, n: int, k: int, sms: int, groups: int = 1, k_half: float = 0.0) -> float:
    """Fraction of the large-GEMM rate a GEMM of m x n output over k reaches (0, 1]: tile padding, SM fill and
    pipeline fill. 128-row tiles from 128 rows on; a shorter GEMM gets the better of one 128-row tile and 64-row
    tiles, so that it is never slower than a 128-row one (cuBLAS's heuristics pick the faster kernel).
    `groups` GEMMs of the same shape launched together (grouped experts) share the SMs. `m` may be fractional
    (a mean over micro-batches): the time this gives, FLOPs / utilization, never falls as m grows."""
    if m <= 0 or n <= 0 or k <= 0:
        return 1.0
    # the loop over (SHORT_TILE, TILE) and its min() / max() written out (a plan meets new shapes on every GPU
    # type): `a if a < b else b` is min(b, a) and `a if a > b else b` max(b, a), the value each call returns
    tiles_n = -(-n // TILE)
    g, s = (1 if 1 > groups else groups), (sms or UNKNOWN_SMS)
    best = 0.0
    if m < TILE:
        tiles_m = _ceil(m / SHORT_TILE)
        fill = tiles_m * tiles_n * g / s
        use = (m * n) / (tiles_m * SHORT_TILE * tiles_n * TILE) * (fill if fill < 1.0 else 1.0)
        best = use if use > best else best
    tiles_m = _ceil(m / TILE)
    fill = tiles_m * tiles_n * g / s
    use = (m * n) / (tiles_m * TILE * tiles_n * TILE) * (fill if fill < 1.0 else 1.0)
    best = use if use > best else best
    return best * (k / (k + k_half) if k_half > 0 else 1.0)


ARCH_GEMM = {"ampere": "gemm_ampere", "ada": "gemm_ada", "hopper": "gemm_hopper"}
"""Architecture -> the Efficiency field of its large-GEMM fraction; others (Volta, Turing, Blackwell, CDNA)
use gemm_other."""


def gemm_fraction(eff: Efficiency, architecture: str) -> float:
    """Fraction of the dense tensor peak large GEMMs reach on this architecture."""
    return getattr(eff, ARCH_GEMM.get(architecture, "gemm_other"))


def attention_fraction(eff: Efficiency, implementation: str, architecture: str, seq: float) -> float:
    """Fraction of the dense peak a fused attention kernel reaches at this (causal) sequence length.

    FlashAttention-2 and PyTorch's sdpa kernels are Ampere-style (mma.sync): on Hopper they run without the
    wgmma units and reach a smaller share of its peak (`attention_hopper`); FlashAttention-3 is Hopper's own.
    Short sequences leave the kernels' tiles and launch overhead unamortized (seq / (seq + attention_seq_half))."""
    if implementation == "flash3":
        base = eff.attention_flash3
    elif architecture == "hopper":
        base = eff.attention_hopper
    else:
        base = eff.attention
    if implementation == "flash1":
        base *= eff.attention_flash1
    return base * seq / (seq + eff.attention_seq_half)
