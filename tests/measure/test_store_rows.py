"""store_rows.py: a stored point or run is read as typed values, or refused with the reason."""
from __future__ import annotations

import pytest

from ftscope import FtscopeError
from ftscope.measure.store import Point, Run
from ftscope.measure.store_rows import point_of, run_of


def point(measurement):
    return Point(run_id=3, key="batch=1", status="ok", measurement=measurement, estimate=None, created="")


def test_a_profile_point_reads_as_typed_values():
    m = point_of(point({"batch": 2, "memory": {"peak_allocated_bytes": 5e8, "peak_reserved_bytes": 6e8},
                        "forward_s": 0.1, "layer_times": {"total_s": {"attention": 0.01}}, "extra": "kept out"}))
    assert m.batch == 2 and m.memory.peak_reserved_bytes == 6e8 and m.layer_times.total_s == {"attention": 0.01}


@pytest.mark.parametrize("measurement, match", [
    ({"batch": "one"}, "batch must be an integer"), ({}, "needs batch"),
    ({"batch": 1, "memory": {"peak_allocated_bytes": -5}}, "peak_allocated_bytes must be a finite number above 0"),
    ({"batch": 1, "forward_s": float("nan")}, "forward_s must be a finite number"),
    ({"batch": 1, "expert_load": {"counts": [["x"]]}}, r"counts\[0\]\[0\] must be"),
])
def test_a_damaged_point_is_refused_with_the_reason(measurement, match):
    with pytest.raises(FtscopeError, match=rf"^run 3 point batch=1: .*{match}"):
        point_of(point(measurement))


def test_a_run_reads_its_scenario_build_and_options():
    run = Run(id=1, created="", updated="", sweep_id=None, scenario={"scenario": {"model": "m"}, "build": {"config": {}},
                                                                      "options": {"device": "cuda:0"}},
              environment={}, status="done", error=None, resumes=0)
    assert run_of(run).options.device == "cuda:0"
    with pytest.raises(FtscopeError, match="run 1: scenario must be a mapping"):
        run_of(Run(**{**run.to_dict(), "scenario": {"scenario": "x"}}))


def test_a_training_runs_step_reads_its_own_shape():
    m = point_of(point({"batch": 2, "seq_len": 48, "micro_batches": 3, "uniform_shape": False,
                        "hooks_in_timed_steps": False}))
    assert (m.seq_len, m.micro_batches, m.uniform_shape, m.hooks_in_timed_steps) == (48, 3, False, False)
    assert point_of(point({"batch": 1})).seq_len is None
    with pytest.raises(FtscopeError, match="seq_len must be"):
        point_of(point({"batch": 1, "seq_len": 0}))
