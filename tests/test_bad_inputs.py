"""The bad-input suite (benchmarks/bad_inputs.py), run in-process: every case ends as it should.

Each case calls `ftscope.cli.main` with its argv, stdout and stderr captured: no traceback, an allowed exit code,
a one-line error for exit 2, no NaN / inf / negative figure on a success. The benchmark runs the same cases as
real subprocesses (with a hang guard) and prints the summary the README quotes.
"""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from bad_input_cases import Case, build  # noqa: E402
from bad_inputs import Outcome, problems  # noqa: E402

from ftscope.cli import main  # noqa: E402

FIXTURES = Path(tempfile.mkdtemp(prefix="ftscope-bad-inputs-"))
CASES = build(FIXTURES / "fixtures")


@pytest.fixture(scope="module", autouse=True)
def _remove_fixtures():
    yield
    shutil.rmtree(FIXTURES, ignore_errors=True)


def run_in_process(case: Case, cwd: Path) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    sys.argv = ["ftscope", *case.argv]
    start = time.perf_counter()
    code: int | None = 0
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - whatever escapes main() is the crash this suite looks for
        err.write(traceback.format_exc())
        code = 1
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
    return Outcome(case, code, out.getvalue(), err.getvalue(), time.perf_counter() - start)


def test_the_suite_covers_every_verb_and_at_least_300_cases():
    verbs = {c.argv[0] for c in CASES} | {f"study {c.argv[1]}" for c in CASES if c.argv[0] == "study"}
    assert len(CASES) >= 300
    assert {"plan", "estimate", "recommend", "study moe", "study optimizations", "validate", "calibrate", "report",
            "profile", "trace", "show", "models", "gpus"} <= verbs


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_line_never_a_crash_or_nonsense(case: Case):
    outcome = run_in_process(case, FIXTURES)
    found = problems(outcome)
    assert not found, f"{found}: {outcome.stderr.strip()[-600:] or outcome.stdout.strip()[-300:]}"
