"""profile_distributed: real torchrun launches at world size 2 on CPU (gloo) with DeepSpeed ZeRO, FSDP2 and DDP.

Each launch starts two Python processes that import torch, transformers (and deepspeed), so one test takes
30-60 s on 2 cores; the first DeepSpeed launch in a fresh checkout also JIT-compiles DeepSpeed's CPU comm op
into <project>/.cache/torch_extensions (`python -m ftscope.measure.distributed.torchrun --prebuild` does it ahead).
"""
from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

import ftscope
from ftscope.errors import FtscopeError
from ftscope.measure.distributed.launcher import DistributedResult, profile_distributed
from ftscope.measure.distributed.engines import engine_name
from ftscope.measure.distributed.rank_metrics import COLLECTIVE_PATTERN

ROOT = Path(__file__).resolve().parents[3]
TINY_MOE = ROOT / "examples" / "tiny-mixtral.yaml"
SHRINK = {"layers": 2, "hidden": 128, "vocab": 512}
FAILURES = Path(__file__).with_name("failures.py")
DS_TIMEOUT = 420  # a fresh checkout compiles DeepSpeed's CPU comm op first (minutes on 2 busy cores)


def dense(**mix) -> ftscope.Scenario:
    """Full fine-tuning of llama-3.2-1b's config (shrunk by SHRINK), bf16 mixed precision as people train."""
    return ftscope.load_scenario({"model": "llama-3.2-1b", "hardware": {"gpu": "a100-80gb"},
                                  "mix": {"method": "full", "precision": "bf16-mixed", "attention": "sdpa", **mix},
                                  "workload": {"micro_batch_size": 1, "seq_len": 64}})


def stored(db: Path, run_id: int) -> tuple[tuple, list[tuple]]:
    con = sqlite3.connect(db)
    run = con.execute("SELECT status, error, scenario FROM runs WHERE id = ?", (run_id,)).fetchone()
    points = con.execute("SELECT key, status, measurement, estimate FROM points WHERE run_id = ? ORDER BY key",
                         (run_id,)).fetchall()
    con.close()
    return run, points


def check_ranks(res: DistributedResult, db: Path, batches: tuple[int, ...]) -> None:
    assert res.status == "done", (res.error, res.log_tail[-20:])
    assert res.world_size == 2 and res.backend == "gloo"
    assert [(p.batch, p.rank) for p in res.points] == [(b, r) for b in batches for r in (0, 1)]
    for p in res.points:
        assert p.status == "ok"
        m = p.memory
        assert m["method"] == "dispatch-tracker" and m["peak_allocated_bytes"] > m["start_allocated_bytes"] > 0
        assert set(m["phase_peak_bytes"]) == {"forward", "backward", "optimizer"}
        assert p.forward_s > 0 and p.backward_s > 0 and p.optimizer_s > 0
        c = p.collectives
        assert c["pattern"] == COLLECTIVE_PATTERN and c["events"]
        assert 0 < c["collective_s"] <= c["profiled_step_s"]
    run, points = stored(db, res.run_id)
    assert run[0] == "done" and run[1] is None
    assert json.loads(run[2])["scenario"]["hardware"]["gpus_per_node"] == 2
    assert [k for k, *_ in points] == sorted(f"batch={b}:rank={r}" for b in batches for r in (0, 1))
    for _key, status, measurement, estimate in points:
        assert status == "ok"
        est = json.loads(estimate)
        assert est["memory"]["allocated_bytes"] > 0 and est["memory"]["per_rank_of"] == 2
        assert json.loads(measurement)["engine"] == res.engine


@pytest.mark.slow
def test_zero2_on_the_tiny_moe_example_stores_per_rank_rows_and_emits_its_config(tmp_path):
    scn = ftscope.load_scenario(TINY_MOE)
    db = tmp_path / "runs.sqlite"
    res = profile_distributed(scn.with_(zero_stage=2), nproc=2, device="cpu", steps=1, warmup=1, batch_sizes=(1,),
                              db=str(db), emit_dir=tmp_path / "emit", timeout_s=DS_TIMEOUT)
    assert res.engine == "deepspeed-zero2"
    check_ranks(res, db, (1,))
    ds = json.loads((tmp_path / "emit" / "ds_config.json").read_text())
    assert ds == res.ds_config and ds["zero_optimization"]["stage"] == 2 and ds["zero_allow_untested_optimizer"]
    acc = (tmp_path / "emit" / "accelerate.yaml").read_text()
    assert "DEEPSPEED" in acc and "num_processes: 2" in acc
    # ZeRO-2 partitions the optimizer state: each rank holds about half of the AdamW moments of the adapters
    assert all(p.static_bytes["optimizer"] > 0 for p in res.points)


