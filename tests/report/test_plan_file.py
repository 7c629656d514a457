"""plan_file.py: a `report --plan` file is checked row by row before any chart is drawn."""
from __future__ import annotations

import json

import pytest

from ftscope import FtscopeError
from ftscope.report.plan_file import load_plan

ROW = {"label": "m | 1x a100-80gb | lora", "memory": {"fits": True, "breakdown_gib": {"weights": 1.0}},
       "scenario": {"hardware": {"gpu": "a100-80gb", "gpus_per_node": 1}}, "run": {"hours": 1.0, "usd": 2.0},
       "time": {"breakdown_s": {"forward": 0.1}}, "anything": "else is kept"}


def write(tmp_path, data, text=None):
    path = tmp_path / "plan.json"
    path.write_text(text if text is not None else json.dumps(data))
    return path


def test_plan_output_loads_as_written(tmp_path):
    assert load_plan(write(tmp_path, {"rows": [ROW], "best": None}))["rows"] == [ROW]


@pytest.mark.parametrize("data, match", [
    ([ROW], "is not plan output"), ({"rows": 7}, "is not plan output"),
    ({"rows": [7]}, r"rows\[0\] must be a mapping"),
    ({"rows": [{**ROW, "memory": {"fits": "yes"}}]}, r"rows\[0\].memory.fits must be true or false"),
    ({"rows": [{**ROW, "run": {"hours": -1}}]}, r"rows\[0\].run.hours must be a finite number above 0"),
    ({"rows": [{**ROW, "memory": {"fits": True, "breakdown_gib": {"weights": -4}}}]}, r"breakdown_gib.weights must be"),
])
def test_a_row_of_the_wrong_shape_is_named(tmp_path, data, match):
    with pytest.raises(FtscopeError, match=match):
        load_plan(write(tmp_path, data))


def test_nan_in_a_plan_file_is_refused(tmp_path):
    with pytest.raises(FtscopeError, match="NaN is not a number JSON allows"):
        load_plan(write(tmp_path, None, '{"rows": [{"memory": {"peak_gib": NaN}}]}'))
