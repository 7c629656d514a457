"""Which file a results store is, opened the right way: refuse what is not one, read without writing, claim runs.

A reader (`report`, `validate`, `calibrate`) opens the file through a read-only SQLite URI (`mode=ro`): it never
creates tables, never switches the journal to WAL, never writes a byte. A writer (`profile`) first identifies an
existing file the same read-only way, so someone else's database is refused before anything is changed. A run is
claimed by an exclusive `flock` on a lock file beside the store, which the kernel releases when the process ends
(even by SIGKILL), so a second `--resume` of the same run refuses instead of measuring it twice.

Only the standard library: importing this must not import torch.
"""
from __future__ import annotations

import os
import sqlite3
import urllib.parse
from pathlib import Path
from typing import IO

from ..errors import FtscopeError
from ..files import check_path, os_error, show

STORE_TABLES = {"meta", "runs", "points"}


def _refuse(path: Path, what: str) -> FtscopeError:
    return FtscopeError(f"{show(path)} is {what}; give an ftscope results store (written by `ftscope profile --db`)")


def _describe_non_sqlite(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError:
        return "not an SQLite database"
    if not head:
        return "an empty file"
    if head.startswith(b"SQLite format 3"):
        return "a damaged SQLite database"
    if all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        return f"a text file, not an SQLite database (it starts {head.decode(errors='replace')[:12]!r})"
    return "not an SQLite database"


def readonly_uri(path: Path) -> str:
    return f"file:{urllib.parse.quote(os.fspath(path.resolve()))}?mode=ro"


def _check_header(path: Path) -> None:
    """Refuse a non-empty file that does not start as SQLite's do (SQLite itself takes a short text file for an
    empty database, and a writer would then turn it into one)."""
    with open(path, "rb") as fh:
        head = fh.read(16)
    if head and head != b"SQLite format 3\x00":
        raise _refuse(path, _describe_non_sqlite(path))


def identify(db: sqlite3.Connection, path: Path, schema_version: int) -> bool:
    """True for an ftscope store this code reads, False for an empty SQLite file; else FtscopeError naming what it is."""
    try:
        _check_header(path)
    except OSError as exc:
        raise os_error(exc, "results store", path) from None
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError:
        raise _refuse(path, _describe_non_sqlite(path)) from None
    if not tables:
        return False
    if not STORE_TABLES <= tables:
        listed = ", ".join(sorted(t for t in tables if not t.startswith("sqlite_")))[:80]
        raise _refuse(path, f"an SQLite database but not an ftscope store (its tables: {listed})")
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    version = int(row[0]) if row and str(row[0]).isdecimal() else None
    if version is None:
        raise _refuse(path, "an SQLite database with ftscope's tables but no schema version")
    if version > schema_version:
        raise FtscopeError(f"{show(path)} was written by a newer ftscope (store schema {version}; this one reads up to "
                           f"{schema_version}): upgrade ftscope")
    return True


def open_readonly(path: str | os.PathLike[str], schema_version: int, timeout_s: float) -> sqlite3.Connection:
    """A read-only connection to an existing ftscope store (nothing on disk changes)."""
    p = check_path(path, "results store")
    if p.is_dir():
        raise _refuse(p, "a folder")
    if not p.exists():
        raise FtscopeError(f"results store not found: {show(p)}")
    if not p.is_file():
        raise _refuse(p, "not a regular file")
    try:
        db = sqlite3.connect(readonly_uri(p), uri=True, timeout=timeout_s, isolation_level=None)
        if not identify(db, p, schema_version):
            db.close()
            raise _refuse(p, "an empty file" if p.stat().st_size == 0 else "an empty SQLite database")
    except sqlite3.Error as exc:
        raise FtscopeError(f"cannot read results store {show(p)}: {exc}") from None
    return db


def check_writable(path: str | os.PathLike[str], schema_version: int, timeout_s: float) -> Path:
    """The path of a store `profile` may write: a new file, an empty one, or an ftscope store (checked read-only)."""
    p = check_path(path, "results store")
    if p.is_dir():
        raise _refuse(p, "a folder")
    if p.exists() and not p.is_file():
        raise _refuse(p, "not a regular file")
    if p.exists() and p.stat().st_size > 0:
        try:
            with sqlite3.connect(readonly_uri(p), uri=True, timeout=timeout_s) as db:
                identify(db, p, schema_version)
        except sqlite3.Error as exc:
            raise FtscopeError(f"cannot read results store {show(p)}: {exc}") from None
    for up in (p.parent, *p.parent.parents):
        if up.exists():
            if not up.is_dir():
                raise FtscopeError(f"results store {show(p)}: {show(up)} is a file, not a folder")
            break
    return p


class RunClaim:
    """An exclusive claim on one run of a store, held until `release()` or the end of the process."""

    def __init__(self, store_path: Path, run_id: int) -> None:
        self.path = store_path.with_name(f"{store_path.name}.run{run_id}.lock")
        self._fh: IO[str] | None = None
        try:
            import fcntl
        except ImportError:  # no flock (Windows): runs are not claimed
            return
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise FtscopeError(f"run {run_id} of {show(store_path)} is being measured by {holder}: wait for it to "
                               "finish, or drop --resume to start a run of your own") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"process {os.getpid()} on {os.uname().nodename}")
        fh.flush()
        self._fh = fh

    def release(self, remove: bool = False) -> None:
        """Drop the claim; `remove` also deletes the lock file (only safe once the run can no longer be resumed)."""
        if self._fh is not None:
            if remove:
                self.path.unlink(missing_ok=True)
            self._fh.close()  # closing drops the flock
            self._fh = None
