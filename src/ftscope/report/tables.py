"""Rich tables for the terminal views of estimate, plan and recommend, and the plain table every view uses."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from rich.table import Table

from ..estimate.result import Estimate
from .columns import Breakdown, Col, FitTable, plain_columns


def _fmt_usd(v: float | None) -> str:
    return "-" if v is None else (f"${v:,.2f}" if v < 1000 else f"${v:,.0f}")


def _fmt_hours(h: float) -> str:
    return f"{h * 60:.1f} min" if h < 1 else f"{h:,.1f} h"


def headroom_text(est: Estimate) -> str:
    """'43.06 GiB (54.2 %) free at the peak' / 'tight: ...' / 'short by 3.10 GiB (-3.9 %)'."""
    gib, pct, limit = est.headroom_bytes / 2**30, est.headroom_fraction * 100, est.tight_margin * 100
    if est.headroom_bytes < 0:
        return f"[red]short by {-gib:.2f} GiB ({pct:+.1f} %)[/red]"
    text = f"{gib:.2f} GiB ({pct:.1f} %) free at the peak"
    if est.status == "tight":
        return (f"[yellow]tight[/yellow]: {text}, under the {limit:g} % margin (the estimate's error or the "
                "allocator can use it up)")
    return text


def estimate_tables(est: Estimate) -> list[Any]:
    d = est.to_dict()
    scn = est.scenario
    mem = d["memory"]
    head = Table(title=d["label"], show_header=False, title_justify="left")
    head.add_column("what", style="bold")
    head.add_column("value")
    status = {"fits": "[green]fits[/green]", "tight": "[yellow]tight[/yellow]",
              "does_not_fit": "[red]does not fit[/red]"}.get(est.status, f"[red]does not run[/red]: {est.reason}")
    head.add_row("peak memory / GPU", f"{mem['peak_gib']:.2f} GiB reserved ({mem['device_gib']:.2f} GiB in nvidia-smi) "
                 f"of {mem['capacity_gib']:.2f} GiB usable, at {mem['peak_phase']}: {status}")
    head.add_row("headroom", headroom_text(est))
    head.add_row("params", f"{d['model']['total_params']:,} total, {d['model']['active_params']:,} active/token, "
                 f"{d['model']['trainable_params']:,} trainable")
    head.add_row("batch shape", f"micro-batch {est.micro_batch_size} x seq {est.seq_len} (peak), "
                 f"grad accumulation {scn.workload.gradient_accumulation}, {scn.cluster.world_size} GPU(s)")
    head.add_row("limits", f"max micro-batch {d['limits']['max_micro_batch_size']} at seq {est.seq_len}; "
                 f"max seq {d['limits']['max_seq_len']:,} at micro-batch {est.micro_batch_size}")
    if mem["cpu_offload_gib"]:
        head.add_row("CPU RAM (offload)", f"{mem['cpu_offload_gib']:.1f} GiB")
    if d["time"]:
        t = d["time"]
        head.add_row("step", f"{t['step_s']:.3f} s, {t['tokens_per_s']:,.0f} tokens/s, {t['samples_per_s']:.3f} samples/s, "
                     f"MFU {t['mfu'] * 100:.0f}%" + ("" if t["calibrated"] else " (GPU not calibrated: shared efficiencies)"))
    if d["run"]:
        r = d["run"]
        head.add_row("run", f"{r['steps']:,} steps, {_fmt_hours(r['hours'])}, {r['gpu_hours']:,.1f} GPU-h, "
                     f"{_fmt_usd(r['usd'])} at {_fmt_usd(r['usd_per_gpu_hour'])}/GPU-h ({r['price_source']})")
    for w in d["warnings"]:
        head.add_row("[yellow]warning[/yellow]", w)
    mem_t = Breakdown("memory per GPU at the peak phase (GiB)",
                      {**{k: f"{v:.2f}" for k, v in mem["breakdown_gib"].items()}, "peak": f"[bold]{mem['peak_gib']:.2f}[/bold]"},
                      ("category", "GiB"))
    tables: list[Any] = [head, mem_t]
    if not est.fits:  # said before any hours or dollars, so nobody rents GPUs on the strength of a cost line
        words = (est.reason or "").removeprefix("does not fit").lstrip(": ")
        verdict = "does not fit" if est.status == "does_not_fit" else "cannot run"
        tables.insert(0, f"[red]{verdict}[/red]: {words}" + (
            "; the step time and cost below are for a run that cannot start" if d["run"] else ""))
    if d["time"]:
        tables.append(Breakdown("step time breakdown (s)", {k: f"{v:.3f}" for k, v in d["time"]["breakdown_s"].items()},
                                ("part", "s")))
    return tables


def short_reason(est: Estimate) -> str:
    """A few words for a table cell: 'needs 27.3 GiB' or the first clause of the reason."""
    if est.reason and est.reason.startswith("does not fit"):
        return f"needs {est.memory.peak_bytes / 2**30:.1f} GiB at b{est.micro_batch_size}"
    return (est.reason or "no fit").split(";")[0].split(" (")[0]


def plan_rows(rows: Sequence[Estimate], pareto: set[int] | None = None) -> list[dict[str, Any]]:
    """One flat row per candidate: the numbers of the plan table as the JSON has them (what --csv writes)."""
    out = []
    for i, est in enumerate(rows, 1):
        cl = est.scenario.cluster
        d = est.to_dict()
        ok = est.fits and d["time"] is not None and d["run"] is not None
        t, r = (d["time"], d["run"]) if ok else ({}, {})
        out.append({"rank": i, "gpu": cl.gpu.key, "gpus": cl.world_size, "gpu_memory_gib": round(cl.gpu.memory_gib, 1),
                    "micro_batch": est.micro_batch_size if ok else None,
                    "max_micro_batch": est.max_micro_batch_size,
                    "peak_gib": d["memory"]["peak_gib"] if ok else None, "samples_per_s": t.get("samples_per_s"),
                    "tokens_per_s": t.get("tokens_per_s"), "usd_per_gpu_hour": r.get("usd_per_gpu_hour"),
                    "hours": r.get("hours"), "usd": r.get("usd"), "pareto": bool(pareto and (i - 1) in pareto),
                    "tight": est.status == "tight",
                    "fits": ok, "reason": None if ok else short_reason(est)})
    return out


def _num(key: str, fmt: str) -> Callable[[Mapping[str, Any]], str]:
    return lambda row: "-" if row.get(key) is None else format(row[key], fmt)


def _plan_note(row: Mapping[str, Any]) -> str:
    if row["reason"]:
        return f"[red]{row['reason']}[/red]"
    return " ".join(x for x in ("*" if row["pareto"] else "", "tight" if row.get("tight") else "") if x)


def _hours(row: Mapping[str, Any]) -> str:
    return "-" if row["hours"] is None else _fmt_hours(row["hours"])


PLAN_COLUMNS = (
    Col("#", "rank"), Col("GPU", "gpu", justify="left"), Col("GPUs", "gpus"),
    Col("mem GiB", cell=_num("gpu_memory_gib", ".0f"), priority=4),
    Col("max batch", cell=lambda r: str(r["micro_batch"] if r["fits"] else r["max_micro_batch"]), priority=1),
    Col("peak GiB", cell=_num("peak_gib", ".1f"), priority=2),
    Col("samples/s", cell=_num("samples_per_s", ".2f"), priority=5),
    Col("tokens/s", cell=_num("tokens_per_s", ",.0f"), short="tok/s", priority=1),
    Col("$/GPU-h", cell=lambda r: _fmt_usd(r["usd_per_gpu_hour"]), priority=3),
    Col("hours", cell=_hours), Col("$", cell=lambda r: _fmt_usd(r["usd"])),
    Col("note", cell=_plan_note, justify="left", wrap=True, optional=True),
)
"""The plan table; on a narrow terminal samples/s goes first, then the GPU's memory, its price, the peak."""


