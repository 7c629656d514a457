"""Replay an allocation stream through the caching-allocator model (estimate/caching_allocator.py): reserved
from allocated, for a traced step.

Pure Python, no torch: `trace` feeds it the storages it accounted, in the order they were created and freed.
"""
from __future__ import annotations

from typing import Any, Iterable

from ...estimate.caching_allocator import CachingAllocator, round_size, segment_size

__all__ = ["CachingAllocator", "replay", "replay_steps", "round_size", "segment_size"]


def replay(events: Iterable[tuple[str, object, int]]) -> CachingAllocator:
    """Run ("malloc", key, nbytes) / ("free", key, 0) events through a fresh allocator."""
    alloc = CachingAllocator()
    for op, key, nbytes in events:
        if op == "malloc":
            alloc.malloc(key, nbytes)
        else:
            alloc.free(key)
    return alloc


def replay_steps(recs: list[Any], steps: int = 3, allocator: Any = None, watch: Any = None) -> Any:
    """The traced step as a training loop would repeat it, through the caching-allocator model: weights first;
    each step allocates and frees as traced, except that optimizer states are created in the first step only and
    kept, gradients are freed at the end of every step (zero_grad(set_to_none=True)), and whatever the step left
    alive (input, loss) is freed then too. With `allocator`, continue that allocator's history (a profile sweep:
    the weights and optimizer states are already there). `watch(allocator, step)` runs after every event of the steps."""
    fresh = allocator is None
    alloc = CachingAllocator() if fresh else allocator
    if fresh:
        for r in recs:
            if r.kind == "param":
                alloc.malloc(id(r), r.nbytes)
    call = object()  # keys of this replay never collide with an earlier one's
    # math.inf (alive at the end) sorts last: freed when the step ends; optimizer states are never freed
    steady = sorted([(r.t0, 1, r) for r in recs if r.kind not in ("param", "opt")]
                    + [(r.t1, 0, r) for r in recs if r.kind not in ("param", "opt")], key=lambda e: (e[0], e[1]))
    states = [(r.t0, 1, r) for r in recs if r.kind == "opt"]
    first = sorted(steady + states, key=lambda e: (e[0], e[1])) if fresh else steady
    for step in range(steps):
        for _, is_malloc, r in first if step == 0 else steady:
            key = (call, step, id(r)) if r.kind != "opt" else id(r)
            if is_malloc:
                alloc.malloc(key, r.nbytes)
            else:
                alloc.free(key)
            if watch is not None:
                watch(alloc, step)
    return alloc