@pytest.mark.slow
def test_fsdp2_runs_to_completion_and_stores_per_rank_rows(tmp_path):
    db = tmp_path / "runs.sqlite"
    res = profile_distributed(dense(fsdp="full_shard"), nproc=2, device="cpu", steps=1, warmup=1, batch_sizes=(1, 2),
                              shrink=SHRINK, db=str(db), timeout_s=240)
    assert res.engine == "fsdp2"
    check_ranks(res, db, (1, 2))
    # the ranks hold half of the fp32 parameters each (DTensor shards, counted by their local tensor)
    full = res.build["total_params"] * 4
    for p in res.points:
        assert p.static_bytes["weights"] == pytest.approx(full / 2, rel=0.05)
    assert any("reduce_scatter" in n or "all_gather" in n for n in res.points[0].collectives["events"])


@pytest.mark.slow
def test_per_rank_memory_ordering_zero3_below_ddp_as_estimated(tmp_path):
    """Full fine-tuning: ZeRO-3 shards weights, gradients and optimizer state, DDP replicates them all."""
    peaks, estimates = {}, {}
    for mix in ({}, {"zero_stage": 3}):
        res = profile_distributed(dense(**mix), nproc=2, device="cpu", steps=1, warmup=1, batch_sizes=(1,),
                                  shrink=SHRINK, db=None, timeout_s=DS_TIMEOUT)
        assert res.status == "done", (res.error, res.log_tail[-20:])
        peaks[res.engine] = max(p.memory["peak_allocated_bytes"] for p in res.points)
        estimates[res.engine] = res.estimates[1]["memory"]["allocated_bytes"]
    assert peaks["deepspeed-zero3"] < 0.8 * peaks["ddp"]
    assert estimates["deepspeed-zero3"] < estimates["ddp"]


@pytest.mark.slow
def test_a_rank_that_raises_mid_run_fails_the_run_with_its_error(tmp_path):
    db = tmp_path / "runs.sqlite"
    t = time.perf_counter()
    res = profile_distributed(dense(), nproc=2, device="cpu", steps=2, warmup=1, batch_sizes=(1,), shrink=SHRINK,
                              db=str(db), timeout_s=240, step_hook=f"{FAILURES}:raise_on_rank_1")
    assert time.perf_counter() - t < 240
    assert res.status == "failed" and res.returncode not in (0, None)
    assert res.error.startswith("rank 1: RuntimeError: injected failure on rank 1 after 1 steps")
    bad = {p.rank: p for p in res.points if p.status == "error"}
    assert "injected failure" in bad[1].error  # rank 0 may fail too, on the collective rank 1 left
    run, points = stored(db, res.run_id)
    assert run[0] == "failed" and "injected failure" in run[1]
    assert ("batch=1:rank=1", "error") in [(k, s) for k, s, *_ in points]


@pytest.mark.slow
def test_a_hung_rank_is_ended_by_the_collective_timeout_not_waited_for(tmp_path):
    t = time.perf_counter()
    res = profile_distributed(dense(), nproc=2, device="cpu", steps=2, warmup=1, batch_sizes=(1,), shrink=SHRINK,
                              db=None, timeout_s=240, collective_timeout_s=10,
                              step_hook=f"{FAILURES}:hang_on_rank_1")
    assert time.perf_counter() - t < 200
    assert res.status == "failed", res.log_tail[-20:]
    assert res.error.startswith("rank 0: "), res.error  # rank 0 gave up waiting for rank 1 in a collective


def test_arguments_are_checked_before_anything_starts():
    scn = dense()
    with pytest.raises(FtscopeError, match="nproc"):
        profile_distributed(scn, nproc=0, device="cpu")
    with pytest.raises(FtscopeError, match="node-rank"):
        profile_distributed(scn, nproc=2, nnodes=2, node_rank=2, device="cpu")
    with pytest.raises(FtscopeError, match="batch-sizes"):
        profile_distributed(scn, nproc=2, device="cpu", batch_sizes=(0,))


def test_the_mix_chooses_the_engine():
    assert engine_name(dense().mix) == "ddp"
    assert engine_name(dense(zero_stage=1).mix) == "deepspeed-zero1"
    assert engine_name(dense(zero_stage=3, offload="optimizer").mix) == "deepspeed-zero3"
    assert engine_name(dense(fsdp="shard_grad_op").mix) == "fsdp2"
