"""The results store: every profiled run and every sweep point, in one SQLite file.

One row per run (`runs`: the resolved scenario, the environment it ran in, running | done | failed) and one
row per sweep point (`points`: the measurement and ftscope's own estimate for the same point, side by side).

Durability is the point of this module: a sweep can be killed at any moment (SIGKILL, a CUDA fault that takes
the process down, a pre-empted cloud VM) and `--resume` must carry on without repeating finished points.
Each point is one transaction in WAL mode with `synchronous=FULL`, so a kill loses at most the point in
flight and never leaves a half-written row or a corrupt file; the next open replays or discards the WAL.

Only the standard library (and ftscope's own error and file helpers): importing this module must not import torch.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
import sqlite3
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from ..errors import FtscopeError
from ..files import show
from .store_file import RunClaim, check_writable, open_readonly

SCHEMA_VERSION = 1

RUN_STATUSES = ("running", "done", "failed")
POINT_STATUSES = ("ok", "oom", "error")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    created       TEXT NOT NULL,
    updated       TEXT NOT NULL,
    sweep_id      TEXT,
    scenario_hash TEXT NOT NULL,
    scenario      TEXT NOT NULL,
    environment   TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed')),
    error         TEXT,
    resumes       INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_resume ON runs (status, sweep_id, scenario_hash);
CREATE TABLE IF NOT EXISTS points (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    key         TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('ok', 'oom', 'error')),
    measurement TEXT NOT NULL,
    estimate    TEXT,
    created     TEXT NOT NULL,
    UNIQUE (run_id, key)
);
"""


@dataclasses.dataclass(frozen=True)
class Run:
    """One profiling run (a sweep over points) as stored."""

    id: int
    """Primary key; what `start_run` returned."""
    created: str
    """UTC ISO-8601 time the run was first started."""
    updated: str
    """UTC ISO-8601 time of the last status change (start, resume, finish)."""
    sweep_id: str | None
    """Caller-chosen identity of the sweep, used by `resume` (None: the scenario hash is the identity)."""
    scenario: dict[str, Any]
    """The resolved scenario the run measured."""
    environment: dict[str, Any]
    """Device, driver and library versions at the first start (see `measure.environment`)."""
    status: str
    """running | done | failed; a killed process leaves 'running'."""
    error: str | None
    """Why the run failed, when it did."""
    resumes: int
    """How many times the run was resumed after an interruption."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Point:
    """One measured sweep point (e.g. one batch size) of a run."""

    run_id: int
    """The run it belongs to."""
    key: str
    """Identity of the point within the run, e.g. 'batch=4'; unique per run."""
    status: str
    """ok | oom | error."""
    measurement: dict[str, Any]
    """What was measured (memory, times, expert load, ...); free-form JSON."""
    estimate: dict[str, Any] | None
    """ftscope's own prediction for the same point, for side-by-side error."""
    created: str
    """UTC ISO-8601 time the point was recorded."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def _jsonable(obj: Any) -> Any:
    """`json.dumps` fallback: dataclasses, numpy scalars/arrays, paths, sets, torch dtypes/devices."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if hasattr(obj, "tolist"):  # numpy arrays and scalars, torch tensors
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=str)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    return str(obj)


def _clean(obj: Any) -> Any:
    """NaN / inf become None so the stored text is strict JSON that any reader (jq, JS, duckdb) accepts."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    """Canonical JSON (sorted keys, strict) of anything the store is handed."""
    # Round-trip through the fallback first so NaN cleaning also reaches values inside dataclasses.
    plain = json.loads(json.dumps(obj, default=_jsonable))
    return json.dumps(_clean(plain), sort_keys=True, separators=(",", ":"), allow_nan=False)


def _object(text: Any) -> dict[str, Any]:
    """A stored JSON object; ValueError (why) for text that is not one."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        raise ValueError("its JSON is damaged") from None
    if not isinstance(value, dict):
        raise ValueError(f"holds a JSON {type(value).__name__}, not an object")
    return value


