"""Corpus points as checks (one measured number each), coverage per source and error per source and metric."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ...errors import FtscopeError
from ...spec.scenario import Scenario, scenario_from_dict
from ..compare import Check, CheckResult, summary
from .common import MODELLED, Mapped


@dataclass(frozen=True)
class Listed:
    """A point, or one number of a compared point, that is not compared, with why."""

    source: str
    id: str
    what: str
    """'point' or the metric left out."""
    reason: str


def _scenario(m: Mapped) -> Scenario:
    assert m.scenario is not None
    return scenario_from_dict(m.scenario)


def corpus_checks(mapped: Sequence[Mapped], modelled: frozenset[str] = MODELLED) -> tuple[list[Check], list[Listed]]:
    """Checks for every comparable number, and every point or number left out with its reason."""
    checks: list[Check] = []
    listed: list[Listed] = []
    for m in mapped:
        why = m.why_not(modelled)
        scn = None
        if why is None:
            try:
                scn = _scenario(m)
            except FtscopeError as exc:
                why = f"scenario rejected: {exc}"
        if scn is None:
            listed.append(Listed(m.source, m.id, "point", why or "no scenario"))
            continue
        note = "; ".join(m.notes)
        for meas in m.measures:
            if meas.reason:
                listed.append(Listed(m.source, m.id, meas.metric, meas.reason))
                continue
            checks.append(Check(m.id, m.source, meas.metric, meas.value, scn, "; ".join(x for x in (meas.note, note) if x)))
    return checks, listed


def _is_throughput(metric: str) -> bool:
    return metric in ("tokens_per_s_per_gpu", "step_s")


def coverage(mapped: Sequence[Mapped], checks: Sequence[Check | CheckResult]) -> dict[str, dict[str, int]]:
    """Per source: points total / compared / listed, and throughput points total / compared."""
    compared_ids = {c.case_id for c in checks}
    tput_ids = {c.case_id for c in checks if _is_throughput(c.metric)}
    out: dict[str, dict[str, int]] = {}
    for m in mapped:
        row = out.setdefault(m.source, {"points": 0, "compared": 0, "listed": 0, "throughput_points": 0,
                                        "throughput_compared": 0})
        row["points"] += 1
        row["compared" if m.id in compared_ids else "listed"] += 1
        if any(_is_throughput(x.metric) for x in m.measures):
            row["throughput_points"] += 1
            row["throughput_compared"] += m.id in tput_ids
    return out


def per_source(results: Sequence[CheckResult]) -> dict[str, dict[str, dict[str, float]]]:
    """Per source and metric family: n, median and max absolute % error (OOM: right / wrong)."""
    groups: dict[str, list[CheckResult]] = {}
    for r in results:
        groups.setdefault(r.group, []).append(r)
    return {g: summary(rs) for g, rs in groups.items()}


def totals(cov: dict[str, dict[str, int]]) -> dict[str, int]:
    keys = ("points", "compared", "listed", "throughput_points", "throughput_compared")
    return {k: sum(row[k] for row in cov.values()) for k in keys}


def report(mapped: Sequence[Mapped], results: Sequence[CheckResult], listed: Sequence[Listed]) -> dict[str, Any]:
    """The JSON form of `validate --corpus`: coverage and errors per source, every result, every listed item."""
    cov = coverage(mapped, results)
    frameworks = {m.id: m.framework for m in mapped}
    return {
        "coverage": cov, "totals": totals(cov), "errors": per_source(results),
        "results": [{**r.to_dict(), "source": r.group, "framework": frameworks.get(r.case_id, "")} for r in results],
        "listed": [{"source": x.source, "id": x.id, "what": x.what, "reason": x.reason,
                    "framework": frameworks.get(x.id, "")} for x in listed],
    }


def run_corpus(source: str | None = None, calibration: Any = None, path: str | None = None,
               modelled: frozenset[str] = MODELLED) -> tuple[list[Mapped], list[CheckResult], list[Listed]]:
    """Map the corpus (one source, or all), predict every comparable number; (mapped, results, listed)."""
    from ...estimate.efficiency import Calibration, load_calibration
    from . import load_corpus, map_corpus

    sources = load_corpus(path)
    if source is not None:
        known = [s.id for s in sources]
        if source not in known:
            from ...errors import did_you_mean
            raise FtscopeError(f"unknown corpus source '{source}'{did_you_mean(source, known)} (known: {', '.join(known)})")
        sources = [s for s in sources if s.id == source]
    mapped = map_corpus(sources)
    checks, listed = corpus_checks(mapped, modelled)
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    results = [CheckResult(c.case_id, c.group, c.metric, c.predict(cal), c.measured, c.note) for c in checks]
    return mapped, results, listed


def _cell(stats: dict[str, float] | None) -> str:
    if not stats:
        return "-"
    if "right" in stats:
        return f"{int(stats['right'])}/{int(stats['n'])} right"
    return f"{int(stats['n'])}: {stats['median']:.1f}% / {stats['max']:.0f}%"


TABLE_COLUMNS = ("source", "points", "compared", "listed", "throughput n: median / max", "MFU", "peak memory", "OOM")


def table_rows(rep: dict[str, Any]) -> list[list[str]]:
    """One row per source (and a total) of the coverage / error table `validate --corpus` prints."""
    rows = []
    for src, cov in rep["coverage"].items():
        err = rep["errors"].get(src, {})
        rows.append([src, cov["points"], cov["compared"], cov["listed"], _cell(err.get("tokens_per_s_per_gpu")),
                     _cell(err.get("mfu")), _cell(err.get("peak_gib")), _cell(err.get("oom"))])
    t = rep["totals"]
    rows.append(["total", t["points"], t["compared"], t["listed"],
                 f"{t['throughput_compared']}/{t['throughput_points']} throughput points compared", "", "", ""])
    return rows
