"""The `ftscope` commands that check the estimator: validate (predicted vs measured: published cases, profile
stores, the published-runs corpus) and calibrate (fit the time model's efficiencies). cli.py registers them."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from . import options as opt
from .cli_io import CAL_OPT, CSV_OPT, JSON_OPT, WIDE_OPT, one_format, print_csv, print_json, print_view


def validate(
    cases: Optional[List[Path]] = typer.Option(None, "--cases", help="Published case files (default: the bundled cases)."),
    db: Optional[Path] = typer.Option(None, "--db", help="Also compare every measured point of this profile store."),
    corpus: bool = typer.Option(False, "--corpus", help="The published-runs corpus instead: coverage and error per source."),
    source: Optional[str] = typer.Option(None, "--source", help="With --corpus: one source only (its id)."),
    reasons: bool = typer.Option(False, "--reasons", help="With --corpus: list every point not compared, with why."),
    json_out: bool = JSON_OPT,
    csv_out: bool = CSV_OPT,
    wide: bool = WIDE_OPT,
    calibration: Optional[Path] = CAL_OPT,
) -> None:
    """Predicted vs measured on published cases (and profile runs): absolute % error per case and metric,
    median and max. Memory is compared in the metric the source measured (allocated, reserved, nvidia-smi).
    With --corpus: every point of the 420-point published corpus, compared or listed with the reason."""
    one_format(json_out, csv_out)
    opt.input_file(calibration, "calibration file")
    if corpus or source or reasons:
        from .validate.corpus.checks import report, run_corpus

        mapped, results, listed = run_corpus(source, str(calibration) if calibration else None)
        rep = report(mapped, results, listed)
        if json_out:
            print_json(rep)
            return
        from .report.validation_views import corpus_csv_rows, corpus_view
        if csv_out:
            print_csv(corpus_csv_rows(rep, listed if reasons else None))
            return
        print_view(corpus_view(rep, listed if reasons else None), wide)
        return
    from .validate.reports import validation

    opt.input_files(cases, "cases file")
    v = validation([str(c) for c in cases] if cases else None, db, str(calibration) if calibration else None)
    if json_out:
        print_json(v.to_dict())
        return
    if csv_out:
        print_csv([r.to_dict() for r in v.results])
        return
    from .report.validation_views import validation_view
    print_view(validation_view(v), wide)


def calibrate(
    cases: Optional[List[Path]] = typer.Option(None, "--cases", help="Case files to fit on (default: the bundled cases)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the calibration JSON here (--json prints it)."),
    cv: Optional[str] = typer.Option(None, "--cv", help="Also cross-validate: hold out each source | case | gpu | model "
                                     "in turn (fit without it, predict it), or all of them."),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="Also fit a baseline model on the same data: iiswc."),
    db: Optional[List[Path]] = typer.Option(None, "--db", help="Also fit on the CUDA step times of this profile store (repeatable)."),
    corpus: bool = typer.Option(False, "--corpus", help="Also fit on the throughput of the published-runs corpus."),
    json_out: bool = JSON_OPT,
    wide: bool = WIDE_OPT,
) -> None:
    """Fit the time model's efficiency parameters to measured times (published cases, plus your own profile
    runs with --db, plus the published-runs corpus with --corpus); `--cv` says how well it predicts what it did
    not see."""
    from .validate.reports import CV_KINDS, calibration_report

    if baseline is not None:
        opt.choice(baseline, "--baseline", ("iiswc",))
    if cv is not None:
        opt.choice(cv, "--cv", CV_KINDS)
    opt.input_files(cases, "cases file")
    opt.out_file(out, "--out calibration file")
    from .report.progress import Spinner
    with Spinner("fitting the efficiencies" + (f", cross-validating by {cv}" if cv else ""), enabled=not json_out):
        cal, data = calibration_report([str(c) for c in cases] if cases else None, db or (), cv, baseline, corpus)
    if out is not None:
        from .files import write_text
        write_text(out, json.dumps(cal.to_dict(), indent=2) + "\n", "--out calibration file")
    if json_out:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    from .report.validation_views import calibration_view
    print_view(calibration_view(cal, data, out), wide)
