"""progress: a bar on a terminal's stderr for searches that run a while; nothing otherwise."""
from __future__ import annotations

import io

from rich.console import Console

from ftscope.report.progress import SearchProgress


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
