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


def _store_with(tmp_path, runs):
    import json

    from ftscope.measure.store import Store

    tiny = json.loads((DATA.parents[1] / "examples" / "tiny-mixtral" / "config.json").read_text())
    with Store(tmp_path / "runs.sqlite") as st:
        for scenario, build in runs:
            run = st.start_run({"scenario": scenario, "options": {"device": "cpu"},
                                "build": {"config": tiny} if build else {}}, {"device": "cpu"})
            st.record_point(run, "batch=1", "ok", {"batch": 1, "memory": {"peak_allocated_bytes": 2**24}})
    return tmp_path / "runs.sqlite"


def test_runs_are_re_estimated_from_their_config_or_listed_never_dropped(tmp_path):
    base = {"mix": {"method": "full", "precision": "fp32", "attention": "sdpa", "experts_backend": "eager"},
            "workload": {"micro_batch_size": 1, "seq_len": 32}}
    db = _store_with(tmp_path, [
        ({**base, "model": "relative/path/that/moved/config.json"}, True),  # re-estimated from the config as built
        ({**base, "model": "tiny"}, False),  # no config as built
        ({**base, "model": "tiny", "mix": {"method": "prefix"}}, True),  # refused by today's checks
    ])
    checks, skipped = store_checks(db)
    assert [c.case_id for c in checks] == ["db:runs.sqlite:run1"]
    assert skipped == [("db:runs.sqlite:run2 (every point)", "cannot re-estimate: no config as built in the store"),
                       ("db:runs.sqlite:run3 (every point)",
                        "cannot re-estimate: mix.method must be one of full, lora, qlora; got 'prefix'")]


def test_a_training_runs_steps_are_re_estimated_at_their_own_shape(tmp_path):
    """A callback's points carry their padded length and micro-batches per step; a step whose micro-batches had
    different lengths is compared for memory only, and says why."""
    import json

    from ftscope.measure.store import Store

    tiny = json.loads((DATA.parents[1] / "examples" / "tiny-mixtral" / "config.json").read_text())
    scenario = {"model": "tiny", "mix": {"method": "full", "precision": "fp32", "experts_backend": "eager"},
                "workload": {"micro_batch_size": 4, "seq_len": 512, "padding": "max_length", "gradient_accumulation": 1}}
    mem = {"peak_allocated_bytes": 2**30, "peak_reserved_bytes": 2**31}
    with Store(tmp_path / "runs.sqlite") as st:
        run = st.start_run({"scenario": scenario, "options": {"device": "cuda:0", "source": "trainer"},
                            "build": {"config": tiny}}, {"device": "cuda:0"})
        st.record_point(run, "batch=2/step=2", "ok", {"batch": 2, "seq_len": 48, "micro_batches": 3, "step_s": 0.5,
                                                        "uniform_shape": True, "hooks_in_timed_steps": False, "memory": mem})
        st.record_point(run, "batch=2/step=3", "ok", {"batch": 2, "seq_len": 64, "micro_batches": 3, "step_s": 0.5,
                                                        "uniform_shape": False, "hooks_in_timed_steps": False, "memory": mem})
    checks, skipped = store_checks(tmp_path / "runs.sqlite")
    assert [(c.metric, c.note) for c in checks] == [
        ("peak_gib:allocated", "batch 2 x 48"), ("peak_gib:reserved", "batch 2 x 48"), ("fwd_bwd_opt_s", "batch 2 x 48"),
        ("peak_gib:allocated", "batch 2 x 64"), ("peak_gib:reserved", "batch 2 x 64")]
    assert {c.group for c in checks} == {"trainer-cuda"}
    wl = checks[0].scenario.workload
    assert (wl.micro_batch_size, wl.seq_len, wl.gradient_accumulation) == (2, 48, 3)
    assert checks[3].scenario.workload.seq_len == 64
    assert skipped == [("db:runs.sqlite:run1 batch 2 x 64 fwd_bwd_opt_s",
                        "micro-batches of different padded lengths in one step")]
