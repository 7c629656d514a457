"""What one rank of a distributed profile measures: tensor memory (CUDA allocator counters, or on CPU the
dispatch-level tracker taught to see sharded engines), the static breakdown of what the engine holds, and time
in collectives under torch.profiler.
"""
from __future__ import annotations

import contextlib
import gc
import re
import time
from typing import Any, Callable, Iterator

from .engines import Engine

COLLECTIVE_PATTERN = r"all_?reduce|all_?gather|reduce_?scatter|broadcast|gloo|nccl"
"""Event names (case-insensitive) counted as time in collectives."""


_TRACKER_CLASS: Any = None


def _tracker_class() -> Any:
    """TensorTracker that counts DTensors by their local shard and can be told about storage resizes."""
    global _TRACKER_CLASS
    if _TRACKER_CLASS is None:
        from torch.distributed.tensor import DTensor

        from ..runtime.tracker import TensorTracker

        def local(x: Any) -> Any:
            if isinstance(x, DTensor):
                return x._local_tensor
            if isinstance(x, (tuple, list)) and any(isinstance(o, (DTensor, tuple, list)) for o in x):
                return [local(o) for o in x]
            return x

        class ShardAwareTracker(TensorTracker):
            def _register(self, t: Any) -> None:
                super()._register(local(t))

            def _after_op(self, out: Any) -> None:
                super()._after_op(local(out))

            def resized(self, t: Any) -> None:
                """A storage changed size outside the dispatcher (FSDP2 alloc_storage / free_storage)."""
                st = t.untyped_storage()
                key, n = st._cdata, st.nbytes()
                entry = self._storages.get(key)
                delta = n - (entry[1] if entry is not None else 0)
                if delta:
                    self._commit(st, key, delta)
                    self.peak_bytes = max(self.peak_bytes, self.live_bytes)

        _TRACKER_CLASS = ShardAwareTracker
    return _TRACKER_CLASS


