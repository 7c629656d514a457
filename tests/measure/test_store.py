"""The SQLite results store (measure/store.py): runs, points, resume, durability under SIGKILL, export."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ftscope.measure.store import Store, scenario_hash

SCN = {"model": "mixtral-8x7b", "mix": {"method": "lora"}, "workload": {"micro_batch_size": 2, "seq_len": 128}}
ENV = {"device": "cpu", "device_name": "test cpu", "versions": {"torch": "x"}}


def test_run_lifecycle_points_and_export(tmp_path: Path) -> None:
    with Store(tmp_path / "r.sqlite") as st:
        rid = st.start_run(SCN, ENV)
        st.record_point(rid, "batch=1", "ok", {"peak_gib": 1.5, "nan": float("nan")}, {"peak_gib": 1.4})
        st.record_point(rid, "batch=2", "oom", {"error": "Simulated out of memory"})
        st.record_point(rid, "batch=4", "error", {"error": "boom"})
        assert st.done_keys(rid) == {"batch=1", "batch=2"}  # errors are retried on resume
        assert st.done_keys(rid, statuses=("ok", "oom", "error")) == {"batch=1", "batch=2", "batch=4"}
        st.record_point(rid, "batch=4", "ok", {"peak_gib": 3.0})  # the retry replaces, never duplicates
        pts = st.points(rid)
        assert [p.key for p in pts] == ["batch=1", "batch=2", "batch=4"]
        assert pts[0].measurement == {"peak_gib": 1.5, "nan": None}  # strict JSON: NaN stored as null
        assert pts[0].estimate == {"peak_gib": 1.4} and pts[1].estimate is None
        assert pts[2].status == "ok"
        st.finish_run(rid, "done")
        (run,) = st.runs()
        assert run.status == "done" and run.scenario == SCN and run.environment == ENV and run.resumes == 0
        out = st.export_json(tmp_path / "export.json")
    doc = json.loads(out.read_text())
    assert doc["runs"][0]["points"][2]["measurement"] == {"peak_gib": 3.0}
    assert doc["runs"][0]["scenario"] == SCN


def test_bad_status_is_refused_and_leaves_no_row(tmp_path: Path) -> None:
    with Store(tmp_path / "r.sqlite") as st:
        rid = st.start_run(SCN, ENV)
        with pytest.raises(ValueError):
            st.record_point(rid, "batch=1", "maybe", {})
        with pytest.raises(ValueError):
            st.finish_run(rid, "paused")
        with pytest.raises(KeyError):
            st.finish_run(rid + 99, "done")
        assert st.points(rid) == []


def test_resume_matches_sweep_id_or_scenario(tmp_path: Path) -> None:
    with Store(tmp_path / "r.sqlite") as st:
        a = st.start_run(SCN, ENV, sweep_id="sweep-a")
        st.finish_run(a, "failed", error="KeyboardInterrupt")
        assert st.start_run(SCN, ENV, sweep_id="sweep-a", resume=True) == a  # failed runs resume too
        assert st.start_run(SCN, ENV, sweep_id="sweep-b", resume=True) != a  # other sweep: new run
        # No sweep id: the scenario is the identity, whatever its key order.
        c = st.start_run({"workload": SCN["workload"], "mix": SCN["mix"], "model": SCN["model"]}, ENV)
        assert st.start_run(SCN, ENV, resume=True) == c
        st.finish_run(c, "done")
        assert st.start_run(SCN, ENV, resume=True) != c  # a finished run is never reopened
        runs = {r.id: r for r in st.runs()}
        assert runs[a].resumes == 1 and runs[a].status == "running" and runs[a].error is None
    assert scenario_hash({"a": 1, "b": [1, 2]}) == scenario_hash({"b": [1, 2], "a": 1})


def test_wal_and_full_sync(tmp_path: Path) -> None:
    with Store(tmp_path / "r.sqlite") as st:
        assert st._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert st._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_import_does_not_import_torch() -> None:
    code = "import sys, ftscope.measure.store, ftscope.measure.runtime.max_batch; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


SWEEP = textwrap.dedent(
    """
    import sys, time
    from ftscope.measure.store import Store
    db, n, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    st = Store(db)
    rid = st.start_run({"model": "tiny"}, {"device": "cpu"}, sweep_id="kill-test", resume=True)
    done = st.done_keys(rid)
    for i in range(n):
        key = f"batch={i}"
        if key in done:
            continue
        time.sleep(pause)  # the 'measurement'
        st.record_point(rid, key, "ok", {"i": i, "pad": "x" * 2000})
        print(key, flush=True)
    st.finish_run(rid, "done")
    print("finished", rid, flush=True)
    """
)


def test_sigkill_midway_then_resume_completes_every_point_once(tmp_path: Path) -> None:
    db, n = tmp_path / "sweep.sqlite", 30
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", SWEEP, str(db), str(n), "0.02"], stdout=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout is not None
    first = []
    while len(first) < 8:  # readline blocks until the writer prints; it ends (returns '') if the writer exits
        line = proc.stdout.readline()
        if not line:
            break
        first.append(line.split()[0])
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert len(first) == 8

    # A reader opening the killed writer's files sees a consistent store: committed points, run still open.
    with Store(db) as st:
        (run,) = st.runs()
        assert run.status == "running"
        keys = [p.key for p in st.points(run.id)]
        assert set(first) <= set(keys) and len(keys) < n
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    second = subprocess.run([sys.executable, "-c", SWEEP, str(db), str(n), "0"], capture_output=True, text=True,
                            env=env, check=True)
    redone = [ln.split()[0] for ln in second.stdout.splitlines() if ln.startswith("batch=")]
    assert not set(redone) & set(keys)  # finished points were not repeated
    with Store(db) as st:
        (run,) = st.runs()
        assert run.status == "done" and run.resumes == 1
        got = [p.key for p in st.points(run.id)]
    assert sorted(got) == sorted(f"batch={i}" for i in range(n))  # every point, exactly once
    assert len(got) == len(set(got)) == n


def test_environment_describes_the_stack() -> None:
    from ftscope.measure.runtime.environment import environment

    env = environment("cpu")
    assert env["device"] == "cpu" and env["device_name"] and env["host"] and env["python"]
    assert set(env["versions"]) >= {"torch", "transformers", "peft", "bitsandbytes", "deepspeed"}
    try:
        import torch
    except ImportError:
        return
    assert env["versions"]["torch"] == torch.__version__