def plan_table(rows: Sequence[Estimate], pareto: set[int] | None = None, title: str = "") -> FitTable:
    return FitTable(title, PLAN_COLUMNS, plan_rows(rows, pareto))


def simple_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> FitTable:
    return FitTable(title, plain_columns(columns), [{str(i): x for i, x in enumerate(r)} for r in rows])


def recommend_rows(rows: Sequence[Any]) -> list[dict[str, Any]]:
    """One flat row per candidate of the recommend table (what --csv writes)."""
    out = []
    for i, c in enumerate(rows, 1):
        s, d = c.scenario, c.to_dict()
        ok = c.feasible
        out.append({"rank": i, "gpus": s.cluster.world_size, "gpu": s.cluster.gpu.key, "mix": s.mix.label(),
                    "micro_batch": c.estimate.micro_batch_size if ok else None,
                    "gradient_accumulation": s.workload.gradient_accumulation,
                    "peak_gib": d["memory"]["peak_gib"] if ok else None,
                    "tokens_per_s": d["time"]["tokens_per_s"] if ok else None,
                    "hours": d["run"]["hours"] if ok else None, "usd": d["run"]["usd"] if ok else None,
                    "feasible": ok, "reason": None if ok else c.reason})
    return out


RECOMMEND_COLUMNS = (
    Col("#", "rank"), Col("GPUs", cell=lambda r: f"{r['gpus']}x {r['gpu']}", justify="left"),
    Col("mix", "mix", justify="left", wrap=True),
    Col("batch x GA", cell=lambda r: "-" if r["micro_batch"] is None
        else f"{r['micro_batch']} x {r['gradient_accumulation']}", priority=2),
    Col("peak GiB", cell=_num("peak_gib", ".1f"), priority=1),
    Col("tokens/s", cell=_num("tokens_per_s", ",.0f"), short="tok/s", priority=3),
    Col("hours", cell=_hours), Col("$", cell=lambda r: _fmt_usd(r["usd"])),
    Col("why not", cell=lambda r: f"[red]{r['reason']}[/red]" if r["reason"] else "", justify="left", wrap=True,
        optional=True),
)
"""The recommend table; on a narrow terminal tokens/s goes first, then batch x GA, then the peak."""


