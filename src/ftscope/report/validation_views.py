"""Terminal views of `ftscope validate` (predicted vs measured) and `ftscope calibrate` (the fit, its
cross-validation, the IISWC baseline): lists of rich tables and lines to print."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..estimate.efficiency import Calibration
from ..validate.compare import CheckResult, summary
from ..validate.reports import Validation
from .columns import Col, FitTable
from .tables import simple_table


VALIDATION_COLUMNS = (
    Col("case", "case", justify="left", wrap=True), Col("metric", "metric", justify="left", wrap=True),
    Col("predicted", cell=lambda r: CheckResult.fmt(r["predicted"]), short="pred."),
    Col("measured", cell=lambda r: CheckResult.fmt(r["measured"]), short="meas."),
    Col("error", cell=lambda r: f"{r['error_pct']:+.1f}%"),
    Col("compared as", "note", justify="left", wrap=True, priority=1),
)
"""`ftscope validate`: one row per case and metric (the rows of --csv)."""


def validation_view(v: Validation) -> list[Any]:
    results = v.results
    title = (f"predicted vs measured ({len(v.cases)} published cases"
             + (f", {len(v.extra)} profile points" if v.extra else "") + ")")
    out: list[Any] = [
        FitTable(title, VALIDATION_COLUMNS, [r.to_dict() for r in results]),
        simple_table("absolute % error by metric", ["metric", "n", "median", "max"],
                     [[k, v["n"], f"{v['median']:.1f}%", f"{v['max']:.1f}%"] for k, v in summary(results).items()]),
    ]
    out += [f"not compared: {m} ({w})" for m, w in v.skipped]
    return out


def _value(v: Any) -> str:
    """A fitted value in 4 significant digits, large ones with thousands separators."""
    return f"{v:,.0f}" if isinstance(v, float) and abs(v) >= 1e5 else (f"{v:.4g}" if isinstance(v, float) else str(v))


def calibration_view(cal: Calibration, data: dict[str, Any], out: Path | None) -> list[Any]:
    lines: list[Any] = [simple_table("fitted efficiencies" + (f" -> {out}" if out else " (--out FILE writes them)"),
                                     ["parameter", "value"], [[k, _value(v)] for k, v in data["shared"].items()]),
                        f"in-sample median abs error {cal.provenance['in_sample_median_abs_pct_error']}% over "
                        f"{cal.provenance['points']} points"]
    for gpu, v in cal.provenance.get("per_gpu", {}).items():
        lines.append(f"{gpu}: own refit over {v['points']} points, in-sample median "
                     f"{v['in_sample_median_abs_pct_error_own']}% (shared values: "
                     f"{v['in_sample_median_abs_pct_error_shared']}%)")
    if "baseline_iiswc" in data:
        lines.append(simple_table("IISWC baseline, fitted in-sample on the same data",
                                  ["metric", "n", "median", "max", "how"],
                                  [[r["metric"], r["n"], f"{r['median_abs_pct']:.1f}%", f"{r['max_abs_pct']:.1f}%",
                                    r["how"]] for r in data["baseline_iiswc"]]))
        lines.append("IISWC baseline on a held-out GPU: " + data["baseline_iiswc_held_out_gpu"])
    for name, groups in data.get("cross_validation", {}).items():
        lines.append(simple_table(name.replace("_", " ") + " (fit without it, predict it)",
                                  ["held out", "n", "median", "max"],
                                  [[g, v["n"], f"{v['median']:.1f}%", f"{v['max']:.1f}%"] for g, v in groups.items()]))
    return lines


def corpus_csv_rows(rep: dict[str, Any], listed: list[Any] | None = None) -> list[dict[str, Any]]:
    """`validate --corpus --csv`: one row per source (coverage, then n / median / max absolute % error per
    metric); with `listed` (--reasons), one row per point not compared instead."""
    if listed is not None:
        return [{"source": x.source, "point": x.id, "what": x.what, "why": x.reason} for x in listed]
    return [{"source": src, **cov, "errors": rep["errors"].get(src, {})} for src, cov in rep["coverage"].items()]


def corpus_view(rep: dict[str, Any], listed: list[Any] | None = None) -> list[Any]:
    """`validate --corpus`: coverage and absolute % error per source; with `listed`, every point not compared
    and why (--reasons)."""
    from ..validate.corpus.checks import TABLE_COLUMNS, table_rows

    out: list[Any] = [simple_table("published-runs corpus: coverage and absolute % error per source (n: median / max)",
                                   list(TABLE_COLUMNS), table_rows(rep))]
    if listed is not None:
        out.append(simple_table("not compared", ["source", "point", "what", "why"],
                                [[x.source, x.id, x.what, x.reason] for x in listed]))
    return out
