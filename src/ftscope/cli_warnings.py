"""What third-party libraries warn (transformers, bitsandbytes, torch, ...) during a command: filtered out of the
terminal, counted, and logged to stderr with `ftscope -v`. ftscope's own warnings and notes are never touched.

A Python warning is third-party when the code that raised it, or the file it is attributed to, lies in one of
THIRD_PARTY's installed packages; the libraries' loggers are routed here too (transformers' own logger through
its TRANSFORMERS_VERBOSITY setting, which a user's environment still overrides).
"""
from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import PurePath
from typing import Any, TextIO

THIRD_PARTY = ("transformers", "bitsandbytes", "torch", "peft", "accelerate", "deepspeed", "huggingface_hub",
               "datasets", "tokenizers", "safetensors", "triton", "lightning", "pytorch_lightning")
"""Top-level packages whose warnings are filtered (ftscope's optional dependencies and what they pull in)."""
LOGGER = "ftscope.third_party"
_shown_by: Any = warnings.showwarning
"""What shows the warnings that are not third-party (the showwarning found when the filter was installed)."""


def third_party(filename: str) -> bool:
    """Whether a source file belongs to an installed third-party package (…/site-packages/torch/…)."""
    parts = PurePath(filename).parts
    return any(p in ("site-packages", "dist-packages") and i + 1 < len(parts) and parts[i + 1] in THIRD_PARTY
               for i, p in enumerate(parts))


def _raiser() -> str:
    """The file of the code that called warnings.warn (the first frame outside the warnings machinery)."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename == __file__
                                 or PurePath(frame.f_code.co_filename).name == "warnings.py"):
        frame = frame.f_back  # type: ignore[assignment]
    return frame.f_code.co_filename if frame is not None else ""


class _Sink(logging.Handler):
    """Writes a third-party record to stderr when verbose, else only counts it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.verbose = False
        self.hidden = 0
        self.stream: TextIO | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if not self.verbose:
            self.hidden += 1
            return
        who = "" if record.name == LOGGER else f"{record.name}: "  # a Python warning names its file instead
        (self.stream or sys.stderr).write(f"ftscope: third-party: {who}{record.getMessage()}\n")


SINK = _Sink()


def _show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
          line: str | None = None) -> None:
    if third_party(filename) or third_party(_raiser()):
        where = "/".join(PurePath(filename).parts[-2:])  # transformers/modeling_utils.py
        logging.getLogger(LOGGER).warning("%s: %s (%s:%s)", category.__name__, message, where, lineno)
        return
    _shown_by(message, category, filename, lineno, file, line)


def filter_third_party(verbose: bool) -> None:
    """Route third-party warnings and log records to SINK: shown on stderr with verbose, else counted."""
    global _shown_by
    SINK.verbose = verbose
    SINK.hidden = 0
    if warnings.showwarning is not _show:
        _shown_by, warnings.showwarning = warnings.showwarning, _show
    if not verbose:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in (LOGGER, *THIRD_PARTY):
        if name == "transformers":
            continue  # it configures its own handler and level on first use: TRANSFORMERS_VERBOSITY above
        log = logging.getLogger(name)
        if SINK not in log.handlers:
            log.addHandler(SINK)
        log.propagate = False
        if log.level == logging.NOTSET:
            log.setLevel(logging.WARNING)


def hidden_note() -> str | None:
    """One line saying how many third-party warnings were filtered (None when there were none)."""
    if SINK.verbose or not SINK.hidden:
        return None
    return f"{SINK.hidden} third-party warning(s) filtered (ftscope -v shows them)"
