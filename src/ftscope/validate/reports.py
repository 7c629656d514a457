"""What `ftscope validate` and `ftscope calibrate` compute, as data: predicted vs measured over the published
cases (and profile stores), and the fitted efficiencies with their cross-validation and the IISWC baseline."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from ..errors import FtscopeError
from ..estimate.efficiency import Calibration
from .calibrate import calibrate, cross_validations, time_points
from .cases import Case, load_cases
from .compare import Check, CheckResult, all_checks, run_validation, skipped_measurements, summary
from .store_cases import store_checks


@dataclass
class Validation:
    """Predicted vs measured per check, and what was left out."""

    cases: list[Case]
    extra: list[Check]
    """Checks from a profile store (measured points, re-estimated)."""
    results: list[CheckResult]
    skipped: list[tuple[str, str]]
    """(measurement, why) for measured numbers no check compares."""

    def to_dict(self) -> dict[str, Any]:
        return {"results": [r.to_dict() for r in self.results], "summary": summary(self.results),
                "skipped": [{"measurement": m, "why": w} for m, w in self.skipped]}


def validation(cases: Sequence[str] | None = None, db: str | Path | None = None,
               calibration: str | None = None) -> Validation:
    """Every published case (the bundled ones by default) and every measured point of the profile store `db`."""
    loaded = load_cases(cases)
    extra: list[Check] = []
    skipped = [s for case in loaded for s in skipped_measurements(case)]
    if db is not None:
        extra, left_out = store_checks(db)
        skipped += left_out
    return Validation(loaded, extra, run_validation(loaded, calibration=calibration, extra=extra), skipped)


CV_KINDS = ("source", "case", "gpu", "model", "all")
"""What `calibrate --cv` may hold out in turn."""


def calibration_report(cases: Sequence[str] | None = None, dbs: Sequence[str | Path] = (), cv: str | None = None,
                       baseline: str | None = None, corpus: bool = False) -> tuple[Calibration, dict[str, Any]]:
    """Fit the efficiencies on the cases (and the CUDA step times of the profile stores, and the published-runs
    corpus); the calibration and its JSON, with leave-one-out cross-validation (cv: one of CV_KINDS) and the
    IISWC baseline fitted on the same data."""
    if baseline is not None and baseline != "iiswc":
        raise FtscopeError(f"unknown baseline '{baseline}' (known: iiswc)")
    if cv is not None and cv not in CV_KINDS:
        raise FtscopeError(f"--cv must be one of {', '.join(CV_KINDS)}; got {cv!r}")
    checks = all_checks(load_cases(cases))
    sources = list(cases or ["bundled dev-cases.yaml"])
    for store in dbs:
        checks += store_checks(store)[0]
        sources.append(f"profile store {Path(store).name}")
    if corpus:
        from .corpus import map_corpus
        from .corpus.checks import corpus_checks
        checks += corpus_checks(map_corpus())[0]
        sources.append("bundled published-runs.yaml")
    cal = calibrate(checks, sources)
    data: dict[str, Any] = cal.to_dict()
    if cv:
        data["cross_validation"] = cross_validations(time_points(checks), cv)
    if baseline is not None:
        from .iiswc import max_batch_fit, throughput_fit
        data["baseline_iiswc"] = [asdict(r) for r in (throughput_fit(checks), max_batch_fit(checks)) if r]
        data["baseline_iiswc_held_out_gpu"] = "not defined: Eq. 2 has no GPU term and is refitted per GPU"
    return cal, data
