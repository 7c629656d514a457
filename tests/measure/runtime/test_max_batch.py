"""Max-batch search (measure/runtime/max_batch.py): equals a brute-force scan for monotone fits, survives and records
OOMs, lets other errors through; and end to end on CPU with the tracker's memory cap."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from ftscope.measure.runtime.tracker import SimulatedOOM
from ftscope.measure.runtime.max_batch import find_max_batch


def brute(limit: int, cap: int) -> int:
    return max((b for b in range(1, cap + 1) if b <= limit), default=0)


def oom_above(limit: int, calls: list[int]):
    def try_batch(b: int) -> bool:
        calls.append(b)
        if b > limit:
            raise SimulatedOOM(b * 100, limit * 100, limit * 100)
        return True

    return try_batch


@given(limit=st.integers(0, 300), cap=st.integers(1, 257), start=st.integers(1, 64),
       style=st.sampled_from(["raise", "false"]))
@settings(max_examples=300, deadline=None)
def test_equals_brute_force(limit: int, cap: int, start: int, style: str) -> None:
    calls: list[int] = []
    fn = oom_above(limit, calls) if style == "raise" else (lambda b: calls.append(b) or b <= limit)
    res = find_max_batch(fn, start=start, cap=cap, release=None)
    assert res.max_batch == brute(limit, cap)
    assert res.capped == (limit >= cap)
    assert [t.batch for t in res.tries] == calls  # every try recorded, in order, none repeated
    assert len(set(calls)) == len(calls)
    assert all(1 <= b <= cap for b in calls)
    assert [t.batch for t in res.ooms] == [b for b in calls if b > limit]
    assert all((t.status == "ok") == (t.batch <= limit) for t in res.tries)
    assert len(calls) <= 2 * math.ceil(math.log2(cap + 1)) + 3 + math.ceil(math.log2(start + 1))


def test_records_each_oom_with_message_and_calls_back() -> None:
    seen = []
    res = find_max_batch(oom_above(37, []), start=1, cap=1024, on_try=seen.append)
    assert res.max_batch == 37
    assert [t.batch for t in res.tries] == [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37]
    assert [t.batch for t in res.ooms] == [64, 48, 40, 38]
    assert all(t.error and "out of memory" in t.error for t in res.ooms)
    assert seen == res.tries
    assert res.to_dict()["max_batch"] == 37


def test_nothing_fits_and_start_too_big() -> None:
    assert find_max_batch(oom_above(0, []), cap=64).max_batch == 0
    calls: list[int] = []
    res = find_max_batch(oom_above(5, calls), start=32, cap=64)
    assert res.max_batch == 5 and calls[0] == 32


def test_other_errors_propagate() -> None:
    def broken(b: int) -> bool:
        raise ValueError("shape mismatch")

    with pytest.raises(ValueError):
        find_max_batch(broken)
    with pytest.raises(ValueError):
        find_max_batch(lambda b: True, cap=0)


def test_cpu_memory_cap_matches_brute_force_scan() -> None:
    """The acceptance check of issue 4 in miniature: a real training step under the tracker's cap."""
    torch = pytest.importorskip("torch")
    from ftscope.measure.runtime.meters import MemoryMeter

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.GELU(), torch.nn.Linear(512, 64))
    opt = torch.optim.AdamW(model.parameters())
    base = MemoryMeter("cpu", seed=(model, opt))
    with base:
        pass
    cap = base.report.start_allocated_bytes + 3_000_000  # room for some batches, not for 64

    def step(b: int) -> bool:
        with MemoryMeter("cpu", seed=(model, opt), cap_bytes=cap):
            x = torch.randn(b, 16, 64)
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return True

    released = []
    res = find_max_batch(step, cap=64, release=released.append)
    assert released == [t.status == "oom" for t in res.tries]
    scan = 0
    for b in range(1, 65):
        try:
            step(b)
            scan = b
        except SimulatedOOM:
            break
    assert 1 < res.max_batch < 64
    assert res.max_batch == scan
    assert res.ooms and all(t.batch > scan for t in res.ooms)


@pytest.mark.parametrize("limit", [0, 1, 37, 256])
def test_a_resumed_search_replays_its_recorded_tries_and_ends_where_the_whole_one_does(limit):
    calls: list[int] = []
    whole = find_max_batch(oom_above(limit, calls), cap=256, release=None)
    for killed_after in range(len(whole.tries) + 1):
        calls.clear()
        resumed = find_max_batch(oom_above(limit, calls), cap=256, release=None, recorded=whole.tries[:killed_after])
        assert resumed.max_batch == whole.max_batch
        assert calls == [t.batch for t in whole.tries[killed_after:]]  # only the tries it had not made yet
        assert [t.batch for t in resumed.tries] == [t.batch for t in whole.tries]


def test_recorded_tries_are_read_back_from_the_store(tmp_path):
    from ftscope.measure.runtime.profile import recorded_tries
    from ftscope.measure.store import Store

    with Store(tmp_path / "r.sqlite") as st:
        run = st.start_run({"model": "tiny"}, {"device": "cpu"})
        st.record_point(run, "maxbatch:try=1", "ok", {"batch": 1, "status": "ok", "seconds": 0.5, "error": None})
        st.record_point(run, "maxbatch:try=2", "oom", {"batch": 2, "status": "oom", "seconds": 0.7, "error": "OOM"})
        st.record_point(run, "maxbatch:try=3", "ok", {"batch": "three"})  # edited by hand: not a try
        st.record_point(run, "batch=4", "ok", {"batch": 4})
        tries = recorded_tries(st, run)
    assert [(t.batch, t.status, t.error) for t in tries] == [(1, "ok", None), (2, "oom", "OOM")]
