"""Report sections from a profile store: measured time breakdowns, layer types, throughput, expert load, utilization."""
from __future__ import annotations

from pathlib import Path

from . import charts
from .sections import Section


def sections_from_store(db: Path) -> list[Section]:
    from ..measure.store import Store

    out: list[Section] = []
    with Store(str(db)) as store:
        for run in store.runs():
            points = [p for p in store.points(run.id) if p.key.startswith("batch=") and p.status == "ok"]
            if not points:
                continue
            device = run.scenario.get("options", {}).get("device", "?")
            name = f"run {run.id} ({device}, {run.scenario.get('scenario', {}).get('model', '')})"
            ms = [p.measurement for p in sorted(points, key=lambda p: p.measurement["batch"])]
            figs = [("run%d_steps" % run.id, charts.time_breakdown(
                [{"label": f"b{m['batch']}", "breakdown_s": {"forward": m["forward_s"], "backward": m["backward_s"],
                                                              "optimizer": m["optimizer_s"]}} for m in ms],
                f"{name}: measured step time"))]
            if any(m.get("layer_times") for m in ms):
                figs.append(("run%d_layers" % run.id, charts.time_breakdown(
                    [{"label": f"b{m['batch']}", "breakdown_s": m["layer_times"]["total_s"]} for m in ms if m.get("layer_times")],
                    f"{name}: time by layer type")))
            series = {"label": "measured", "group": name, "measured": {m["batch"]: m["samples_per_s"] for m in ms},
                      "unit": "samples/s"}
            if str(device).startswith("cuda"):  # the estimate's time is for a GPU: only comparable on one
                series["predicted"] = {p.measurement["batch"]: p.estimate["time"]["samples_per_s"]
                                       for p in points if p.estimate and p.estimate.get("time")}
            figs.append(("run%d_throughput" % run.id, charts.throughput_vs_batch([series], "throughput vs batch")))
            loads = [m for m in ms if m.get("expert_load")]
            if loads:
                figs.append(("run%d_experts" % run.id, charts.expert_load(loads[-1]["expert_load"]["counts"],
                                                                         f"tokens per expert, batch {loads[-1]['batch']}")))
            util = [m["utilization"] for m in ms if m.get("utilization") and m["utilization"].get("available")]
            figs.append(("run%d_util" % run.id, charts.utilization(
                [{"t": i * 1.0, "sm": u.get("sm_mean", 0), "mem_bw": u.get("mem_bw_mean", 0)} for i, u in enumerate(util)],
                f"{name}: GPU utilization" + ("" if util else " (not available on this device)"))))
            out.append(Section(f"Profile {name}", "Measured by `ftscope profile` and stored point by point.", figs))
    return out