def scenario_hash(scenario: Mapping[str, Any]) -> str:
    """Stable identity of a scenario: sha256 of its canonical JSON (key order does not matter)."""
    return hashlib.sha256(dumps(scenario).encode()).hexdigest()


class Store:
    """A SQLite file of runs and points. Safe to open while another process writes it (WAL readers)."""

    def __init__(self, path: str | os.PathLike[str], timeout_s: float = 30.0, readonly: bool = False) -> None:
        """Open (writers: create) the store at `path`. readonly=True opens an existing store through a read-only
        URI and changes nothing on disk; either way a file that is not an ftscope store is refused, naming what
        it is (see store_file.py)."""
        self.readonly = readonly
        self.unreadable: list[tuple[str, str]] = []
        """(row, why) for rows whose JSON could not be read (edited by hand, truncated): left out of runs()/points()."""
        self._claims: dict[int, RunClaim] = {}
        if readonly:
            self.path = Path(path)
            self._db = open_readonly(path, SCHEMA_VERSION, timeout_s)
            self._db.row_factory = sqlite3.Row
            return
        self.path = check_writable(path, SCHEMA_VERSION, timeout_s)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: no implicit transactions; every write below opens its own explicit one.
            self._db = sqlite3.connect(os.fspath(self.path), timeout=timeout_s, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            # FULL fsyncs the WAL at every commit: a committed point survives a power cut, not just a kill.
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            with self._tx():
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        self._db.execute(stmt)
                self._db.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
        except (sqlite3.Error, OSError) as exc:
            raise FtscopeError(f"cannot write results store {show(self.path)}: {exc}") from None

    # -- plumbing -----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        # IMMEDIATE takes the write lock up front, so two writers queue instead of failing mid-transaction.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        for claim in self._claims.values():
            claim.release()
        self._claims.clear()
        self._db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- runs ---------------------------------------------------------------------------------------------
    def start_run(
        self,
        scenario: Mapping[str, Any],
        environment: Mapping[str, Any],
        sweep_id: str | None = None,
        resume: bool = False,
    ) -> int:
        """Open a run and return its id.

        With `resume=True`, the newest unfinished run (status running or failed) with the same `sweep_id` —
        or, when `sweep_id` is None, the same scenario — is reopened instead (status back to running, error
        cleared, `resumes` + 1) and its id returned; `done_keys` then says what to skip. Without a match a
        new run is created, so `--resume` on a fresh store just starts.
        """
        digest = scenario_hash(scenario)
        now = _now()
        with self._tx() as db:
            # the claim is taken inside the write transaction: no other process can pick the run in between
            if resume:
                if sweep_id is not None:
                    row = db.execute(
                        "SELECT id FROM runs WHERE status != 'done' AND sweep_id = ? ORDER BY id DESC LIMIT 1",
                        (sweep_id,),
                    ).fetchone()
                else:
                    row = db.execute(
                        "SELECT id FROM runs WHERE status != 'done' AND sweep_id IS NULL AND scenario_hash = ?"
                        " ORDER BY id DESC LIMIT 1",
                        (digest,),
                    ).fetchone()
                if row is not None:
                    if int(row["id"]) not in self._claims:  # this Store may hold it already
                        self._claims[int(row["id"])] = RunClaim(self.path, int(row["id"]))
                    db.execute(
                        "UPDATE runs SET status = 'running', error = NULL, updated = ?, resumes = resumes + 1"
                        " WHERE id = ?",
                        (now, row["id"]),
                    )
                    return int(row["id"])
            cur = db.execute(
                "INSERT INTO runs (created, updated, sweep_id, scenario_hash, scenario, environment, status)"
                " VALUES (?, ?, ?, ?, ?, ?, 'running')",
                (now, now, sweep_id, digest, dumps(scenario), dumps(environment)),
            )
            run_id = int(cur.lastrowid)  # type: ignore[arg-type]
            self._claims[run_id] = RunClaim(self.path, run_id)
            return run_id

    def finish_run(self, run_id: int, status: str = "done", error: str | None = None) -> None:
        """Close a run as done or failed (with the error text)."""
        if status not in RUN_STATUSES:
            raise ValueError(f"run status must be one of {RUN_STATUSES}, not {status!r}")
        with self._tx() as db:
            cur = db.execute(
                "UPDATE runs SET status = ?, error = ?, updated = ? WHERE id = ?", (status, error, _now(), run_id)
            )
            if cur.rowcount != 1:
                raise KeyError(f"no run {run_id} in {self.path}")
        claim = self._claims.pop(run_id, None)
        if claim is not None:
            claim.release(remove=status == "done")  # a done run is never resumed: its lock file can go

    def runs(self) -> list[Run]:
        """Every run whose row can be read, oldest first (the others are listed in `unreadable`)."""
        out = []
        for r in self._db.execute("SELECT * FROM runs ORDER BY id").fetchall():
            try:
                out.append(Run(id=r["id"], created=r["created"], updated=r["updated"], sweep_id=r["sweep_id"],
                               scenario=_object(r["scenario"]), environment=_object(r["environment"]),
                               status=r["status"], error=r["error"], resumes=r["resumes"]))
            except ValueError as exc:
                self.unreadable.append((f"run {r['id']}", str(exc)))
        return out

    # -- points -------------------------------------------------------------------------------------------
    def done_keys(self, run_id: int, statuses: Iterable[str] = ("ok", "oom")) -> set[str]:
        """Keys of the run's points already recorded with one of `statuses`.

        'error' points are left out by default so a resumed sweep retries them (an OOM is a result; an
        error usually is not)."""
        wanted = tuple(statuses)
        if not wanted:
            return set()
        marks = ",".join("?" * len(wanted))
        rows = self._db.execute(
            f"SELECT key FROM points WHERE run_id = ? AND status IN ({marks})", (run_id, *wanted)
        ).fetchall()
        return {r["key"] for r in rows}

    def record_point(
        self,
        run_id: int,
        key: str,
        status: str,
        measurement: Any,
        estimate: Any = None,
    ) -> None:
        """Store one sweep point in its own transaction.

        Recording a key the run already has replaces it (a retried 'error' point), so each key is present
        exactly once whatever the history of kills and resumes."""
        if status not in POINT_STATUSES:
            raise ValueError(f"point status must be one of {POINT_STATUSES}, not {status!r}")
        # Serialize before taking the write lock: a value json cannot hold must not leave a lock behind.
        m_text = dumps(measurement if measurement is not None else {})
        e_text = None if estimate is None else dumps(estimate)
        with self._tx() as db:
            db.execute(
                "INSERT INTO points (run_id, key, status, measurement, estimate, created)"
                " VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (run_id, key) DO UPDATE SET status = excluded.status,"
                " measurement = excluded.measurement, estimate = excluded.estimate, created = excluded.created",
                (run_id, key, status, m_text, e_text, _now()),
            )

    def points(self, run_id: int | None = None) -> list[Point]:
        """The points of one run (or of all runs), in the order they were first recorded."""
        if run_id is None:
            rows = self._db.execute("SELECT * FROM points ORDER BY run_id, id").fetchall()
        else:
            rows = self._db.execute("SELECT * FROM points WHERE run_id = ? ORDER BY id", (run_id,)).fetchall()
        out = []
        for r in rows:
            try:
                out.append(Point(run_id=r["run_id"], key=r["key"], status=r["status"],
                                 measurement=_object(r["measurement"]),
                                 estimate=None if r["estimate"] is None else _object(r["estimate"]), created=r["created"]))
            except ValueError as exc:
                self.unreadable.append((f"run {r['run_id']} point {r['key']}", str(exc)))
        return out

    def iter_export(self) -> Iterator[dict[str, Any]]:
        """Each run as a plain dict with its points under 'points' (what `export_json` writes)."""
        for run in self.runs():
            d = run.to_dict()
            d["points"] = [p.to_dict() for p in self.points(run.id)]
            yield d

    def export_json(self, path: str | os.PathLike[str]) -> Path:
        """Write the whole store as one JSON document; atomic (temp file + rename)."""
        out = Path(path)
        doc = {"schema_version": SCHEMA_VERSION, "source": os.fspath(self.path), "runs": list(self.iter_export())}
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, out)
        return out
