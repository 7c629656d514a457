"""Corpus checks (validate/corpus/checks.py): every number compared or listed, coverage and errors per source."""
from __future__ import annotations

import math

import pytest

from ftscope import FtscopeError
from ftscope.validate.corpus import Mapped, Measure
from ftscope.validate.corpus.checks import (TABLE_COLUMNS, corpus_checks, coverage, report, run_corpus, table_rows,
                                            totals)


@pytest.fixture(scope="module")
def run():
    return run_corpus()


def test_every_number_is_compared_or_listed(run):
    mapped, results, listed = run
    compared_or_listed = {(r.case_id, r.metric) for r in results} | {(x.id, x.what) for x in listed}
    for m in mapped:
        if m.why_not() is not None:
            assert (m.id, "point") in compared_or_listed, m.id
            continue
        for meas in m.measures:
            assert (m.id, meas.metric) in compared_or_listed, (m.id, meas.metric)


def test_coverage_adds_up(run):
    mapped, results, listed = run
    cov = coverage(mapped, results)
    t = totals(cov)
    assert t["points"] == 420 == t["compared"] + t["listed"]
    assert t["throughput_compared"] <= t["throughput_points"]
    assert {x.id for x in listed if x.what == "point"} == {m.id for m in mapped if m.id not in {r.case_id for r in results}}


def test_predictions_are_physical(run):
    _, results, _ = run
    assert results
    for r in results:
        assert math.isfinite(r.predicted) and r.predicted >= 0, (r.case_id, r.metric)
        if r.metric == "mfu":
            assert r.predicted <= 1.0, r.case_id
        if r.metric == "oom":
            assert r.predicted in (0.0, 1.0)


def test_modelled_features_turn_listed_points_into_checks(scenario_dict):
    m = Mapped("p", "src", "fw", scenario_dict, (Measure("tokens_per_s_per_gpu", 100.0),), needs=("fp8",))
    checks, listed = corpus_checks([m])
    assert checks == [] and [(x.id, x.what) for x in listed] == [("p", "point")]
    checks, listed = corpus_checks([m], frozenset({"fp8"}))
    assert [(c.case_id, c.group, c.metric, c.measured) for c in checks] == [("p", "src", "tokens_per_s_per_gpu", 100.0)]
    bad = Mapped("q", "src", "fw", {**scenario_dict, "hardware": {"gpu": "no-such-gpu"}},
                 (Measure("tokens_per_s_per_gpu", 1.0),))
    assert corpus_checks([bad])[1][0].reason.startswith("scenario rejected: unknown GPU")


def test_report_and_table(run):
    rep = report(*run)
    assert set(rep) == {"coverage", "totals", "errors", "results", "listed"}
    assert all(r["framework"] for r in rep["results"])
    rows = table_rows(rep)
    assert len(rows) == len(rep["coverage"]) + 1 and all(len(r) == len(TABLE_COLUMNS) for r in rows)


def test_one_source_and_unknown_sources():
    mapped, results, _ = run_corpus("xtuner-speed-benchmark")
    assert {m.source for m in mapped} == {"xtuner-speed-benchmark"} and len(mapped) == 14
    with pytest.raises(FtscopeError, match="unknown corpus source 'xtuner'"):
        run_corpus("xtuner")
