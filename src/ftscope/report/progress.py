"""Progress on stderr for anything that runs longer than SHOW_AFTER_S: a bar for searches, a spinner for one long
call (calibrate's fit). Only on a terminal, so --json and --csv output and logs never see it."""
from __future__ import annotations

import threading
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


class Spinner:
    """A spinner with a message on stderr while a long call runs: only on a terminal, only after SHOW_AFTER_S
    (a quick call shows nothing), gone when the call returns."""

    def __init__(self, message: str, enabled: bool = True, show_after_s: float = SHOW_AFTER_S) -> None:
        from rich.console import Console
        self.console = Console(stderr=True)
        self.message = message
        self.enabled = enabled and self.console.is_terminal
        self.show_after_s = show_after_s
        self.status: Any = None
        self.timer: Any = None
        self.lock = threading.Lock()

    def _start(self) -> None:
        with self.lock:
            if self.timer is not None:  # not stopped meanwhile
                self.status = self.console.status(self.message)
                self.status.start()

    def __enter__(self) -> "Spinner":
        if self.enabled:
            self.timer = threading.Timer(self.show_after_s, self._start)
            self.timer.daemon = True
            self.timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            if self.status is not None:
                self.status.stop()
                self.status = None
