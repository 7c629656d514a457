"""Peak memory of a real training step, on CUDA or on CPU.

CUDA: the caching allocator's own counters (`max_memory_allocated`, `max_memory_reserved`), which is what the
estimate's `memory.peak_gib` predicts. An optional cap (`set_per_process_memory_fraction`) makes a small
budget raise the real `torch.OutOfMemoryError`.

CPU has no allocator statistics, so the dispatch-level `TensorTracker` (tracker.py) counts tensor storages
instead; with a cap it raises `SimulatedOOM`, so `--find-max-batch` can be exercised on CPU. Process RSS (peak
resident set, resettable on Linux) is recorded beside it.

torch is imported only when a meter or tracker is used: `is_oom` and `SimulatedOOM` work without it.
"""
from __future__ import annotations

import dataclasses
import resource
import sys
from typing import Any, Callable, Iterable

from .tracker import GiB, SimulatedOOM, TensorTracker

# Substrings of RuntimeError messages that mean "out of memory" on backends whose errors have no own type
# (older torch, the CPU allocator, cuBLAS workspace allocation, ROCm, MPS).
_OOM_TEXT = (
    "CUDA out of memory",
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "DefaultCPUAllocator: can't allocate memory",
    "HIP out of memory",
    "MPS backend out of memory",
)


