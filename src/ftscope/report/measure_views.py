"""Terminal views of what was measured: a profile sweep, a distributed profile, a fake-tensor trace (the trace
beside the estimate)."""
from __future__ import annotations

from typing import Any

from rich.table import Table

from ..measure.distributed.results import DistributedResult
from ..measure.runtime.profile import ProfileResult
from .tables import simple_table


def profile_table(result: ProfileResult, title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("batch", "status", "step s", "fwd/bwd/opt s", "tokens/s", "samples/s", "peak MiB",
                "ftscope MiB", "top layer types (s)", "experts max/mean"):
        t.add_column(col, justify="right" if col not in ("status", "top layer types") else "left")
    for p in result.points:
        if p.status != "ok":
            t.add_row(str(p.batch), f"[red]{p.status}[/red]", "-", "-", "-", "-", "-", "-", (p.error or "")[:50], "-")
            continue
        mem = p.memory["peak_reserved_bytes"] or p.memory["peak_allocated_bytes"]
        est = (p.estimate or {}).get("memory", {})
        est_mib = (est.get("peak_gib") if p.memory["peak_reserved_bytes"] else est.get("allocated_gib"))
        layers = ""
        if p.layer_times:
            tot = p.layer_times.get("total_s", {})
            layers = ", ".join(f"{k} {v:.2f}" for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:2])
        imb = "-"
        if p.expert_load:
            imb = f"{p.expert_load['imbalance']['mean_max_over_mean']:.2f}"
        t.add_row(str(p.batch), "ok", f"{p.step_s:.3f}", f"{p.forward_s:.2f}/{p.backward_s:.2f}/{p.optimizer_s:.2f}",
                  f"{p.tokens_per_s:,.0f}", f"{p.samples_per_s:.2f}", f"{mem / 2**20:,.1f}",
                  f"{est_mib * 1024:,.1f}" if est_mib is not None else "-", layers, imb)
    return t


def profile_view(result: ProfileResult, scn: Any, db: Any) -> list[Any]:
    out: list[Any] = [profile_table(result, f"{scn.model.name} | {scn.mix.label()} | {result.device} | run "
                                            f"{result.run_id} in {db}")]
    if result.max_batch is not None:
        mb = result.max_batch
        out.append(f"max batch: {mb['max_batch']} ({len(mb['tries'])} tries, "
                   f"{sum(t['status'] == 'oom' for t in mb['tries'])} OOM recorded)")
    out += [f"{key}: already measured (resume)" for key in result.skipped]
    out += [f"note: {note}" for note in result.build.get("notes", [])]
    return out


def distributed_view(dist: DistributedResult, scn: Any) -> list[Any]:
    rows = dist.memory_rows()
    out: list[Any] = [simple_table(
        f"{scn.model.name} | {dist.engine} | {dist.world_size} ranks ({dist.backend}) | run {dist.run_id}: "
        f"{dist.status}", list(rows[0].keys()) if rows else ["result"],
        [list(r.values()) for r in rows] or [[dist.error or "no points"]])]
    if dist.error:
        out.append(f"[red]failed[/red]: {dist.error}")
    return out


def trace_view(data: dict[str, Any], est: dict[str, Any] | None, scn: Any, notes: list[str]) -> list[Any]:
    """Traced tensor memory by category beside the estimate's, and FLOPs by phase and layer type."""
    mem = data["memory"]
    rows = [[k, f"{v:.3f}", f"{est['memory']['breakdown_gib'].get(k, 0.0):.3f}" if est else "-"]
            for k, v in mem["breakdown_gib"].items()]
    rows.append(["peak (allocated)", f"{mem['allocated_gib']:.3f}", f"{est['memory']['allocated_gib']:.3f}" if est else "-"])
    rows.append(["peak (reserved: allocator model)", f"{mem['peak_gib']:.3f}",
                 f"{est['memory']['peak_gib']:.3f}" if est else "-"])
    batch, seq = data["scenario"]["workload"]["micro_batch_size"], data["scenario"]["workload"]["seq_len"]
    fl = data["flops"]
    return [simple_table(f"{scn.model.name} | {scn.mix.label()} | b{batch} x {seq}: traced tensor memory "
                         f"(GiB, peak at {mem['peak_phase']})", ["category", "trace", "ftscope estimate"], rows),
            simple_table("FLOPs per step", ["phase / layer", "TFLOP"],
                         [[k, f"{fl[k] / 1e12:.3f}"] for k in ("forward", "backward", "recompute", "total") if k in fl]
                         + [[f"  {k}", f"{v / 1e12:.3f}"] for k, v in (fl.get("by_layer") or {}).items()]),
            *[f"note: {note}" for note in notes]]