@contextlib.contextmanager
def _fsdp_resize_hooks(tracker: Any) -> Iterator[None]:
    """Report FSDP2's storage resizes to the tracker while it runs (they bypass the dispatcher)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    saved = (_fsdp_param.alloc_storage, _fsdp_param.free_storage, _fsdp_param_group.alloc_storage)

    def alloc(t: Any) -> None:
        saved[0](t)
        tracker.resized(t)

    def free(t: Any) -> None:
        saved[1](t)
        tracker.resized(t)

    _fsdp_param.alloc_storage, _fsdp_param.free_storage, _fsdp_param_group.alloc_storage = alloc, free, alloc
    try:
        yield
    finally:
        _fsdp_param.alloc_storage, _fsdp_param.free_storage, _fsdp_param_group.alloc_storage = saved


def live_tensors() -> list[Any]:
    """Every tensor Python can reach right now (after a collection)."""
    import torch

    gc.collect()
    tensor = torch.Tensor
    return [o for o in gc.get_objects() if issubclass(type(o), tensor)]  # type(): no __class__ look-ups


def static_breakdown(engine: Engine, model: Any) -> dict[str, int]:
    """Bytes of the tensor storages alive between steps, by what holds them: weights (parameters, ZeRO-3
    partitions), gradients, optimizer (state and master copies), other (engine buffers, caches)."""
    import torch
    from torch.distributed.tensor import DTensor

    seen: set[int] = set()
    out = {"weights": 0, "gradients": 0, "optimizer": 0, "other": 0}

    def add(t: Any, cat: str) -> None:
        if not isinstance(t, torch.Tensor):
            return
        if isinstance(t, DTensor):
            t = t._local_tensor
        if t.is_meta:
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        if st._cdata in seen:
            return
        seen.add(st._cdata)
        out[cat] += st.nbytes()

    params = list(model.parameters())
    for p in params:
        add(p, "weights")
        add(getattr(p, "ds_tensor", None), "weights")
    for p in params:
        add(p.grad, "gradients")
    opt = engine.opt
    base = getattr(opt, "optimizer", opt)  # DeepSpeed wraps the client optimizer
    for o in {id(opt): opt, id(base): base}.values():
        for st in getattr(o, "state", {}).values():
            for v in (st.values() if isinstance(st, dict) else ()):
                add(v, "optimizer")
        for group in getattr(o, "param_groups", ()):
            for p in group["params"]:
                add(p, "optimizer")  # ZeRO's fp32 master partitions (model params were counted above)
                add(p.grad, "gradients")
    for t in live_tensors():
        add(t, "other")
    return out


@contextlib.contextmanager
def measure_memory(device: str, fsdp: bool) -> Iterator[dict[str, Any]]:
    """Peak memory over the block: CUDA allocator counters, or the shard-aware tracker seeded with every live
    tensor. Yields a dict whose "mark" entry, called with a phase name at the end of each phase, records the
    peak of that phase in "phase_peak_bytes"; after the block the dict holds the MemoryReport fields."""
    import torch

    from ..runtime.meters import MemoryReport, peak_rss_bytes, reset_peak_rss, rss_bytes

    phases: dict[str, int] = {}
    box: dict[str, Any] = {}
    windowed = reset_peak_rss()
    rss0 = rss_bytes()
    if device.startswith("cuda"):
        idx = torch.device(device).index
        torch.cuda.synchronize(idx)
        torch.cuda.reset_peak_memory_stats(idx)
        start = int(torch.cuda.memory_allocated(idx))
        peak_reserved = 0

        def mark(phase: str) -> None:
            nonlocal peak_reserved
            torch.cuda.synchronize(idx)
            phases[phase] = max(phases.get(phase, 0), int(torch.cuda.max_memory_allocated(idx)))
            peak_reserved = max(peak_reserved, int(torch.cuda.max_memory_reserved(idx)))
            torch.cuda.reset_peak_memory_stats(idx)

        box["mark"] = mark
        yield box
        mark("end")
        peak = max(phases.values())
        phases.pop("end")
        report = MemoryReport(device=device, method="cuda-allocator", peak_allocated_bytes=peak,
                              peak_reserved_bytes=peak_reserved, start_allocated_bytes=start,
                              end_allocated_bytes=int(torch.cuda.memory_allocated(idx)), rss_start_bytes=rss0,
                              rss_peak_bytes=peak_rss_bytes(), rss_peak_is_windowed=windowed)
    else:
        tracker = _tracker_class()(*live_tensors())
        start = tracker.live_bytes

        def mark(phase: str) -> None:
            phases[phase] = max(phases.get(phase, 0), tracker.peak_bytes)
            tracker.reset_peak()

        box["mark"] = mark
        hooks = _fsdp_resize_hooks(tracker) if fsdp else contextlib.nullcontext()
        with hooks, tracker:
            yield box
        mark("end")
        peak = max(phases.values())
        phases.pop("end")
        report = MemoryReport(device="cpu", method="dispatch-tracker", peak_allocated_bytes=peak,
                              peak_reserved_bytes=None, start_allocated_bytes=start,
                              end_allocated_bytes=tracker.live_bytes, rss_start_bytes=rss0,
                              rss_peak_bytes=peak_rss_bytes(), rss_peak_is_windowed=windowed)
    box.pop("mark")
    box.update(report.to_dict())
    box["phase_peak_bytes"] = phases
    box["peak_phase"] = max(phases, key=phases.get)


# -- collectives ------------------------------------------------------------------------------------------------

def collective_time(step: Callable[[], Any], device: str) -> dict[str, Any]:
    """Run `step` once under torch.profiler; time in events matching COLLECTIVE_PATTERN (union of intervals)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    pat = re.compile(COLLECTIVE_PATTERN, re.IGNORECASE)
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        step()
    wall = time.perf_counter() - t0
    spans: list[tuple[float, float]] = []
    by_name: dict[str, dict[str, float]] = {}
    for ev in prof.events():
        if not pat.search(ev.name):
            continue
        start, end = ev.time_range.start, ev.time_range.end
        spans.append((start, end))
        d = by_name.setdefault(ev.name, {"count": 0, "total_s": 0.0})
        d["count"] += 1
        d["total_s"] += (end - start) / 1e6
    spans.sort()
    total = 0.0
    cur_s = cur_e = None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    top = dict(sorted(by_name.items(), key=lambda kv: -kv[1]["total_s"])[:12])
    return {"pattern": COLLECTIVE_PATTERN, "collective_s": total / 1e6, "profiled_step_s": wall,
            "fraction": (total / 1e6) / wall if wall > 0 else None, "events": top,
            "note": "one extra step under torch.profiler; union of matching event intervals on every thread"}


# -- the rank's run ---------------------------------------------------------------------------------------------
