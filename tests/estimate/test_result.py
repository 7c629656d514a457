"""Estimate's headroom and status: fits / tight / does_not_fit, in the object and its JSON form."""
from __future__ import annotations

import pytest

import ftscope
from ftscope import FtscopeError
from ftscope.estimate import estimate
from ftscope.estimate.result import STATUSES, TIGHT_MARGIN


def scn(**wl):
    return ftscope.load_scenario({"model": "llama-3.2-1b", "hardware": {"gpu": "a100-80gb"},
                                  "workload": {"micro_batch_size": 2, "seq_len": 512, **wl}})


def test_headroom_is_capacity_left_at_the_peak():
    est = estimate(scn())
    d = est.to_dict()["memory"]
    assert d["headroom_gib"] == pytest.approx(d["capacity_gib"] - d["peak_gib"], abs=2e-3)
    assert d["headroom_pct"] == pytest.approx(100 * d["headroom_gib"] / d["capacity_gib"], abs=0.01)
    assert d["status"] == "fits" and d["headroom_pct"] > TIGHT_MARGIN * 100


def test_the_largest_batch_is_tight_and_one_more_does_not_fit():
    solved = estimate(scn(micro_batch_size="max"))
    b = solved.micro_batch_size
    assert solved.fits and 0 <= solved.headroom_fraction < TIGHT_MARGIN
    assert solved.status == "tight" and solved.to_dict()["memory"]["status"] == "tight"
    over = estimate(scn(micro_batch_size=b + 1))
    assert not over.fits and over.status == "does_not_fit" and over.headroom_bytes < 0
    assert over.to_dict()["memory"]["headroom_pct"] < 0


def test_tight_margin_moves_the_line():
    est = estimate(scn())
    frac = est.headroom_fraction
    assert estimate(scn(), tight_margin=frac * 1.01).status == "tight"
    assert estimate(scn(), tight_margin=frac * 0.99).status == "fits"
    assert estimate(scn(), tight_margin=0.0).status == "fits"
    assert est.to_dict()["limits"]["tight_margin"] == TIGHT_MARGIN
    with pytest.raises(FtscopeError, match="tight_margin"):
        estimate(scn(), tight_margin=1.0)


def test_an_unsupported_mix_is_not_called_a_misfit():
    s = ftscope.load_scenario({"model": "llama-3.2-1b", "hardware": {"gpu": "t4"}, "mix": {"attention": "flash"},
                               "workload": {"micro_batch_size": 1, "seq_len": 512}})
    est = estimate(s, strict=False)
    assert est.status == "unsupported" and est.status in STATUSES
