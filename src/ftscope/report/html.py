"""One self-contained HTML report: every chart embedded as a data URI, no network needed to view it."""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any, Sequence

from ..errors import FtscopeError
from ..estimate import estimate
from ..validate.cases import load_cases
from ..validate.compare import case_scenario, run_validation, summary, time_metric
from . import charts
from .profile_charts import sections_from_store
from .sections import Section


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    charts.pyplot().close(fig)
    return buf.getvalue()


def plan_sections(plan: dict[str, Any]) -> list[Section]:
    """Charts from `ftscope plan --json` (or recommend --json) output."""
    rows = plan.get("rows") or []
    if not rows:
        raise FtscopeError("plan file has no rows (write it with `ftscope plan ... --json > plan.json`)")
    feasible = [r for r in rows if (r.get("memory") or {}).get("fits")]
    top = feasible[:12]
    return [
        Section("Cost vs time across GPUs", "Every feasible candidate of the plan; the dashed line joins the "
                "candidates no other beats on both hours and dollars.", [("cost_vs_time", charts.cost_vs_time(rows))]),
        Section("Memory per GPU", f"Per-GPU memory by category for the {len(top)} best-ranked candidates, at the "
                "phase where it peaks; dashed marks the GPU's usable memory.", [("memory", charts.memory_breakdown(top))]),
        Section("Step time", "Where one optimizer step's time goes, for the same candidates.",
                [("time", charts.time_breakdown([{"label": " | ".join(r["label"].split(" | ")[1:3]),
                                                   "breakdown_s": r["time"]["breakdown_s"]} for r in top if r.get("time")]))]),
    ]


def _predicted_series(case: Any) -> dict[str, Any]:
    """A published throughput series beside ftscope's curve over the same batch sizes."""
    by_batch = case.measured["samples_per_s_by_batch"]
    pred = {}
    for b in range(1, max(int(b) for b in by_batch) + 1):
        e = estimate(case_scenario(case, [f"workload.micro_batch_size={b}"]), strict=False)
        if e.time:
            pred[b] = e.time.samples_per_s
    scn0 = case_scenario(case, [])
    return {"label": case.id.replace("iiswc-", "").replace(f"-{scn0.model.name.split('-')[0]}", ""),
            "group": f"{scn0.model.name} on {scn0.cluster.gpu.key}", "measured": by_batch,
            "predicted": pred, "unit": "samples/s"}


def _stage_rows(case: Any) -> list[dict[str, Any]]:
    """Measured forward / backward / optimizer stage times and the estimate's, as a profiler would split it."""
    rows = []
    for key, per_batch in (case.measured.get("step_s_by_top_k_and_batch") or {}).items():
        for b, stages in per_batch.items():
            rows.append({"label": f"{key} b{b} measured", "breakdown_s": dict(stages)})
            e = estimate(case_scenario(case, [f"workload.micro_batch_size={b}", f"mix.experts_top_k={key[3:]}"]),
                         strict=False)
            t = e.time.breakdown_s
            rows.append({"label": f"{key} b{b} ftscope", "breakdown_s": {
                **{stage: time_metric(e.time, f"{stage}_s", e.scenario) for stage in ("forward", "backward", "optimizer")},
                "other": t["other"] + t["communication"]}})
    return rows


def case_sections(case_paths: Sequence[str] | None) -> list[Section]:
    """Charts from published cases: throughput curves, stage times, predicted vs measured."""
    cases = load_cases(case_paths)
    series = [_predicted_series(case) for case in cases if case.measured.get("samples_per_s_by_batch")]
    stage_rows = [row for case in cases for row in _stage_rows(case)]
    results = run_validation(cases)
    stats = summary(results)
    text = "; ".join(f"{k}: median {v['median']:.1f} %, max {v['max']:.1f} % (n={v['n']})" for k, v in stats.items())
    out = []
    if series:
        out.append(Section("Throughput vs batch size", "Measured points and ftscope's curve per published series "
                           "(sparse top-2 vs dense top-8 for MoE).", [("throughput", charts.throughput_vs_batch(series))]))
    if stage_rows:
        out.append(Section("Time breakdown", "Forward / backward / optimizer per step, measured (profiler) and predicted.",
                           [("stages", charts.time_breakdown(stage_rows))]))
    out.append(Section("Predicted vs measured", f"Every published number ftscope compares with. Absolute error: {text}.",
                       [("validation", charts.predicted_vs_measured([r.to_dict() for r in results]))]))
    return out


def db_sections(db: str | Path) -> list[Section]:
    """Charts from a profile store: filled in by the profile verb's measurements (see measure/store.py)."""
    from .profile_charts import sections_from_store
    return sections_from_store(Path(db))


def render(sections: Sequence[Section], title: str, out: str | Path, png_dir: str | Path | None = None) -> Path:
    """Write the HTML (and, with png_dir, each chart as a PNG beside it)."""
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "figure{margin:1em 0}img{max-width:100%;border:1px solid #ddd}h2{border-bottom:1px solid #eee}"
             "p.meta{color:#666}</style></head><body>",
             f"<h1>{html.escape(title)}</h1><p class='meta'>Generated by ftscope. Charts are embedded; no network needed.</p>"]
    png_root = Path(png_dir) if png_dir else None
    if png_root:
        png_root.mkdir(parents=True, exist_ok=True)
    for sec in sections:
        parts.append(f"<section><h2>{html.escape(sec.title)}</h2><p>{html.escape(sec.text)}</p>")
        for stem, fig in sec.figures:
            data = _png(fig)
            if png_root:
                (png_root / f"{stem}.png").write_bytes(data)
            b64 = base64.b64encode(data).decode()
            parts.append(f"<figure><img alt='{html.escape(sec.title)}' src='data:image/png;base64,{b64}'>"
                         f"<figcaption>{html.escape(sec.title)}</figcaption></figure>")
        parts.append("</section>")
    parts.append("</body></html>")
    p = Path(out)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("\n".join(parts))
    return p


def write_report(out: str | Path, plan_file: str | Path | None = None, db: str | Path | None = None,
                 cases: Sequence[str] | None = None, published: bool = True,
                 png_dir: str | Path | None = None) -> tuple[Path, int]:
    """The report of a plan JSON (checked by plan_file.load_plan), a profile store and the published cases:
    (the HTML file, charts in it)."""
    from .plan_file import load_plan

    sections = []
    if plan_file is not None:
        sections += plan_sections(load_plan(plan_file))
    if db is not None:
        sections += db_sections(db)
    if published:
        sections += case_sections(cases)
    if not sections:
        raise FtscopeError("nothing to report: give --plan, --db or leave the published cases in")
    return render(sections, "ftscope report", out, png_dir), sum(len(s.figures) for s in sections)
