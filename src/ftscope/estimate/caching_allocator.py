"""A model of PyTorch's CUDA caching allocator (one stream): reserved bytes from an allocation stream.

`torch.cuda.max_memory_reserved` exceeds `max_memory_allocated` because the caching allocator keeps freed
blocks in segments it got from cudaMalloc and can only reuse a block for a request that fits in it. This module
follows the rules of c10/cuda/CUDACachingAllocator.cpp with its default settings (no expandable segments, no
max_split_size, no garbage-collection threshold), one stream:

- sizes round up to 512 bytes; requests up to 1 MiB come from a small pool of 2 MiB segments, larger ones from
  a large pool: a 20 MiB segment for requests under 10 MiB, else a segment of the request rounded up to 2 MiB;
- a request takes the smallest free block of its pool that fits (best fit, lowest address on ties), split when
  the rest is at least 512 bytes (small pool) or more than 1 MiB (large pool);
- a freed block merges with free neighbours of the same segment; segments go back only on `empty_cache` (no
  OOM retry here: the model answers what an unconstrained run reserves).

Pure Python, no torch: the estimator replays FSDP1's init through it (memory_layout), and measure/trace replays
a traced step's storages.
"""
from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20           # requests up to this go to the small pool
SMALL_BUFFER = 2 << 20         # small-pool segment
MIN_LARGE_ALLOC = 10 << 20     # large requests below this get a LARGE_BUFFER segment
LARGE_BUFFER = 20 << 20
ROUND_LARGE = 2 << 20


def round_size(size: int) -> int:
    return MIN_BLOCK if size < MIN_BLOCK else MIN_BLOCK * -(-size // MIN_BLOCK)


def segment_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-size // ROUND_LARGE)


@dataclass(eq=False)
class _Block:
    size: int
    addr: int
    small: bool
    free: bool = True
    prev: "_Block | None" = None
    next: "_Block | None" = None


@dataclass
class CachingAllocator:
    """The allocator's state; `malloc` / `free` by caller-chosen keys, peaks in bytes."""

    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    segments: int = 0
    _pools: dict[bool, list[tuple[int, int, int]]] = field(default_factory=lambda: {True: [], False: []})
    _blocks: dict[int, _Block] = field(default_factory=dict)
    _live: dict[object, _Block] = field(default_factory=dict)
    _next_addr: int = 0
    _ids: itertools.count = field(default_factory=itertools.count)

    def _insert(self, b: _Block) -> None:
        i = next(self._ids)
        self._blocks[i] = b
        bisect.insort(self._pools[b.small], (b.size, b.addr, i))

    def _remove(self, b: _Block) -> None:
        pool = self._pools[b.small]
        j = bisect.bisect_left(pool, (b.size, b.addr, -1))
        while pool[j][1] != b.addr:
            j += 1
        del self._blocks[pool[j][2]]
        del pool[j]

    def malloc(self, key: object, nbytes: int) -> None:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._pools[small]
        j = bisect.bisect_left(pool, (size, -1, -1))
        if j < len(pool):
            b = self._blocks.pop(pool[j][2])
            del pool[j]
        else:  # cudaMalloc a new segment
            seg = segment_size(size)
            b = _Block(seg, self._next_addr, small)
            self._next_addr += seg
            self.reserved += seg
            self.segments += 1
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        rest = b.size - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:
            tail = _Block(rest, b.addr + size, small, prev=b, next=b.next)
            if b.next is not None:
                b.next.prev = tail
            b.next, b.size = tail, size
            self._insert(tail)
        b.free = False
        self._live[key] = b
        self.allocated += b.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: object) -> None:
        b = self._live.pop(key)
        self.allocated -= b.size
        b.free = True
        for nb in (b.prev, b.next):
            if nb is not None and nb.free:
                self._remove(nb)
                if nb is b.prev:
                    b.addr, b.prev = nb.addr, nb.prev
                    if nb.prev is not None:
                        nb.prev.next = b
                else:
                    b.next = nb.next
                    if nb.next is not None:
                        nb.next.prev = b
                b.size += nb.size
        self._insert(b)

    def pinned_free(self) -> int:
        """Free bytes inside segments that still hold a live block: what releasing the cache cannot return (torch's
        release_cached_blocks, on a failed cudaMalloc or empty_cache, frees only segments with no live block)."""
        return sum(self._blocks[i].size for pool in self._pools.values() for _, _, i in pool
                   if self._blocks[i].prev is not None or self._blocks[i].next is not None)

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache(): return every segment that is entirely free."""
        for small, pool in self._pools.items():
            keep = []
            for size, addr, i in pool:
                b = self._blocks[i]
                if b.prev is None and b.next is None:
                    del self._blocks[i]
                    self.reserved -= b.size
                    self.segments -= 1
                else:
                    keep.append((size, addr, i))
            self._pools[small] = keep
