"""Live and peak bytes of tensor storages on CPU, counted at the aten dispatcher (`TensorTracker`).

A `TorchDispatchMode` sees the output of every aten op, registers each new tensor storage with a weakref whose
callback subtracts its bytes when the storage dies, and keeps current and peak live bytes. What it sees is
exactly what a CUDA allocator would be asked for by the same ops (minus the allocator's 512-byte rounding and
kernel-internal workspaces), which is why a CPU run can stand in for a GPU when checking the memory model. With
`cap_bytes`, an op whose outputs would push live bytes over the cap raises `SimulatedOOM` instead.

torch is imported only when a tracker is made: `SimulatedOOM` works without it.
"""
from __future__ import annotations

import weakref
from typing import Any, Iterable

GiB = 2**30


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


_MODE_CLASS: Any = None


def forwarding_mode(handler: Any) -> Any:
    """A TorchDispatchMode that hands every aten op to `handler(func, args, kwargs)` (which runs it and returns
    its output); the class is built on first use so importing this module does not import torch."""
    global _MODE_CLASS
    if _MODE_CLASS is None:
        from torch.utils._python_dispatch import TorchDispatchMode

        class _ForwardingMode(TorchDispatchMode):
            def __init__(self, handler: Any) -> None:
                super().__init__()
                self.handler = handler

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                return self.handler(func, args, kwargs or {})

        _MODE_CLASS = _ForwardingMode
    return _MODE_CLASS(handler)


class DispatchObserver:
    """Sees every aten op while entered (`with observer: ...`): subclasses define `dispatch`, which runs the op
    and returns its output."""

    _mode: Any = None

    def dispatch(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    def __enter__(self) -> Any:
        self._mode = forwarding_mode(self.dispatch)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        mode, self._mode = self._mode, None
        mode.__exit__(*exc)


class TensorTracker(DispatchObserver):
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

    def dispatch(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        out = func(*args, **kwargs)
        self._after_op(out)
        return out


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
