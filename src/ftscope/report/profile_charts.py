"""Report sections from a profile store: measured time breakdowns, layer types, throughput, expert load, utilization."""
from __future__ import annotations

from pathlib import Path

from . import charts
from .sections import Section


def sections_from_store(db: Path) -> list[Section]:
    """One section per run with ok batch points; rows that cannot be read are left out and named in the text."""
    from ..errors import FtscopeError
    from ..measure.store import Store
    from ..measure.store_rows import Options, StoredPoint, point_of, run_of

    out: list[Section] = []
    with Store(db, readonly=True) as store:
        for run in store.runs():
            left_out: list[str] = []
            try:
                options, model = run_of(run).options, run.scenario.get("scenario", {}).get("model", "")
            except FtscopeError as exc:
                options, model = Options(device="?"), ""
                left_out.append(str(exc))
            points: list[tuple[StoredPoint, dict | None]] = []
            for p in store.points(run.id):
                if p.key.startswith("batch=") and p.status == "ok":
                    try:
                        points.append((point_of(p), p.estimate))
                    except FtscopeError as exc:
                        left_out.append(str(exc))
            if points:
                out.append(_run_section(run.id, str(options.device), str(model), points, left_out))
    return out


def _run_section(run_id: int, device: str, model: str, points: list, left_out: list[str]) -> Section:
    name = f"run {run_id} ({device}, {model})"
    points = sorted(points, key=lambda pe: pe[0].batch)
    ms = [m for m, _ in points]
    figs = [("run%d_steps" % run_id, charts.time_breakdown(
        [{"label": f"b{m.batch}", "breakdown_s": {"forward": m.forward_s or 0.0, "backward": m.backward_s or 0.0,
                                                  "optimizer": m.optimizer_s or 0.0}} for m in ms],
        f"{name}: measured step time"))]
    if any(m.layer_times for m in ms):
        figs.append(("run%d_layers" % run_id, charts.time_breakdown(
            [{"label": f"b{m.batch}", "breakdown_s": m.layer_times.total_s} for m in ms if m.layer_times],
            f"{name}: time by layer type")))
    series = {"label": "measured", "group": name, "unit": "samples/s",
              "measured": {m.batch: m.samples_per_s for m in ms if m.samples_per_s is not None}}
    if device.startswith("cuda"):  # the estimate's time is for a GPU: only comparable on one
        series["predicted"] = {m.batch: e["time"]["samples_per_s"] for m, e in points
                               if isinstance(e, dict) and isinstance(e.get("time"), dict)
                               and isinstance(e["time"].get("samples_per_s"), (int, float))}
    figs.append(("run%d_throughput" % run_id, charts.throughput_vs_batch([series], "throughput vs batch")))
    loads = [m for m in ms if m.expert_load and m.expert_load.counts]
    if loads:
        figs.append(("run%d_experts" % run_id, charts.expert_load(loads[-1].expert_load.counts,
                                                                  f"tokens per expert, batch {loads[-1].batch}")))
    util = [m.utilization for m in ms if m.utilization and m.utilization.available]
    figs.append(("run%d_util" % run_id, charts.utilization(
        [{"t": i * 1.0, "sm": u.sm_mean or 0, "mem_bw": u.mem_bw_mean or 0} for i, u in enumerate(util)],
        f"{name}: GPU utilization" + ("" if util else " (not available on this device)"))))
    text = "Measured by `ftscope profile` and stored point by point."
    if left_out:
        text += f" Left out ({len(left_out)} unreadable): " + "; ".join(left_out[:5])
    return Section(f"Profile {name}", text, figs)
