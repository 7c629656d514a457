"""Charts: each figure function draws from JSON-shaped data and writes PNG/SVG."""
from __future__ import annotations

import pytest

import ftscope
from ftscope.errors import FtscopeError
from ftscope.report import charts


def _plan_rows():
    scn = ftscope.load_scenario("examples/iiswc-mixtral-qlora.yaml")
    return ftscope.plan(scn, gpus=["a40", "a100-80gb", "h100-80gb", "l4"], counts=[1, 2]).to_dict()["rows"]


def test_every_chart_writes_png_and_svg(tmp_path):
    rows = _plan_rows()
    figs = {
        "cost": charts.cost_vs_time(rows),
        "mem": charts.memory_breakdown([r for r in rows if r["memory"]["fits"]]),
        "time": charts.time_breakdown([{"label": r["label"], "breakdown_s": r["time"]["breakdown_s"]} for r in rows if r["time"]]),
        "tput": charts.throughput_vs_batch([{"label": "x", "group": "g", "measured": {1: 1.0, 2: 1.8}, "predicted": {1: 1.1, 2: 1.7}}]),
        "load": charts.expert_load([[10, 20, 30, 40], [25, 25, 25, 25]], after=[[40, 30, 20, 10], [25, 25, 25, 25]]),
        "util": charts.utilization([{"t": 0.0, "sm": 50, "mem_bw": 40}, {"t": 0.1, "sm": 80, "mem_bw": 60}]),
        "util_empty": charts.utilization([]),
        "scatter": charts.predicted_vs_measured([{"metric": "step_s", "measured": 1.0, "predicted": 1.1},
                                                {"metric": "peak_gib:smi", "measured": 30.0, "predicted": 27.0}]),
    }
    for name, fig in figs.items():
        ext = ".svg" if name == "scatter" else ".png"
        path = charts.save(fig, tmp_path / f"{name}{ext}")
        assert path.stat().st_size > 2000, name


def test_save_refuses_unknown_extensions(tmp_path):
    with pytest.raises(FtscopeError, match="png or .svg"):
        charts.save(charts.utilization([]), tmp_path / "x.jpg")


def test_cost_chart_joins_only_pareto_rows():
    rows = _plan_rows()
    fig = charts.cost_vs_time(rows)
    ax = fig.axes[0]
    dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert len(dashed) == 1
    assert len(dashed[0].get_xdata()) == sum(1 for r in rows if r.get("pareto"))
