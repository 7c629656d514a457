"""profile: the issue's acceptance on the bundled tiny Mixtral, on CPU, with the real stack."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ftscope
from ftscope.measure.runtime.profile import profile

pytestmark = pytest.mark.slow  # every test here trains a real model

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "examples" / "tiny-mixtral.yaml"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def tiny_result(tmp_path_factory):
    db = tmp_path_factory.mktemp("db") / "runs.sqlite"
    return profile(ftscope.load_scenario(TINY), device="cpu", steps=2, warmup=1, batch_sizes=(1, 2, 4), db=str(db)), db


def test_every_batch_reports_memory_times_layers_and_experts(tiny_result):
    result, _ = tiny_result
    assert [p.batch for p in result.points] == [1, 2, 4]
    for p in result.points:
        assert p.status == "ok", p.error
        assert p.memory["peak_allocated_bytes"] > p.memory["start_allocated_bytes"] > 0
        parts = p.forward_s + p.backward_s + p.optimizer_s
        assert parts == pytest.approx(p.wall_step_s, rel=0.10)  # the three phases account for the step
        totals = p.layer_times["total_s"]
        assert totals["experts"] > 0 and totals["attention"] > 0
        assert sum(totals.values()) <= p.wall_step_s * 1.05
        assert p.tokens_per_s > 0 and p.samples_per_s > 0
        assert p.estimate is not None and p.estimate["memory"]["allocated_gib"] > 0


def test_expert_counts_sum_to_tokens_times_top_k_in_every_layer(tiny_result):
    result, _ = tiny_result
    for p in result.points:
        load = p.expert_load
        assert load["top_k"] == 2
        for row, tokens in zip(load["counts"], load["tokens"]):
            assert sum(row) == tokens * load["top_k"]
        assert all(r >= 1.0 for r in load["imbalance"]["max_over_mean"])


def test_memory_grows_with_batch_and_the_estimate_follows(tiny_result):
    result, _ = tiny_result
    measured = [p.memory["peak_allocated_bytes"] for p in result.points]
    predicted = [p.estimate["memory"]["allocated_gib"] for p in result.points]
    assert measured == sorted(measured) and predicted == sorted(predicted)
    # activation growth per extra sample: measured and estimated agree in size (same order, within 2x)
    dm = (measured[-1] - measured[0]) / 3
    dp = (predicted[-1] - predicted[0]) * 2**30 / 3
    assert 0.5 < dp / dm < 2.0


def test_hooks_in_steps_of_their_own_leave_the_timed_steps_bare(tiny_result):
    """The CUDA layout (the layer timer synchronizes, so it gets its own steps), run on CPU."""
    scn = ftscope.load_scenario(TINY, ["workload.padding=max_length"])
    r = profile(scn, device="cpu", steps=3, warmup=0, batch_sizes=(2,), db=None, separate_hooked_steps=True)
    p = r.points[0]
    assert p.status == "ok", p.error
    assert p.hooked_step_s > 0 and p.step_s > 0
    assert p.layer_times["total_s"]["experts"] > 0
    load = p.expert_load  # counted over the two hooked steps only
    assert all(sum(row) == tokens * load["top_k"] for row, tokens in zip(load["counts"], load["tokens"]))
    assert load["tokens"] == [2 * 2 * scn.workload.seq_len] * len(load["tokens"])  # 2 hooked steps, not the 3 timed
    assert next(q for q in tiny_result[0].points if q.batch == 2).hooked_step_s is None


def test_points_and_environment_are_stored(tiny_result):
    result, db = tiny_result
    con = sqlite3.connect(db)
    keys = [k for (k,) in con.execute("select key from points where run_id = ? order by key", (result.run_id,))]
    assert keys == ["batch=1", "batch=2", "batch=4"]
    env = json.loads(con.execute("select environment from runs where id = ?", (result.run_id,)).fetchone()[0])
    assert "torch" in json.dumps(env)


def test_find_max_batch_under_a_cap_matches_brute_force(tmp_path):
    from ftscope.measure.runtime.build import build_model
    from ftscope.measure.runtime.batches import LengthSampler, tensors
    from ftscope.measure.runtime.meters import MemoryMeter, is_oom
    from ftscope.measure.runtime.loop import Stepper, make_optimizer

    scn = ftscope.load_scenario(TINY)
    cap_gib = 0.026
    result = profile(scn, device="cpu", find_max_batch=True, memory_cap_gib=cap_gib, db=str(tmp_path / "r.sqlite"),
                     max_batch_cap=16)
    found = result.max_batch
    assert any(t["status"] == "oom" for t in found["tries"])  # it survived OOMs and recorded them
    # brute force with a fresh model: every batch from 1 up, one capped step each
    model, info = build_model(scn, device="cpu")
    opt = make_optimizer(model, scn)
    step = Stepper(model, opt, "cpu", info.autocast_dtype)
    sampler = LengthSampler(scn)
    fits = []
    for b in range(1, found["max_batch"] + 3):
        try:
            with MemoryMeter("cpu", seed=(model, opt), cap_bytes=int(cap_gib * 2**30)):
                step(tensors(sampler.worst(b), info.config["vocab_size"], "cpu"))
            fits.append(b)
        except Exception as exc:  # noqa: BLE001
            assert is_oom(exc)
            opt.zero_grad(set_to_none=True)
    brute = max(fits) if fits else 0
    assert found["max_batch"] == brute
    con = sqlite3.connect(tmp_path / "r.sqlite")
    statuses = dict(con.execute("select key, status from points where key like 'maxbatch:try=%'"))
    assert "oom" in statuses.values()


def test_sigkill_midway_then_resume_runs_every_point_exactly_once(tmp_path):
    db = tmp_path / "sweep.sqlite"
    cmd = [str(BIN / "ftscope"), "profile", str(TINY), "--device", "cpu", "--steps", "1", "--warmup", "0",
           "--batch-sizes", "1,2,3,4,5,6", "--db", str(db), "--json", "--no-hooks"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    done = 0
    while time.time() < deadline and proc.poll() is None:
        if db.exists():
            try:
                done = sqlite3.connect(db).execute("select count(*) from points").fetchone()[0]
            except sqlite3.OperationalError:
                done = 0
            if done >= 2:
                break
        time.sleep(0.05)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = sqlite3.connect(db).execute("select count(*) from points").fetchone()[0]
    assert 1 <= first < 6, "the kill must land mid-sweep"
    rerun = subprocess.run(cmd + ["--resume"], capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    out = json.loads(rerun.stdout)
    assert len(out["skipped"]) == first
    rows = sqlite3.connect(db).execute("select key, count(*) from points group by key").fetchall()
    assert sorted(k for k, _ in rows) == [f"batch={b}" for b in range(1, 7)]
    assert all(n == 1 for _, n in rows)


def test_profile_runs_from_local_weights(checkpoint, tmp_path):
    folder, _ = checkpoint
    scn = ftscope.load_scenario({"model": str(folder / "config.json"), "mix": {"method": "lora", "lora_rank": 4,
                                 "precision": "bf16"}, "workload": {"micro_batch_size": 1, "seq_len": 16}})
    r = profile(scn, device="cpu", steps=1, warmup=0, batch_sizes=(1, 2), weights=str(folder),
                db=str(tmp_path / "w.sqlite"))
    assert [p.status for p in r.points] == ["ok", "ok"]
    assert any("weights loaded from" in n for n in r.build["notes"])
    with sqlite3.connect(tmp_path / "w.sqlite") as con:
        (opts,) = con.execute("select scenario from runs").fetchone()
    assert json.loads(opts)["options"]["weights"] == str(folder)



@pytest.mark.slow
def test_a_sweep_where_every_batch_runs_out_of_memory_is_stored_as_oom(tmp_path):
    db = tmp_path / "r.sqlite"
    scn = ftscope.load_scenario(TINY)
    sweep = profile(scn, device="cpu", steps=1, warmup=0, batch_sizes=(1, 2), memory_cap_gib=1e-4, db=str(db))
    assert [p.status for p in sweep.points] == ["oom", "oom"]
    search = profile(scn, device="cpu", find_max_batch=True, memory_cap_gib=1e-4, max_batch_cap=4, db=str(db))
    assert search.max_batch["max_batch"] == 0
    statuses = dict(sqlite3.connect(db).execute("select key, status from points where run_id = ?", (search.run_id,)))
    assert statuses == {"maxbatch:try=1": "oom", "maxbatch": "oom"}  # no 'ok' for a search that found nothing


@pytest.mark.slow
def test_a_killed_max_batch_search_resumes_from_its_recorded_tries(tmp_path):
    db = tmp_path / "r.sqlite"
    scn = ftscope.load_scenario(TINY)
    kw = dict(device="cpu", find_max_batch=True, memory_cap_gib=0.026, max_batch_cap=16, db=str(db))
    whole = profile(scn, **kw)
    tries = whole.max_batch["tries"]
    assert len(tries) >= 3
    con = sqlite3.connect(db)
    created = dict(con.execute("select key, created from points"))
    kept = [f"maxbatch:try={t['batch']}" for t in tries[:2]]
    with con:  # as if killed after two tries: the later tries and the result never reached the store
        con.execute(f"delete from points where key not in ({','.join('?' * len(kept))})", kept)
        con.execute("update runs set status = 'running'")
    resumed = profile(scn, resume=True, **kw)
    assert resumed.run_id == whole.run_id and resumed.max_batch["max_batch"] == whole.max_batch["max_batch"]
    after = dict(con.execute("select key, created from points"))
    assert set(after) == set(created)
    assert all(after[k] == created[k] for k in kept)  # the recorded tries were not run again
