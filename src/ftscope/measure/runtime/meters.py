"""Peak memory of a real training step, on CUDA or on CPU.

CUDA: the caching allocator's own counters (`max_memory_allocated`, `max_memory_reserved`), which is what the
estimate's `memory.peak_gib` predicts. An optional cap (`set_per_process_memory_fraction`) makes a small
budget raise the real `torch.OutOfMemoryError`.

CPU has no allocator statistics, so `TensorTracker` counts at the dispatcher: a `TorchDispatchMode` sees the
output of every aten op, registers each new tensor storage with a weakref whose callback subtracts its bytes
when the storage dies, and keeps current and peak live bytes. What it sees is exactly what a CUDA allocator
would be asked for by the same ops (minus the allocator's 512-byte rounding and kernel-internal workspaces),
which is why a CPU run can stand in for a GPU when checking the memory model. With `cap_bytes`, an op whose
outputs would push live bytes over the cap raises `SimulatedOOM` instead, so `--find-max-batch` can be
exercised on CPU. Process RSS (peak resident set, resettable on Linux) is recorded beside it.

torch is imported only when a meter or tracker is used: `is_oom` and `SimulatedOOM` work without it.
"""
from __future__ import annotations

import dataclasses
import resource
import sys
import weakref
from typing import Any, Callable, Iterable

GiB = 2**30

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


class SimulatedOOM(RuntimeError):
    """Raised by `TensorTracker` when live tensor bytes would exceed its cap (CPU stand-in for a CUDA OOM)."""

    def __init__(self, requested_bytes: int, live_bytes: int, cap_bytes: int) -> None:
        self.requested_bytes = requested_bytes
        self.live_bytes = live_bytes
        self.cap_bytes = cap_bytes
        super().__init__(
            f"Simulated out of memory: tried to allocate {_fmt(requested_bytes)} with {_fmt(live_bytes)} live "
            f"under a cap of {_fmt(cap_bytes)}"
        )


