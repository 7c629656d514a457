"""Report sections from a profile store: measured time breakdowns, layer types, throughput, expert load, utilization."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..measure.runtime.loop import ProfilePoint, batch_points
from ..measure.store import Run, Store
from . import charts
from .sections import Section


def _run_figures(run: Run, name: str, points: list[ProfilePoint]) -> list[tuple[str, Any]]:
    figs = [("run%d_steps" % run.id, charts.time_breakdown(
        [{"label": f"b{p.batch}", "breakdown_s": {"forward": p.forward_s, "backward": p.backward_s,
                                                   "optimizer": p.optimizer_s}} for p in points],
        f"{name}: measured step time"))]
    if any(p.layer_times for p in points):
        figs.append(("run%d_layers" % run.id, charts.time_breakdown(
            [{"label": f"b{p.batch}", "breakdown_s": p.layer_times["total_s"]} for p in points if p.layer_times],
            f"{name}: time by layer type")))
    series: dict[str, Any] = {"label": "measured", "group": name,
                              "measured": {p.batch: p.samples_per_s for p in points}, "unit": "samples/s"}
    if str(run.scenario.get("options", {}).get("device", "?")).startswith("cuda"):
        # the estimate's time is for a GPU: only comparable on one
        series["predicted"] = {p.batch: p.estimate["time"]["samples_per_s"]
                               for p in points if p.estimate and p.estimate.get("time")}
    figs.append(("run%d_throughput" % run.id, charts.throughput_vs_batch([series], "throughput vs batch")))
    loads = [p for p in points if p.expert_load]
    if loads:
        figs.append(("run%d_experts" % run.id, charts.expert_load(loads[-1].expert_load["counts"],
                                                                 f"tokens per expert, batch {loads[-1].batch}")))
    util = [p.utilization for p in points if p.utilization and p.utilization.get("available")]
    figs.append(("run%d_util" % run.id, charts.utilization(
        [{"t": i * 1.0, "sm": u.get("sm_mean", 0), "mem_bw": u.get("mem_bw_mean", 0)} for i, u in enumerate(util)],
        f"{name}: GPU utilization" + ("" if util else " (not available on this device)"))))
    return figs


def sections_from_store(db: Path) -> list[Section]:
    out: list[Section] = []
    with Store(str(db)) as store:
        for run in store.runs():
            points = sorted((p for p in batch_points(store, run.id) if p.status == "ok"), key=lambda p: p.batch)
            if not points:
                continue
            device = run.scenario.get("options", {}).get("device", "?")
            name = f"run {run.id} ({device}, {run.scenario.get('scenario', {}).get('model', '')})"
            out.append(Section(f"Profile {name}", "Measured by `ftscope profile` and stored point by point.",
                               _run_figures(run, name, points)))
    return out
