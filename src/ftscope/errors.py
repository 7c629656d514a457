"""User-facing errors: the CLI prints them as one line on stderr and exits with code 2."""
from __future__ import annotations

import difflib
from typing import Iterable


class FtscopeError(Exception):
    """Bad input (unknown name, malformed file, impossible mix). Never a bug in ftscope."""


def install_hint(extra: str) -> str:
    """How to install an optional extra. ftscope installs from a checkout, not from a package index, so
    `pip install 'ftscope[extra]'` would fail: the hint names the checkout's own install."""
    return f"pip install -e '.[{extra}]' in a checkout of ftscope (or `make install-test`, which installs every extra)"


def did_you_mean(word: str, choices: Iterable[str], n: int = 3) -> str:
    """A ' (did you mean: a, b?)' suffix, or '' when nothing is close."""
    close = difflib.get_close_matches(str(word).lower(), [c.lower() for c in choices], n=n, cutoff=0.5)
    return f" (did you mean: {', '.join(close)}?)" if close else ""


def unknown(kind: str, word: str, choices: Iterable[str]) -> FtscopeError:
    choices = list(choices)
    hint = did_you_mean(word, choices)
    if not hint:
        hint = f" (known: {', '.join(sorted(choices)[:12])}{', ...' if len(choices) > 12 else ''})"
    return FtscopeError(f"unknown {kind} '{word}'{hint}")
