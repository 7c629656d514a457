"""The traced step's replay (measure/trace/allocator.py) through the caching-allocator model, on hand-made
allocation streams with known answers."""
from __future__ import annotations

from ftscope.measure.trace.allocator import replay

MiB = 1 << 20


def test_a_freed_block_serves_the_next_request_that_fits():
    a = replay([("malloc", "a", 4 * MiB), ("free", "a", 0), ("malloc", "b", 4 * MiB), ("malloc", "c", 3 * MiB)])
    assert a.segments == 1 and a.reserved == 20 * MiB  # one 20 MiB segment, split for b and c
    assert a.allocated == 7 * MiB and a.peak_allocated == 7 * MiB


def test_a_larger_request_cannot_use_smaller_free_blocks():
    a = replay([("malloc", "x", 12 * MiB), ("malloc", "y", 12 * MiB), ("free", "x", 0), ("malloc", "z", 14 * MiB)])
    assert a.reserved == 38 * MiB and a.allocated == 26 * MiB  # x's 12 MiB stays cached: fragmentation


def test_freed_neighbours_merge_within_a_segment():
    events = [("malloc", k, 3 * MiB) for k in "abc"] + [("free", "a", 0), ("free", "b", 0), ("malloc", "d", 6 * MiB)]
    a = replay(events)
    assert a.segments == 1 and a.allocated == 9 * MiB


def test_empty_cache_returns_only_entirely_free_segments():
    a = replay([("malloc", "x", 12 * MiB), ("malloc", "y", 4 * MiB), ("malloc", "z", 4 * MiB), ("free", "x", 0),
                ("free", "y", 0)])
    assert a.reserved == 32 * MiB
    a.empty_cache()  # x's 12 MiB segment goes; y's 20 MiB segment still holds z
    assert a.reserved == 20 * MiB and a.segments == 1 and a.peak_reserved == 32 * MiB
    a.malloc("w", 12 * MiB)  # fits the 12 MiB left at the end of z's segment
    assert a.reserved == 20 * MiB
    a.malloc("v", 13 * MiB)  # nothing cached is that large: a new 14 MiB segment
    assert a.reserved == 34 * MiB and a.segments == 2


def test_replay_steps_shows_every_event_of_every_step_to_its_watcher():
    import math

    from ftscope.measure.trace.allocator import replay_steps

    class Rec:
        def __init__(self, nbytes, t0, t1, kind):
            self.nbytes, self.t0, self.t1, self.kind = nbytes, t0, t1, kind

    recs = [Rec(40 * MiB, 0, math.inf, "param"), Rec(30 * MiB, 1, 3, "forward"), Rec(12 * MiB, 2, math.inf, "forward")]
    seen = []
    alloc = replay_steps(recs, steps=2, watch=lambda a, step: seen.append((step, a.allocated)))
    # per step: two mallocs and two frees (the one alive at the end is freed when the step ends)
    assert [s for s, _ in seen] == [0] * 4 + [1] * 4
    assert max(b for _, b in seen) == alloc.peak_allocated == 82 * MiB
