"""Command-line option values, checked before any work: ranges, finiteness, lists, and the paths options name.

typer turns text into ints and floats; what they must be (a batch size from 1 to 65,536, a finite margin below
1, a folder holding config.json) is checked here, so a `profile` or `trace` with a bad option fails in
milliseconds instead of after building a model. Each problem is one FtscopeError naming the option.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Iterable, Sequence

from .errors import FtscopeError
from .files import check_path, os_error, output_dir, output_file, show


def split(value: str | None) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']."""
    return [v.strip() for v in value.split(",") if v.strip()] if value else []


def ints(text: str | None, flag: str, lo: int, hi: int) -> list[int]:
    """Comma-separated integers, each in [lo, hi]."""
    try:
        values = [int(v) for v in split(text)]
    except ValueError:
        raise FtscopeError(f"{flag} must be comma-separated integers; got {str(text)[:60]!r}") from None
    if any(not lo <= v <= hi for v in values):
        raise FtscopeError(f"{flag} values must be integers from {lo:,} to {hi:,}; got {str(text)[:60]!r}")
    return values


def integer(value: int | None, flag: str, lo: int, hi: int) -> None:
    if value is not None and not lo <= value <= hi:
        raise FtscopeError(f"{flag} must be an integer from {lo:,} to {hi:,}; got {value}")


def number(value: float | None, flag: str, gt: float | None = None, ge: float | None = None,
           lt: float | None = None, le: float | None = None) -> None:
    """A finite float in the range (NaN and inf are refused: they pass any comparison unnoticed)."""
    if value is None:
        return
    ok = math.isfinite(value) and (gt is None or value > gt) and (ge is None or value >= ge) \
        and (lt is None or value < lt) and (le is None or value <= le)
    if not ok:
        bounds = [f"above {gt:g}" if gt is not None else "", f"at least {ge:g}" if ge is not None else "",
                  f"below {lt:g}" if lt is not None else "", f"at most {le:g}" if le is not None else ""]
        raise FtscopeError(f"{flag} must be a finite number {' and '.join(b for b in bounds if b)}; got {value}")


def choice(value: str, flag: str, options: Sequence[str]) -> None:
    if value not in options:
        raise FtscopeError(f"{flag} must be one of {', '.join(options)}; got {str(value)[:40]!r}")


def device(value: str) -> None:
    """auto | cuda | cuda:N | cpu."""
    if value not in ("auto", "cuda", "cpu") and not (value.startswith("cuda:") and value[5:].isdecimal()):
        raise FtscopeError(f"--device must be auto, cuda, cuda:N or cpu; got {value[:40]!r}")


def input_file(path: str | os.PathLike[str] | None, what: str) -> Path | None:
    """A file the command will read: it exists, is a file and can be opened."""
    if path is None:
        return None
    p = check_path(path, what)
    try:
        if p.is_dir():
            raise FtscopeError(f"{what} {show(p)} is a folder; give a file")
        with open(p, "rb"):
            pass
    except OSError as exc:
        raise os_error(exc, what, p) from None
    return p


def input_files(paths: Iterable[str | os.PathLike[str]] | None, what: str) -> list[Path]:
    return [p for p in (input_file(x, what) for x in paths or ()) if p is not None]


def model_dir(path: str | os.PathLike[str] | None, what: str) -> Path | None:
    """A local Hugging Face model folder: config.json in it (weights are checked when loaded)."""
    if path is None:
        return None
    p = check_path(path, what)
    try:
        if not p.is_dir():
            raise FtscopeError(f"{what} {show(p)} is not a folder (give a local Hugging Face model folder)")
    except OSError as exc:
        raise os_error(exc, what, p) from None
    input_file(p / "config.json", f"{what} config.json")
    return p


def out_file(path: str | os.PathLike[str] | None, what: str, suffixes: Sequence[str] = ()) -> Path | None:
    """An output file: a writable place (parent folders created), with one of `suffixes` when given."""
    if path is None:
        return None
    p = check_path(path, what)
    if suffixes and p.suffix.lower() not in suffixes:
        raise FtscopeError(f"{what} must end in {' or '.join(suffixes)}; got {show(p.name)}")
    return output_file(p, what)


def out_dir(path: str | os.PathLike[str] | None, what: str) -> Path | None:
    return None if path is None else output_dir(path, what)


SHRINK_KEYS = ("layers", "hidden", "experts", "vocab", "intermediate", "heads")


def shrink(text: str | None) -> dict[str, int] | None:
    """'layers=2,hidden=256,experts=4' -> {'layers': 2, 'hidden': 256, 'experts': 4}."""
    if not text:
        return None
    out = {}
    for part in split(text):
        key, _, value = part.partition("=")
        if key not in SHRINK_KEYS or not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= 2**20:
            raise FtscopeError(f"--shrink takes {','.join(k + '=N' for k in SHRINK_KEYS)} (N from 1 to 1,048,576); "
                               f"got {part[:40]!r}")
        out[key] = int(value)
    return out
