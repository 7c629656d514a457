"""What `validate` and `calibrate` compute, as data (validate/reports.py)."""
from __future__ import annotations

import pytest

from ftscope import FtscopeError
from ftscope.validate.compare import summary
from ftscope.validate.reports import calibration_report, validation


def test_validation_compares_every_bundled_check_and_lists_what_it_left_out():
    v = validation()
    assert len(v.results) > 20 and not v.extra
    d = v.to_dict()
    assert d["summary"] == summary(v.results) and len(d["results"]) == len(v.results)
    assert all(set(s) == {"measurement", "why"} for s in d["skipped"])


def test_calibration_report_refuses_an_unknown_baseline_before_fitting():
    with pytest.raises(FtscopeError, match="unknown baseline 'x'"):
        calibration_report(baseline="x")
