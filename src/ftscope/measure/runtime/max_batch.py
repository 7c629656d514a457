"""Largest micro-batch that fits, found by running it: grow by doubling, then bisect, surviving OOMs.

The IISWC study's first characterization is the maximum batch size per model, method and GPU; this is how a
real run finds it. Every try is recorded (batch, ok | oom, seconds) because the OOMs are data too: they bound
the memory model from above.

Fit is assumed monotone in the batch size (if b fits, every smaller batch fits). Under that assumption the
result equals a brute-force scan of 1..cap while trying only O(log cap) batches.
"""
from __future__ import annotations

import dataclasses
import gc
import time
from typing import Any, Callable, Iterable, Sequence

from .meters import MemoryMeter, cuda_empty_cache, is_oom


@dataclasses.dataclass(frozen=True)
class Try:
    """One attempted batch size."""

    batch: int
    """The micro-batch size tried."""
    status: str
    """'ok' (fits) or 'oom' (an out-of-memory error, or the try function answered False)."""
    seconds: float
    """Wall time of the try, including the failed allocation."""
    error: str | None = None
    """The OOM message, when it raised one."""


@dataclasses.dataclass(frozen=True)
class MaxBatch:
    """Outcome of `find_max_batch`."""

    max_batch: int
    """Largest batch that fits in [1, cap]; 0 when not even batch 1 fits."""
    tries: list[Try]
    """Every try, in order."""
    capped: bool
    """True when `cap` itself fit, so the real limit may be higher."""

    @property
    def ooms(self) -> list[Try]:
        return [t for t in self.tries if t.status == "oom"]

    def to_dict(self) -> dict:
        return {"max_batch": self.max_batch, "capped": self.capped,
                "tries": [dataclasses.asdict(t) for t in self.tries]}


def oom_probe(step: Callable[[int], Any], device: str, seed: Iterable[Any], cap_bytes: int | None,
              optimizer: Any) -> Callable[[int], bool]:
    """A `try_batch` for find_max_batch: run `step(b)` under a memory meter (its cap makes going over raise an
    OOM: torch's on CUDA, SimulatedOOM on CPU), then drop the gradients whatever happened."""
    def try_batch(b: int) -> bool:
        with MemoryMeter(device, seed=seed, cap_bytes=cap_bytes):
            try:
                step(b)
            finally:
                optimizer.zero_grad(set_to_none=True)
        return True

    return try_batch


def release_memory(after_oom: bool) -> None:
    """Between tries: after an OOM, collect the failed step's debris (reference cycles through frames can
    keep its tensors alive); always hand cached CUDA blocks back so the next try's reserved peak is its own.
    A full gc pass costs ~0.1-0.5 s with transformers loaded, hence not after every successful try."""
    if after_oom:
        gc.collect()
    cuda_empty_cache()


def find_max_batch(
    try_batch: Callable[[int], bool | None],
    start: int = 1,
    cap: int = 4096,
    on_try: Callable[[Try], None] | None = None,
    release: Callable[[bool], None] | None = release_memory,
    recorded: Sequence[Try] = (),
) -> MaxBatch:
    """Largest batch size b in [1, cap] for which `try_batch(b)` succeeds.

    `try_batch(b)` runs a step at batch b and either returns (True or None: fits; False: does not) or raises.
    Out-of-memory errors (see `memory.is_oom`: CUDA OOM, SimulatedOOM, ...) count as 'does not fit'; any other
    exception propagates, since a crash is not a memory limit. Batches double from `start` until one fails or
    `cap` is reached, then the gap is bisected; a failing `start` bisects down towards 1. `on_try` is called
    after each try (progress bars, writing the try to the store). `release(after_oom)` runs between tries (default
    `release_memory`: gc after an OOM, torch.cuda.empty_cache always), so one try's debris and cached blocks do
    not count against the next. `recorded`: tries an interrupted search already made (read back from the store
    on --resume); the search replays them without running them again and carries on from there.
    """
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    start = max(1, min(start, cap))
    tries: list[Try] = list(recorded)
    known: dict[int, bool] = {t.batch: t.status == "ok" for t in recorded}

    def fits(b: int) -> bool:
        if b in known:
            return known[b]
        t0 = time.perf_counter()
        error = None
        try:
            ok = try_batch(b) is not False
        except Exception as e:  # noqa: BLE001 - filtered right below
            if not is_oom(e):
                raise
            ok, error = False, str(e).splitlines()[0][:500] if str(e) else type(e).__name__
            # Drop the traceback's frames (they hold the failed step's tensors) before collecting.
            e.__traceback__ = None
            del e
        record = Try(batch=b, status="ok" if ok else "oom", seconds=time.perf_counter() - t0, error=error)
        tries.append(record)
        known[b] = ok
        if release is not None:
            release(not ok)
        if on_try is not None:
            on_try(record)
        return ok

    # Grow: lo always fits (0 stands for "nothing fits yet"), hi is the smallest known failure.
    lo, hi = 0, None
    b = start
    while True:
        if fits(b):
            lo = b
            if b >= cap:
                break
            b = min(b * 2, cap)
        else:
            hi = b
            break
    if hi is None:  # cap itself fits
        return MaxBatch(max_batch=lo, tries=tries, capped=True)
    # Bisect (lo, hi): everything <= lo fits, everything >= hi does not.
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return MaxBatch(max_batch=lo, tries=tries, capped=False)
