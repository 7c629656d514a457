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

def test_pinned_free_is_the_free_space_of_segments_that_still_hold_a_block():
    a = CachingAllocator()
    a.malloc("x", 100 * MiB)   # its own 100 MiB segment
    a.free("x")
    a.malloc("keep", 30 * MiB)  # carved out of that segment: 70 MiB free beside it, pinned
    a.malloc("y", 50 * MiB)     # best fit: the 70 MiB tail; 20 MiB stays free in the same segment
    a.malloc("z", 200 * MiB)    # a segment of its own
    a.free("z")                 # entirely free: releasable
    assert a.reserved == 300 * MiB and a.allocated == 80 * MiB
    assert a.pinned_free() == 20 * MiB
    a.empty_cache()             # frees only the segment with no live block
    assert a.reserved == 100 * MiB and a.pinned_free() == 20 * MiB
    a.free("keep"), a.free("y")
    assert a.pinned_free() == 0
