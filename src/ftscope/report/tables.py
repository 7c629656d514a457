"""Rich tables for the terminal views of estimate, plan and recommend, and the plain table every view uses."""
from __future__ import annotations

from typing import Any, Sequence

from rich.table import Table

from ..estimate.result import Estimate


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
    mem_t = Table(title="memory per GPU at the peak phase (GiB)", title_justify="left")
    for k in mem["breakdown_gib"]:
        mem_t.add_column(k, justify="right")
    mem_t.add_column("peak", justify="right", style="bold")
    mem_t.add_row(*[f"{v:.2f}" for v in mem["breakdown_gib"].values()], f"{mem['peak_gib']:.2f}")
    tables: list[Any] = [head, mem_t]
    if not est.fits:  # said before any hours or dollars, so nobody rents GPUs on the strength of a cost line
        words = (est.reason or "").removeprefix("does not fit").lstrip(": ")
        verdict = "does not fit" if est.status == "does_not_fit" else "cannot run"
        tables.insert(0, f"[red]{verdict}[/red]: {words}" + (
            "; the step time and cost below are for a run that cannot start" if d["run"] else ""))
    if d["time"]:
        tt = Table(title="step time breakdown (s)", title_justify="left")
        for k in d["time"]["breakdown_s"]:
            tt.add_column(k, justify="right")
        tt.add_row(*[f"{v:.3f}" for v in d["time"]["breakdown_s"].values()])
        tables.append(tt)
    return tables


def short_reason(est: Estimate) -> str:
    """A few words for a table cell: 'needs 27.3 GiB' or the first clause of the reason."""
    if est.reason and est.reason.startswith("does not fit"):
        return f"needs {est.memory.peak_bytes / 2**30:.1f} GiB at b{est.micro_batch_size}"
    return (est.reason or "no fit").split(";")[0].split(" (")[0]


def plan_table(rows: Sequence[Estimate], pareto: set[int] | None = None, title: str = "") -> Table:
    t = Table(title=title, title_justify="left")
    for col, just in (("#", "right"), ("GPU", "left"), ("GPUs", "right"), ("mem GiB", "right"), ("max batch", "right"),
                      ("peak GiB", "right"), ("samples/s", "right"), ("tokens/s", "right"), ("$/GPU-h", "right"),
                      ("hours", "right"), ("$", "right"), ("", "left")):
        t.add_column(col, justify=just)
    for i, est in enumerate(rows, 1):
        cl = est.scenario.cluster
        mark = ("*" if pareto and (i - 1) in pareto else "") + (" tight" if est.status == "tight" else "")
        if not est.fits or est.time is None or est.run is None:
            t.add_row(str(i), cl.gpu.key, str(cl.world_size), f"{cl.gpu.memory_gib:.0f}", str(est.max_micro_batch_size),
                      "-", "-", "-", "-", "-", "-", f"[red]{short_reason(est)}[/red]")
            continue
        r = est.run
        t.add_row(str(i), cl.gpu.key, str(cl.world_size), f"{cl.gpu.memory_gib:.0f}", str(est.micro_batch_size),
                  f"{est.memory.peak_bytes / 2**30:.1f}", f"{est.time.samples_per_s:.2f}", f"{est.time.tokens_per_s:,.0f}",
                  _fmt_usd(r.usd_per_gpu_hour), _fmt_hours(r.hours), _fmt_usd(r.usd), mark)
    return t


def simple_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*[str(x) for x in r])
    return t


def recommend_table(rows, title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col, just in (("#", "right"), ("GPUs", "left"), ("mix", "left"), ("batch x GA", "right"), ("peak GiB", "right"),
                      ("tokens/s", "right"), ("hours", "right"), ("$", "right")):
        t.add_column(col, justify=just)
    for i, c in enumerate(rows, 1):
        s = c.scenario
        if not c.feasible:
            t.add_row(str(i), f"{s.cluster.world_size}x {s.cluster.gpu.key}", s.mix.label(), "-", "-", "-", "-",
                      f"[red]{(c.reason or '')[:60]}[/red]")
            continue
        e = c.estimate
        t.add_row(str(i), f"{s.cluster.world_size}x {s.cluster.gpu.key}", s.mix.label(),
                  f"{e.micro_batch_size} x {s.workload.gradient_accumulation}", f"{e.memory.peak_bytes / 2**30:.1f}",
                  f"{e.time.tokens_per_s:,.0f}", _fmt_hours(e.run.hours), _fmt_usd(e.run.usd))
    return t


def plan_view(result: Any, scn: Any, all_rows: bool, by: str) -> list[Any]:
    """The plan table (one row per GPU, or every count) and the best candidate in words."""
    from ..plan.search import one_row_per_gpu

    rows = result.rows if all_rows else one_row_per_gpu(result)
    pareto = {i for i, e in enumerate(rows) if result.rows.index(e) in set(result.pareto)}
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


