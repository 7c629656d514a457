"""FtscopeCallback in a real transformers Trainer on CPU: the steps it records, the store `validate --db` reads."""
from __future__ import annotations

import json
import logging
import types

import pytest

from ftscope.integrations.trainer_callback import record_every, training_args_keys
from ftscope.measure.store import Store
from ftscope.validate.store_cases import store_checks

from .conftest import padded_samples

transformers = pytest.importorskip("transformers")


def test_records_at_the_trainers_logging_interval():
    args = types.SimpleNamespace(logging_steps=10, logging_strategy="steps")
    assert record_every(args, 1000) == 10
    assert record_every(types.SimpleNamespace(logging_steps=0.05, logging_strategy="steps"), 1000) == 50
    assert record_every(types.SimpleNamespace(logging_steps=10, logging_strategy="epoch"), 1000) == 1


def test_the_resolved_deepspeed_config_replaces_its_file_name():
    args = types.SimpleNamespace(to_dict=lambda: {"deepspeed": "ds.json", "bf16": True},
                                 hf_deepspeed_config=types.SimpleNamespace(config={"zero_optimization": {"stage": 3}}))
    assert training_args_keys(args) == {"deepspeed": {"zero_optimization": {"stage": 3}}, "bf16": True}


@pytest.mark.slow
def test_a_real_trainer_run_is_measured_estimated_stored_and_validated(tiny_lora, tmp_path, caplog):
    from ftscope.cli import app
    from ftscope.integrations import FtscopeCallback
    from typer.testing import CliRunner

    samples = padded_samples(16, 32)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=4, per_device_train_batch_size=2,
        gradient_accumulation_steps=2, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
        data_seed=0, seed=0)
    callback = FtscopeCallback(warmup_steps=0)  # every step recorded: the 4 steps are the 16 samples' one epoch
    trainer = transformers.Trainer(model=tiny_lora, args=args, train_dataset=samples, callbacks=[callback])
    with caplog.at_level(logging.WARNING, logger="ftscope.integrations"):
        trainer.train()

    # every step is recorded, each with its own shape and the real (unpadded) tokens of its batches
    assert [r.step for r in callback.records] == [1, 2, 3, 4]
    for r in callback.records:
        m = r.measurement
        assert (m["batch"], m["seq_len"], m["micro_batches"], m["uniform_shape"]) == (2, 32, 2, True)
        assert 4 * 16 <= m["tokens"] <= m["padded_tokens"] == 2 * 2 * 32
        assert m["memory"]["method"] == "dispatch-tracker" and m["memory"]["peak_allocated_bytes"] > 0
        assert m["step_s"] > 0 and m["tokens_per_s"] == pytest.approx(m["tokens"] / m["step_s"])
        assert r.estimate is not None and [d.metric for d in r.deviations] == ["peak_gib:allocated"]
    assert sum(r.measurement["tokens"] for r in callback.records) == sum(int(s["attention_mask"].sum()) for s in samples)

    # one warning at most, and exactly when a step went past the published error
    warned = [rec for rec in caplog.records if rec.name == "ftscope.integrations"]
    assert len(warned) == int(any(d.exceeds for r in callback.records for d in r.deviations))

    db = tmp_path / "out" / "ftscope-runs.sqlite"
    assert callback.store_path == str(db)
    with Store(db, readonly=True) as store:
        (run,) = store.runs()
        assert run.status == "done" and run.scenario["options"]["source"] == "trainer"
        mix, wl = run.scenario["scenario"]["mix"], run.scenario["scenario"]["workload"]
        assert (mix["method"], mix["lora_rank"], mix["lora_targets"], mix["precision"]) == ("lora", 4, ["q_proj", "v_proj"], "fp32")
        assert (wl["micro_batch_size"], wl["seq_len"], wl["gradient_accumulation"]) == (2, 32, 2)
        assert [p.key for p in store.points(run.id)] == [f"batch=2/step={n}" for n in (1, 2, 3, 4)]

    # validate re-estimates each point from the stored config as built, and gets the callback's own comparison
    checks, skipped = store_checks(db)
    assert skipped == [] and [c.metric for c in checks] == ["peak_gib:allocated"] * 4
    for check, rec in zip(checks, callback.records):
        assert check.group == "trainer-cpu" and check.measured == rec.measurement["memory"]["peak_allocated_bytes"] / 2**30
        assert check.predict() / check.measured - 1 == pytest.approx(rec.deviations[0].error, abs=1e-12)
    out = CliRunner().invoke(app, ["validate", "--db", str(db), "--json"])
    assert out.exit_code == 0, out.output
    mine = [r for r in json.loads(out.output)["results"] if r["case"] == "db:ftscope-runs.sqlite:run1"]
    assert len(mine) == 4 and all(r["group"] == "trainer-cpu" for r in mine)
