"""The caching-allocator model (estimate/caching_allocator.py) on hand-made allocation streams with known answers."""
from __future__ import annotations

from ftscope.estimate.caching_allocator import CachingAllocator, round_size, segment_size

MiB = 1 << 20


def test_sizes_round_like_the_cuda_allocator():
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert segment_size(100) == 2 * MiB and segment_size(MiB) == 2 * MiB
    assert segment_size(MiB + 512) == 20 * MiB and segment_size(10 * MiB - 512) == 20 * MiB
    assert segment_size(10 * MiB) == 10 * MiB and segment_size(11 * MiB + 1) == 12 * MiB


def test_small_requests_have_their_own_pool():
    a = CachingAllocator()
    a.malloc("big", 4 * MiB)
    a.free("big")
    a.malloc("small", 4096)  # the free 20 MiB large segment does not serve it
    assert a.segments == 2 and a.reserved == 22 * MiB and a.peak_reserved == 22 * MiB