"""A progress bar for long searches: on stderr, only on a terminal, only once a search has run for a while."""
from __future__ import annotations

import time
from typing import Any

SHOW_AFTER_S = 2.0
"""Searches shorter than this never show a bar."""
STAGES = {"classify": "classifying configurations", "estimate": "estimating the contenders",
          "exhaustive": "estimating every configuration", "limits": "checking budget and deadline"}


class SearchProgress:
    """A context manager whose instance is the search's progress callback: progress(stage, done, total)."""

    def __init__(self, enabled: bool = True, show_after_s: float = SHOW_AFTER_S) -> None:
        from rich.console import Console
        self.console = Console(stderr=True)
        self.enabled = enabled and self.console.is_terminal
        self.show_after_s = show_after_s
        self.started = time.perf_counter()
        self.bar: Any = None
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> "SearchProgress":
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        if not self.enabled or time.perf_counter() - self.started < self.show_after_s:
            return
        if self.bar is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("ETA"), TimeRemainingColumn(), console=self.console, transient=True)
            self.bar.start()
        if stage not in self.tasks:
            self.tasks[stage] = self.bar.add_task(STAGES.get(stage, stage), total=total)
        self.bar.update(self.tasks[stage], completed=done, total=total)
