"""store_file.py: stores are identified before use, readers never write, and a run is claimed by one process."""
from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ftscope import FtscopeError
from ftscope.cli import main
from ftscope.measure.store import SCHEMA_VERSION, Store

SCN = {"model": "tiny", "mix": {"method": "lora"}}
TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny-mixtral.yaml"
ENV = {"device": "cpu"}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_cli(*argv: str) -> int:
    saved = sys.argv
    sys.argv = ["ftscope", *argv]
    try:
        main()
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        sys.argv = saved
    return 0


@pytest.fixture
def foreign(tmp_path: Path) -> Path:
    path = tmp_path / "app.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("INSERT INTO users (name) VALUES ('ada')")
    return path


def test_someone_elses_database_is_refused_by_every_verb_and_left_untouched(foreign, tmp_path, capsys):
    before = digest(foreign)
    for argv in (["validate", "--db", str(foreign)], ["calibrate", "--db", str(foreign)],
                 ["report", "--db", str(foreign), "--no-cases", "--out", str(tmp_path / "r.html")],
                 ["profile", str(TINY), "--device", "cpu", "--db", str(foreign)]):  # refused before any model is built
        assert run_cli(*argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not an ftscope store (its tables: users)" in err, err
    with pytest.raises(FtscopeError, match="its tables: users"):
        Store(foreign)  # the writer refuses too, before switching anything
    assert digest(foreign) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.sqlite"]  # no -wal, -shm or report left behind
    assert sqlite3.connect(foreign).execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_readers_open_a_store_read_only(tmp_path):
    path = tmp_path / "runs.sqlite"
    with Store(path) as st:
        run = st.start_run(SCN, ENV)
        st.record_point(run, "batch=1", "ok", {"batch": 1})
        st.finish_run(run)
    before = digest(path)
    with Store(path, readonly=True) as st:
        assert [r.id for r in st.runs()] == [run]
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            st._db.execute("CREATE TABLE extra (x)")
    assert run_cli("validate", "--db", str(path), "--json") == 0
    assert digest(path) == before


@pytest.mark.parametrize("content, match", [
    (b"", "an empty file"), (b"hello, not a database\n", "a text file, not an SQLite database"),
    (b"SQLite format 3\x00" + bytes(84) + b"\xff" * 4000, "damaged|malformed|not a database"),
])
def test_what_is_not_a_store_is_named(tmp_path, content, match):
    path = tmp_path / "x.sqlite"
    path.write_bytes(content)
    with pytest.raises(FtscopeError, match=match):
        Store(path, readonly=True)


def test_a_newer_schema_is_refused_and_the_version_is_stored(tmp_path):
    path = tmp_path / "runs.sqlite"
    Store(path).close()
    version = sqlite3.connect(path).execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
    assert version == str(SCHEMA_VERSION)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    for readonly in (True, False):
        with pytest.raises(FtscopeError, match="newer ftscope"):
            Store(path, readonly=readonly)


def test_damaged_rows_are_listed_not_raised(tmp_path):
    path = tmp_path / "runs.sqlite"
    with Store(path) as st:
        run = st.start_run(SCN, ENV)
        st.record_point(run, "batch=1", "ok", {"batch": 1})
    with sqlite3.connect(path) as db:
        db.execute("UPDATE points SET measurement = '{\"batch\": ' WHERE key = 'batch=1'")
        db.execute("INSERT INTO runs (created, updated, scenario_hash, scenario, environment, status)"
                   " VALUES ('x', 'x', 'h', '[1]', '{}', 'done')")
    with Store(path, readonly=True) as st:
        assert [r.id for r in st.runs()] == [run] and st.points(run) == []
        assert st.unreadable == [("run 2", "holds a JSON list, not an object"),
                                 (f"run {run} point batch=1", "its JSON is damaged")]


HOLDER = textwrap.dedent(
    """
    import sys
    from ftscope.measure.store import Store
    st = Store(sys.argv[1])
    run = st.start_run({"model": "tiny"}, {"device": "cpu"}, sweep_id="s", resume=True)
    print(run, flush=True)
    sys.stdin.read()  # hold the run until the test closes stdin (or kills us)
    """
)


def test_a_run_is_claimed_by_one_process_and_freed_when_it_dies(tmp_path):
    db = tmp_path / "runs.sqlite"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    run = int(holder.stdout.readline())
    try:
        with Store(db) as st:
            with pytest.raises(FtscopeError, match=f"run {run} of .* is being measured by process {holder.pid}"):
                st.start_run({"model": "tiny"}, ENV, sweep_id="s", resume=True)
            other = st.start_run({"model": "tiny"}, ENV, sweep_id="s")  # without --resume: a run of its own
            assert other != run
    finally:
        holder.kill()
        holder.wait()
    with Store(db) as st:  # the kernel dropped the dead holder's lock: the run resumes
        assert st.start_run({"model": "tiny"}, ENV, sweep_id="s", resume=True) in (run, other)


def test_finishing_a_run_removes_its_lock_file(tmp_path):
    db = tmp_path / "runs.sqlite"
    with Store(db) as st:
        run = st.start_run(SCN, ENV)
        assert (tmp_path / f"runs.sqlite.run{run}.lock").exists()
        st.finish_run(run)
    assert not (tmp_path / f"runs.sqlite.run{run}.lock").exists()
