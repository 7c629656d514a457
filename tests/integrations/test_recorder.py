"""The step window both callbacks share: what it records, when it warns, what it stores, and that an error in it
stops the measuring, never the run."""
from __future__ import annotations

import logging

import pytest

from ftscope.integrations.recorder import RunRecorder, batch_inputs, guarded, resolve_store
from ftscope.integrations.run_config import RunConfig
from ftscope.measure.store import Store

torch = pytest.importorskip("torch")


def _batch(rows: int, length: int, real: int) -> dict:
    mask = torch.zeros(rows, length, dtype=torch.long)
    mask[:, :real] = 1
    return {"input_ids": torch.zeros(rows, length, dtype=torch.long), "attention_mask": mask}


def _run(tiny_config) -> RunConfig:
    return RunConfig(model_config=tiny_config, model_name="tiny", training_args={}, trainable_dtype="float32")


def test_steps_after_warm_up_are_recorded_at_the_interval():
    rec = RunRecorder("cpu", None, "trainer", every=5, warmup_steps=2)
    assert [s for s in range(1, 16) if rec.should_record(s)] == [3, 5, 10, 15]


def test_a_step_is_measured_stored_and_warned_about_once(tiny_config, tmp_path, caplog):
    db = resolve_store("auto", str(tmp_path / "out"))
    rec = RunRecorder("cpu", db, "trainer", every=1, warmup_steps=1)
    rec.start(_run(tiny_config))
    kept = []
    with caplog.at_level(logging.WARNING, logger="ftscope.integrations"):
        for step in (1, 2, 3):
            rec.begin_step((), rec.should_record(step))
            for _ in range(2):
                rec.add_micro_batch(_batch(2, 16, real=12))
            kept.append(torch.ones(2**20))  # 4 MiB the tiny model's estimate knows nothing about
            rec.end_step(step, rec.should_record(step))
    rec.finish()
    assert [r.step for r in rec.records] == [2, 3]
    m = rec.records[0].measurement
    assert (m["batch"], m["seq_len"], m["micro_batches"], m["tokens"], m["padded_tokens"]) == (2, 16, 2, 48, 64)
    assert m["memory"]["peak_allocated_bytes"] >= 4 * 2**20
    assert all(r.deviations[0].exceeds for r in rec.records)
    assert len([r for r in caplog.records if r.name == "ftscope.integrations"]) == 1  # once per run
    with Store(db, readonly=True) as store:
        (run,) = store.runs()
        assert run.status == "done" and [p.key for p in store.points()] == ["batch=2/step=2", "batch=2/step=3"]


def test_a_run_ftscope_cannot_express_is_still_recorded(tiny_config, tmp_path, caplog):
    rec = RunRecorder("cpu", str(tmp_path / "runs.sqlite"), "trainer", warmup_steps=0)
    with caplog.at_level(logging.WARNING, logger="ftscope.integrations"):
        rec.start(RunConfig(model_config=tiny_config, model_name="tiny", training_args={}, quantization="8bit"))
        rec.begin_step((), True)
        rec.add_micro_batch(_batch(1, 8, real=8))
        rec.end_step(1, True)
    rec.finish()
    assert rec.records[0].estimate is None and "8-bit" in rec.problem
    assert any("cannot estimate this run" in r.getMessage() for r in caplog.records)
    with Store(tmp_path / "runs.sqlite", readonly=True) as store:
        assert "8-bit" in store.runs()[0].scenario["problem"]


def test_an_error_while_measuring_stops_the_measuring_not_the_run(tmp_path, caplog):
    rec = RunRecorder("cpu", None, "trainer")

    def broken(*_):
        raise RuntimeError("boom")

    with caplog.at_level(logging.WARNING, logger="ftscope.integrations"):
        assert guarded(rec, broken) is None
    assert "stopped measuring this run: RuntimeError: boom" in caplog.text
    assert guarded(rec, lambda: None) is rec


def test_batches_are_read_from_ids_or_embeddings():
    assert batch_inputs({"labels": torch.zeros(2, 3)}) is None
    ids, mask = batch_inputs({"inputs_embeds": torch.zeros(2, 3, 4)})
    assert tuple(ids.shape[:2]) == (2, 3) and mask is None
