"""Checks from profile stores: the committed H200 measurements re-estimated with today's estimator."""
from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

import pytest

from ftscope.errors import FtscopeError
from ftscope.validate.store_cases import store_checks

DATA = Path(__file__).resolve().parents[2] / "data" / "measurements"


def test_bare_cuda_points_give_memory_and_time_checks():
    checks, skipped = store_checks(DATA / "gpu-timing.sqlite")
    counts = Counter(c.metric for c in checks)
    assert counts == {"peak_gib:allocated": 18, "peak_gib:reserved": 18, "fwd_bwd_opt_s": 18}
    assert skipped == []
    assert all(c.scenario.cluster.gpu.key == "h200" for c in checks)
    assert {c.scenario.model.name for c in checks} >= {"llama-3.2-1b (as built)", "mixtral-8x7b (as built)"}


def test_hooked_step_times_are_left_out_with_the_reason():
    checks, skipped = store_checks(DATA / "gpu-runs.sqlite")
    assert not [c for c in checks if c.metric == "fwd_bwd_opt_s"]
    assert len(skipped) == sum(1 for c in checks if c.metric == "peak_gib:reserved")
    assert all(why == "timed with synchronizing layer hooks" for _, why in skipped)


def test_estimated_tensor_memory_tracks_the_h200_allocator():
    """The estimator's allocated bytes against torch.cuda.max_memory_allocated on 84 measured H200 points."""
    errs = []
    for name in ("gpu-runs.sqlite", "gpu-long.sqlite", "gpu-timing.sqlite"):
        checks, _ = store_checks(DATA / name)
        errs += [abs(c.predict() / c.measured - 1) * 100 for c in checks if c.metric == "peak_gib:allocated"]
    assert len(errs) == 84
    assert statistics.median(errs) < 5.0
    assert sum(e < 10 for e in errs) >= 0.9 * len(errs)


def test_a_missing_store_is_a_user_error(tmp_path):
    with pytest.raises(FtscopeError, match="not found"):
        store_checks(tmp_path / "nope.sqlite")
