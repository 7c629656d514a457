"""progress: a bar (searches) or a spinner (one long call) on a terminal's stderr, once a while has passed; nothing otherwise."""
from __future__ import annotations

import io

from rich.console import Console

from ftscope.report.progress import SearchProgress, Spinner


def test_no_bar_when_stderr_is_not_a_terminal():
    with SearchProgress(show_after_s=0.0) as progress:
        progress("classify", 10, 100)
        assert progress.bar is None and not progress.enabled  # pytest captures stderr


def test_a_bar_with_eta_appears_only_after_the_delay():
    out = io.StringIO()
    with SearchProgress(show_after_s=3600.0) as progress:
        progress.console, progress.enabled = Console(file=out, force_terminal=True), True
        progress("classify", 10, 100)
        assert progress.bar is None
        progress.show_after_s = 0.0
        progress("classify", 50, 100)
        progress("estimate", 7, None)
        assert set(progress.tasks) == {"classify", "estimate"}
        assert progress.bar.tasks[0].completed == 50 and progress.bar.tasks[0].total == 100
    assert "classifying configurations" in out.getvalue()


def _forced(spinner: Spinner, out: io.StringIO) -> Spinner:
    spinner.console, spinner.enabled = Console(file=out, force_terminal=True), True
    return spinner


def test_no_spinner_when_stderr_is_not_a_terminal_or_for_machine_output():
    with Spinner("fitting", show_after_s=0.0) as spinner:
        assert spinner.timer is None and not spinner.enabled  # pytest captures stderr
    with Spinner("fitting", enabled=False) as spinner:
        assert spinner.timer is None


def test_a_spinner_appears_once_the_delay_has_passed_and_is_gone_after():
    out = io.StringIO()
    with _forced(Spinner("fitting the efficiencies", show_after_s=3600.0), out) as spinner:
        assert spinner.timer is not None and spinner.status is None
        spinner._start()  # what the timer does once the delay has passed
        assert spinner.status is not None
    assert spinner.status is None and spinner.timer is None
    assert "fitting the efficiencies" in out.getvalue()


def test_a_quick_call_shows_nothing():
    out = io.StringIO()
    with _forced(Spinner("fitting", show_after_s=3600.0), out):
        pass
    assert out.getvalue() == ""
