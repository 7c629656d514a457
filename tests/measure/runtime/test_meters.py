"""Peak-memory measurement (measure/runtime/meters.py, tracker.py): the CPU dispatch-level tracker, its cap, OOM recognition,
the meter, process RSS. Expected byte counts are computed by hand from element counts and dtype sizes."""
from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

from ftscope.measure.runtime.meters import MemoryMeter, is_oom, peak_rss_bytes, reset_peak_rss, rss_bytes  # noqa: E402
from ftscope.measure.runtime.tracker import SimulatedOOM, TensorTracker  # noqa: E402


def test_known_allocation_sequence_peak() -> None:
    with TensorTracker() as tr:
        a = torch.empty(1000)  # 4000 B
        b = torch.empty(250, dtype=torch.float64)  # 2000 B -> 6000
        v = a.view(10, 100)  # a view shares a's storage: +0
        v2 = a[10:20]  # so does a slice
        assert tr.live_bytes == 6000
        b.add_(1.0)  # in place: +0
        del a, v2
        assert tr.live_bytes == 6000  # v still holds the storage
        del v
        assert tr.live_bytes == 2000
        c = b + b  # 2000 -> 4000
        d = torch.empty(2, 1000, dtype=torch.bfloat16)  # 4000 -> 8000 = peak
        del c, d
        e = torch.zeros(100, dtype=torch.int8)  # 100
        assert tr.live_bytes == 2100
        del b, e
    assert tr.peak_bytes == 8000
    assert tr.live_bytes == 0


def test_resize_in_place_is_counted() -> None:
    with TensorTracker() as tr:
        x = torch.empty(10)
        x.resize_(1000)
        assert tr.live_bytes == 4000
        torch.cat([torch.ones(500), torch.ones(500)], out=x)  # fits in place
        assert tr.live_bytes == 4000 and tr.peak_bytes == 4000 + 2 * 2000
        del x


def test_seeding_counts_weights_grads_and_optimizer_state() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 8))
    n = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 32)).sum().backward()
    opt.step()  # creates exp_avg, exp_avg_sq (n floats each) and one scalar step tensor per param
    tr = TensorTracker(model, opt)
    steps = sum(1 for s in opt.state.values() if isinstance(s.get("step"), torch.Tensor))
    assert tr.live_bytes == 4 * (n + n + 2 * n) + 4 * steps
    assert tr.seed(model, opt) == 0  # already counted: each storage once


def test_training_step_peak_above_resident_state() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 64)
    with MemoryMeter("cpu", seed=(model, opt, x)) as mm:
        model(x).pow(2).mean().backward()
        opt.step()
    rep = mm.report
    assert rep is not None and rep.method == "dispatch-tracker" and not rep.oom
    weights = 4 * sum(p.numel() for p in model.parameters())
    assert rep.start_allocated_bytes == weights + x.numel() * 4
    # grads stay alive after the step, and at least the hidden activation (32 x 256 floats) was live at the peak
    assert rep.end_allocated_bytes >= rep.start_allocated_bytes + weights
    assert rep.peak_allocated_bytes >= rep.start_allocated_bytes + weights + 32 * 256 * 4
    assert rep.peak_reserved_bytes is None and rep.peak_gib == rep.peak_allocated_bytes / 2**30
    assert rep.rss_peak_bytes > 0


def test_cap_raises_simulated_oom_recognized_by_is_oom() -> None:
    with TensorTracker(cap_bytes=10_000) as tr:
        a = torch.empty(2000)  # 8000 B: fits
        with pytest.raises(SimulatedOOM) as info:
            torch.empty(1000)  # +4000 > cap
        assert is_oom(info.value) and "out of memory" in str(info.value)
        assert info.value.requested_bytes == 4000 and info.value.live_bytes == 8000
        assert tr.live_bytes == 8000 and tr.ooms == 1  # the failed allocation was never counted
        del a
    assert tr.peak_bytes <= 10_000


def test_oom_inside_backward_keeps_its_type() -> None:
    """The autograd engine re-raises the tracker's exception with its type, so the batch search sees an OOM."""
    model = torch.nn.Linear(256, 256)
    x = torch.randn(64, 256)
    tr = TensorTracker(model, x)
    fwd_peak_cap = tr.live_bytes + 2 * 64 * 256 * 4 + 8  # room for forward, not for the weight gradient too
    tr.cap_bytes = fwd_peak_cap
    stage = "forward"
    with pytest.raises(Exception) as info:
        with tr:
            loss = model(x).sum()
            stage = "backward"
            loss.backward()
    assert stage == "backward"
    assert isinstance(info.value, SimulatedOOM) and is_oom(info.value)


def test_meter_reports_oom() -> None:
    with pytest.raises(SimulatedOOM):
        with MemoryMeter("cpu", cap_bytes=1000) as mm:
            torch.empty(1000)
    assert mm.report is not None and mm.report.oom and mm.report.cap_bytes == 1000


def test_is_oom_variants() -> None:
    assert is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"))
    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"))
    assert is_oom(MemoryError())
    wrapped = RuntimeError("step failed")
    wrapped.__cause__ = SimulatedOOM(1, 2, 3)
    assert is_oom(wrapped)
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(ValueError("CUDA out of memory"))  # only runtime errors carry allocator messages
    assert not is_oom(None)


def test_rss_helpers() -> None:
    reset_peak_rss()
    now = rss_bytes()
    assert now is None or now > 0
    assert peak_rss_bytes() > 0
    gc.collect()
