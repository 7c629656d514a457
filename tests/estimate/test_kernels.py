"""Kernel efficiency by shape (estimate/kernels.py): GEMM tiles on the SM count, attention by kernel and length."""
from __future__ import annotations

import pytest

from ftscope.estimate.efficiency import Efficiency
from ftscope.estimate.kernels import attention_fraction, gemm_fraction, gemm_utilization


def test_large_gemms_fill_the_gpu():
    assert gemm_utilization(16384, 4096, 4096, 132) == pytest.approx(1.0)
    assert gemm_utilization(16384, 4096, 4096, 132, k_half=64) == pytest.approx(4096 / (4096 + 64))


@pytest.mark.parametrize("sms", [84, 108, 132])
def test_short_gemms_underfill_and_more_sms_need_more_rows(sms):
    rows = [64, 128, 256, 512, 1024, 4096]
    util = [gemm_utilization(m, 4096, 4096, sms) for m in rows]
    assert all(0 < u <= 1 for u in util)
    assert util == sorted(util) and util[0] < 0.5 * util[-1]
    # the same GEMM fills a GPU with fewer SMs sooner
    assert gemm_utilization(256, 4096, 4096, 84) >= gemm_utilization(256, 4096, 4096, 132)


def test_tile_padding_and_narrow_gemms():
    # 129 rows need two 128-row tiles: the second is almost empty
    assert gemm_utilization(129, 8192, 4096, 8) < 0.6 * gemm_utilization(128, 8192, 4096, 8)
    # LoRA's rank-16 GEMMs use a sliver of a tile and a short K
    assert gemm_utilization(4096, 16, 4096, 108) < 0.2
    assert gemm_utilization(4096, 4096, 16, 108, k_half=64) == pytest.approx(16 / 80)


def test_grouped_gemms_share_the_sms():
    one = gemm_utilization(64, 4096, 4096, 132, groups=1)
    eight = gemm_utilization(64, 4096, 4096, 132, groups=8)
    assert eight > one and eight <= 1


def test_fractions_by_architecture_and_attention_kernel():
    e = Efficiency()
    assert gemm_fraction(e, "ampere") == e.gemm_ampere and gemm_fraction(e, "hopper") == e.gemm_hopper
    assert gemm_fraction(e, "blackwell") == e.gemm_other and gemm_fraction(e, "cdna3") == e.gemm_other
    long = 1e9
    assert attention_fraction(e, "flash", "ampere", long) == pytest.approx(e.attention)
    assert attention_fraction(e, "sdpa", "hopper", long) == pytest.approx(e.attention_hopper)
    assert attention_fraction(e, "flash3", "hopper", long) == pytest.approx(e.attention_flash3)
    assert attention_fraction(e, "flash1", "ampere", long) == pytest.approx(e.attention * e.attention_flash1)
    # half the long-sequence rate at attention_seq_half, rising with length
    assert attention_fraction(e, "flash", "ampere", e.attention_seq_half) == pytest.approx(e.attention / 2)
    fr = [attention_fraction(e, "flash", "ampere", s) for s in (256, 1024, 4096, 16384)]
    assert fr == sorted(fr)


def test_gemm_time_never_falls_as_rows_grow():
    # time is FLOPs / utilization, FLOPs in proportion to the rows: the plan's bounds rely on it
    for sms in (8, 108, 132):
        times = [m / gemm_utilization(m, 4096, 4096, sms) for m in [x / 4 for x in range(4, 4 * 700)]]
        assert all(b >= a * (1 - 1e-12) for a, b in zip(times, times[1:]))


def _utilization_loop(m, n, k, sms, groups=1, k_half=0.0):
    """gemm_utilization as first written, with its loop over tile heights and min() / max()."""
    import math
    from ftscope.estimate.kernels import SHORT_TILE, TILE, UNKNOWN_SMS
    if m <= 0 or n <= 0 or k <= 0:
        return 1.0
    tiles_n = -(-n // TILE)
    best = 0.0
    for tm in (SHORT_TILE, TILE) if m < TILE else (TILE,):
        tiles_m = math.ceil(m / tm)
        tile_use = (m * n) / (tiles_m * tm * tiles_n * TILE)
        fill = min(1.0, tiles_m * tiles_n * max(groups, 1) / (sms or UNKNOWN_SMS))
        best = max(best, tile_use * fill)
    pipeline = k / (k + k_half) if k_half > 0 else 1.0
    return best * pipeline


def test_gemm_utilization_is_its_loop_written_out():
    """gemm_utilization writes its loop and min() / max() out: equal (==) to the loop on random shapes (short,
    fractional and empty rows, every SM count case, grouped GEMMs, with and without k_half)."""
    import random
    rng = random.Random(7)
    for _ in range(20000):
        m = rng.choice([0, -1.0, 0.3, 1, 1.0, 63.5, 64, 64.2, 127.99, 128, 128.5, 129, rng.uniform(0, 300),
                        rng.uniform(0, 50000), rng.randrange(1, 70000)])
        args = (m, rng.choice([0, 1, 64, 128, 129, rng.randrange(1, 30000)]),
                rng.choice([0, 16, rng.randrange(1, 30000)]), rng.choice([0, 20, 108, 132, rng.randrange(1, 200)]),
                rng.choice([0, 1, 2, 8, rng.randrange(1, 300)]), rng.choice([0.0, 64.0, rng.uniform(0, 512)]))
        assert gemm_utilization.__wrapped__(*args) == _utilization_loop(*args), args