def recommend_table(rows: Sequence[Any], title: str) -> FitTable:
    return FitTable(title, RECOMMEND_COLUMNS, recommend_rows(rows))


def _plan_selection(result: Any, all_rows: bool) -> tuple[list[Estimate], set[int]]:
    """The rows the plan shows (every GPU x count, or the best count per GPU) and which of them are Pareto."""
    from ..plan.search import one_row_per_gpu

    rows = result.rows if all_rows else one_row_per_gpu(result)
    frontier = set(result.pareto)
    return rows, {i for i, e in enumerate(rows) if result.rows.index(e) in frontier}


def plan_csv_rows(result: Any, all_rows: bool) -> list[dict[str, Any]]:
    """`plan --csv`: the rows the table shows, with their raw numbers."""
    return plan_rows(*_plan_selection(result, all_rows))


def plan_view(result: Any, scn: Any, all_rows: bool, by: str) -> list[Any]:
    """The plan table (one row per GPU, or every count) and the best candidate in words."""
    rows, pareto = _plan_selection(result, all_rows)
    title = (f"{scn.model.name} | {scn.mix.label()} | {scn.workload.samples_per_epoch():,} samples x "
             f"{scn.workload.epochs:g} epochs | ranked by {by}"
             + ("" if all_rows else " (best count per GPU; --all for every count)"))
    out: list[Any] = [plan_table(rows, pareto, title)]
    tight = sum(1 for e in rows if e.status == "tight")
    if tight:
        out.append(f"[yellow]tight[/yellow]: {tight} row(s) fit only inside the {rows[0].tight_margin:.0%} memory margin "
                   "(ranked after the others; --margin 0 ranks them together)")
    for gpu, found in result.fixes.items():
        out.append(f"{gpu} does not fit; " + ("fits with one change: " + "; ".join(f.text() for f in found)
                                            if found else "no single change (checkpointing, ZeRO-3, QLoRA, more GPUs) fits"))
    if result.best is not None:
        b = result.best
        out.append(f"best: {b.scenario.cluster.world_size}x {b.scenario.cluster.gpu.key}, micro-batch "
                   f"{b.micro_batch_size}: {b.run.hours:,.1f} h, ${b.run.usd:,.2f} ({b.run.price_source}). "
                   "* = cost/time Pareto frontier.")
    else:
        out.append("[red]no candidate fits[/red]: try more GPUs (--counts), QLoRA, checkpointing or ZeRO-3.")
    return out


_REASON_WORDS = {"does not fit": "do not fit", "over deadline": "over the deadline"}


def recommend_view(result: Any, scn: Any, top: int, written: Sequence[Any]) -> list[Any]:
    """The top candidates with the search's exact counts per reason, then why the winner won (or why nothing
    fits, or how far a time budget got), and the files written."""
    s = result.summary
    out: list[Any] = [recommend_table(result.rows[:top], f"{scn.model.name}: {s.feasible:,} of {s.candidates:,} "
                                                        f"configurations run; top {min(top, s.feasible)} by {result.by}")]
    rejected = ", ".join(f"{n:,} {_REASON_WORDS.get(reason, reason)}" for reason, n in s.reasons.items() if n)
    if rejected:
        out.append(f"cannot run: {rejected}")
    if not s.complete:
        out.append(f"[yellow]time budget reached[/yellow] after {s.seconds:.1f} s: {s.covered:.1%} of the "
                   f"configurations settled ({s.unsearched:,} not classified); the best found so far")
    if result.best is None:
        if s.complete:
            out.append("[red]nothing fits[/red]: the first rejected candidates and why:")
            out += [f"  {c.to_dict()['label']}: {c.reason}" for c in [c for c in result.rows if not c.feasible][:5]]
        return out
    return out + list(result.explanation) + [f"wrote {p}" for p in written]