def _fmt(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


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


# -- CPU tensor-bytes tracker -----------------------------------------------------------------------------

_MODE_CLASS: Any = None


def _mode_class() -> Any:
    """The TorchDispatchMode subclass, built on first use so importing this module does not import torch."""
    global _MODE_CLASS
    if _MODE_CLASS is None:
        from torch.utils._python_dispatch import TorchDispatchMode

        class _TrackingMode(TorchDispatchMode):
            def __init__(self, tracker: "TensorTracker") -> None:
                super().__init__()
                self.tracker = tracker

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                out = func(*args, **(kwargs or {}))
                self.tracker._after_op(out)
                return out

        _MODE_CLASS = _TrackingMode
    return _MODE_CLASS


class TensorTracker:
    """Live and peak bytes of tensor storages, counted at the aten dispatcher (use as a context manager).

    Storages that exist before the mode starts are invisible to it, so seed them: pass the model (parameters,
    buffers, grads, bitsandbytes quantization state), the optimizer (its state tensors) or any tensors to the
    constructor or to `seed()`. Each storage counts once however many views share it.
    Cost: on top of the ~15 us per op that any Python dispatch mode costs, a few us per op (a storage lookup
    per output; a weakref per new storage).
    """

    def __init__(self, *seed: Any, cap_bytes: int | None = None) -> None:
        import torch

        self._tensor_type = torch.Tensor
        self.cap_bytes = cap_bytes
        self.live_bytes = 0
        self.peak_bytes = 0
        self.ooms = 0
        # storage id (C++ StorageImpl address, stable while it lives) -> (weakref to the storage, bytes counted)
        self._storages: dict[int, tuple[weakref.ref, int]] = {}
        self._mode: Any = None
        self.seed(*seed)

    # seeding ------------------------------------------------------------------------------------------------
    def seed(self, *objs: Any) -> int:
        """Count tensors that already exist. Accepts modules, optimizers, tensors, and containers of them.
        Returns the bytes newly counted."""
        import torch

        before = self.live_bytes
        for t in _tensors_in(objs, torch):
            self._register(t)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return self.live_bytes - before

    # bookkeeping ----------------------------------------------------------------------------------------
    def _freed(self, key: int, ref: weakref.ref) -> None:
        entry = self._storages.get(key)
        # The identity check guards against a new storage that reused the address before this callback ran.
        if entry is not None and entry[0] is ref:
            del self._storages[key]
            self.live_bytes -= entry[1]

    def _storage_delta(self, t: Any) -> tuple[Any, int, int]:
        """(storage, key, bytes this tensor's storage adds if registered now)."""
        st = t.untyped_storage()
        key = st._cdata
        n = st.nbytes()
        entry = self._storages.get(key)
        return st, key, n - (entry[1] if entry is not None else 0)

    def _register(self, t: Any) -> None:
        if t.is_meta:
            return
        try:
            st, key, delta = self._storage_delta(t)
        except (RuntimeError, NotImplementedError):  # sparse / nested / fake tensors have no plain storage
            return
        if delta == 0:
            return
        self._commit(st, key, delta)

    def _commit(self, st: Any, key: int, delta: int) -> None:
        entry = self._storages.get(key)
        if entry is None:
            ref = weakref.ref(st, lambda r, k=key: self._freed(k, r))
            self._storages[key] = (ref, delta)
        else:  # the storage was resized in place (resize_, out= ops)
            self._storages[key] = (entry[0], entry[1] + delta)
        self.live_bytes += delta

    def _after_op(self, out: Any) -> None:
        if isinstance(out, self._tensor_type):  # fast path: most ops return one tensor
            if out.is_meta:
                return
            try:
                st = out.untyped_storage()
            except (RuntimeError, NotImplementedError):
                return
            key, n = st._cdata, st.nbytes()
            entry = self._storages.get(key)
            delta = n - entry[1] if entry is not None else n
            if delta == 0:  # a view, an in-place op, or an empty tensor
                return
            if delta > 0 and self.cap_bytes is not None and self.live_bytes + delta > self.cap_bytes:
                self.ooms += 1
                raise SimulatedOOM(delta, self.live_bytes, self.cap_bytes)
            self._commit(st, key, delta)
            if self.live_bytes > self.peak_bytes:
                self.peak_bytes = self.live_bytes
            return
        tensors = _flat_tensors(out, self._tensor_type)
        if not tensors:
            return
        pending: list[tuple[Any, int, int]] = []
        pending_keys: set[int] = set()
        new_bytes = 0
        for t in tensors:
            if t.is_meta:
                continue
            try:
                st, key, delta = self._storage_delta(t)
            except (RuntimeError, NotImplementedError):
                continue
            if delta > 0 and key not in pending_keys:
                pending.append((st, key, delta))
                pending_keys.add(key)
                new_bytes += delta
            elif delta < 0:  # shrunk in place; rare, account immediately
                self._commit(st, key, delta)
        if not pending:
            return
        if self.cap_bytes is not None and self.live_bytes + new_bytes > self.cap_bytes:
            # Not registered: the outputs die with the exception, as if the allocation had failed.
            self.ooms += 1
            raise SimulatedOOM(new_bytes, self.live_bytes, self.cap_bytes)
        for st, key, delta in pending:
            self._commit(st, key, delta)
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes

    # control ----------------------------------------------------------------------------------------------
    def reset_peak(self) -> None:
        """Start a new peak window from the current live bytes (like torch.cuda.reset_peak_memory_stats)."""
        self.peak_bytes = self.live_bytes

    def __enter__(self) -> "TensorTracker":
        self._mode = _mode_class()(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        mode, self._mode = self._mode, None
        mode.__exit__(*exc)


def _flat_tensors(out: Any, tensor_type: type) -> list[Any]:
    """Tensors in an op's output (a tensor, or nested tuples/lists of them)."""
    if isinstance(out, tensor_type):
        return [out]
    if isinstance(out, (tuple, list)):
        found: list[Any] = []
        for o in out:
            if isinstance(o, tensor_type):
                found.append(o)
            elif isinstance(o, (tuple, list)):
                found.extend(_flat_tensors(o, tensor_type))
        return found
    return []


def _tensors_in(objs: Iterable[Any], torch: Any) -> Iterable[Any]:
    """Every tensor reachable from modules, optimizers, tensors, mappings and sequences."""
    for obj in objs:
        if obj is None:
            continue
        if isinstance(obj, torch.Tensor):
            yield obj
            if obj.is_leaf and obj.grad is not None:
                yield obj.grad
            yield from _quant_state_tensors(obj, torch)
        elif isinstance(obj, torch.nn.Module):
            for p in obj.parameters():
                yield p
                if p.grad is not None:
                    yield p.grad
                yield from _quant_state_tensors(p, torch)
            yield from obj.buffers()
        elif isinstance(obj, torch.optim.Optimizer):
            for group in obj.param_groups:
                yield from _tensors_in(group["params"], torch)
            for state in obj.state.values():
                yield from _tensors_in(state.values(), torch)
        elif isinstance(obj, dict):
            yield from _tensors_in(obj.values(), torch)
        elif isinstance(obj, (list, tuple, set)):
            yield from _tensors_in(obj, torch)


def _quant_state_tensors(p: Any, torch: Any) -> Iterable[Any]:
    """bitsandbytes keeps NF4 absmax / code tensors on `weight.quant_state`, outside parameters and buffers."""
    qs = getattr(p, "quant_state", None)
    depth = 0
    while qs is not None and depth < 2:  # nested (double) quantization keeps a second state on state2
        for v in vars(qs).values():
            if isinstance(v, torch.Tensor):
                yield v
        qs = getattr(qs, "state2", None)
        depth += 1


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


__all__ = [
    "SimulatedOOM", "is_oom", "TensorTracker", "MemoryMeter", "MemoryReport",
    "rss_bytes", "peak_rss_bytes", "reset_peak_rss", "cuda_empty_cache", "GiB",
]