def is_oom(exc: BaseException | None) -> bool:
    """True for any out-of-memory error: torch's OutOfMemoryError (CUDA), SimulatedOOM, MemoryError, or a
    RuntimeError whose text is a known OOM message. Follows explicit `raise ... from` chains."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, (SimulatedOOM, MemoryError)):
            return True
        torch = sys.modules.get("torch")  # an error from torch means torch is already imported
        if torch is not None:
            oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
            if oom_type is not None and isinstance(exc, oom_type):
                return True
        if isinstance(exc, RuntimeError) and any(t in str(exc) for t in _OOM_TEXT):
            return True
        exc = exc.__cause__
        seen += 1
    return False


# -- process resident memory ------------------------------------------------------------------------------


def _proc_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def rss_bytes() -> int | None:
    """Current resident set size of this process (Linux /proc), or None where unavailable."""
    kib = _proc_status_kib("VmRSS")
    return None if kib is None else kib * 1024


def peak_rss_bytes() -> int:
    """Peak resident set size since process start or the last successful `reset_peak_rss`."""
    kib = _proc_status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (Linux >= 4.0: write 5 to clear_refs). False where unsupported, in
    which case `peak_rss_bytes` is the process-lifetime peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# -- one meter for both devices ---------------------------------------------------------------------------


@dataclasses.dataclass
class MemoryReport:
    """Peak memory of one measured window (a step, or a few)."""

    device: str
    """'cpu' or 'cuda:N'."""
    method: str
    """'cuda-allocator' (torch's caching allocator counters) or 'dispatch-tracker' (CPU TensorTracker)."""
    peak_allocated_bytes: int
    """Peak bytes held by live tensors: CUDA max_memory_allocated; CPU tracker peak."""
    peak_reserved_bytes: int | None
    """CUDA max_memory_reserved (what the estimate's peak_gib predicts); None on CPU (no caching allocator)."""
    start_allocated_bytes: int
    """Live tensor bytes when the window opened (weights, grads and optimizer state already present)."""
    end_allocated_bytes: int
    """Live tensor bytes when the window closed."""
    rss_start_bytes: int | None
    """Process resident set size when the window opened."""
    rss_peak_bytes: int
    """Peak process RSS during the window (process-lifetime peak where the kernel cannot reset it)."""
    rss_peak_is_windowed: bool
    """True when the RSS peak was reset at the window start, so it covers this window only."""
    cap_bytes: int | None = None
    """The memory cap in force, if any."""
    oom: bool = False
    """The window ended in an out-of-memory error (the peaks are then up to the failure)."""

    @property
    def peak_gib(self) -> float:
        """The comparable headline number: reserved on CUDA, tracked tensor bytes on CPU."""
        peak = self.peak_reserved_bytes if self.peak_reserved_bytes is not None else self.peak_allocated_bytes
        return peak / GiB

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["peak_gib"] = self.peak_gib
        return d


class MemoryMeter:
    """Measure peak memory over a `with` block on CUDA or CPU.

    `seed`: the model / optimizer / tensors alive before the block (needed on CPU, where the tracker only sees
    allocations made inside it; ignored on CUDA, whose allocator already counts them). `cap_bytes` makes going
    over the budget raise: SimulatedOOM on CPU, torch.OutOfMemoryError on CUDA (via the per-process memory
    fraction, restored on exit). After the block, `report` holds a MemoryReport even if the block raised.
    """

    def __init__(self, device: str = "cpu", seed: Iterable[Any] = (), cap_bytes: int | None = None) -> None:
        self.device = device
        self.seed = tuple(seed)
        self.cap_bytes = cap_bytes
        self.report: MemoryReport | None = None
        self._tracker: TensorTracker | None = None
        self._restore: Callable[[], None] | None = None
        self._cuda_index: int | None = None

    @property
    def tracker(self) -> TensorTracker | None:
        """The CPU tracker (None on CUDA)."""
        return self._tracker

    def __enter__(self) -> "MemoryMeter":
        import torch

        self._rss_windowed = reset_peak_rss()
        self._rss_start = rss_bytes()
        if self.device.startswith("cuda"):
            dev = torch.device(self.device)
            idx = torch.cuda.current_device() if dev.index is None else dev.index
            self._cuda_index = idx
            torch.cuda.synchronize(idx)
            if self.cap_bytes is not None:
                total = torch.cuda.get_device_properties(idx).total_memory
                get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
                before = get(idx) if get is not None else 1.0
                torch.cuda.set_per_process_memory_fraction(min(1.0, self.cap_bytes / total), idx)
                self._restore = lambda: torch.cuda.set_per_process_memory_fraction(before, idx)
            torch.cuda.reset_peak_memory_stats(idx)
            self._start = int(torch.cuda.memory_allocated(idx))
        else:
            self._tracker = TensorTracker(*self.seed, cap_bytes=self.cap_bytes)
            self._start = self._tracker.live_bytes
            self._tracker.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        import torch

        oom = exc is not None and is_oom(exc)
        try:
            if self._cuda_index is not None:
                idx = self._cuda_index
                torch.cuda.synchronize(idx)
                self.report = MemoryReport(
                    device=f"cuda:{idx}", method="cuda-allocator",
                    peak_allocated_bytes=int(torch.cuda.max_memory_allocated(idx)),
                    peak_reserved_bytes=int(torch.cuda.max_memory_reserved(idx)),
                    start_allocated_bytes=self._start, end_allocated_bytes=int(torch.cuda.memory_allocated(idx)),
                    rss_start_bytes=self._rss_start, rss_peak_bytes=peak_rss_bytes(),
                    rss_peak_is_windowed=self._rss_windowed, cap_bytes=self.cap_bytes, oom=oom,
                )
            else:
                tr = self._tracker
                assert tr is not None
                tr.__exit__(exc_type, exc, tb)
                self.report = MemoryReport(
                    device="cpu", method="dispatch-tracker", peak_allocated_bytes=tr.peak_bytes,
                    peak_reserved_bytes=None, start_allocated_bytes=self._start, end_allocated_bytes=tr.live_bytes,
                    rss_start_bytes=self._rss_start, rss_peak_bytes=peak_rss_bytes(),
                    rss_peak_is_windowed=self._rss_windowed, cap_bytes=self.cap_bytes, oom=oom,
                )
        finally:
            if self._restore is not None:
                self._restore()
                self._restore = None


def cuda_empty_cache() -> None:
    """Return cached CUDA blocks to the driver, if torch is loaded and CUDA initialized (between OOM tries)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def bytes_to_gib(n: int | float | None) -> float | None:
    return None if n is None else n / GiB


__all__ = ["is_oom", "MemoryMeter", "MemoryReport", "rss_bytes", "peak_rss_bytes", "reset_peak_rss", "cuda_empty_cache"]
