"""FtscopeLightningCallback in a real Lightning Trainer on CPU, training a tiny transformers model."""
from __future__ import annotations

import types

import pytest

from ftscope.validate.store_cases import store_checks

from .conftest import padded_samples

pl = pytest.importorskip("lightning.pytorch")
torch = pytest.importorskip("torch")


def _trainer(**changes):
    from lightning.pytorch.strategies import SingleDeviceStrategy

    base = dict(precision="32-true", accumulate_grad_batches=1, optimizers=[torch.optim.AdamW([torch.zeros(1)])],
                strategy=SingleDeviceStrategy("cpu"))
    return types.SimpleNamespace(**{**base, **changes})


def test_lightning_settings_read_as_training_arguments():
    from ftscope.errors import FtscopeError
    from ftscope.integrations.lightning_callback import lightning_args

    keys = lightning_args(_trainer(precision="bf16-mixed", accumulate_grad_batches=4))
    assert keys == {"gradient_accumulation_steps": 4, "bf16": True, "fp16": False, "optim": "adamw_torch"}
    assert lightning_args(_trainer(optimizers=[torch.optim.SGD([torch.zeros(1)], lr=0.1)]))["optim"] == "sgd"
    with pytest.raises(FtscopeError, match="optimizer Adagrad is not modelled"):
        lightning_args(_trainer(optimizers=[torch.optim.Adagrad([torch.zeros(1)])]))
    from lightning.pytorch.strategies import FSDPStrategy

    assert lightning_args(_trainer(strategy=FSDPStrategy(sharding_strategy="SHARD_GRAD_OP")))["fsdp"] == "shard_grad_op"
    with pytest.raises(FtscopeError, match="Lightning strategy SimpleNamespace is not modelled"):
        lightning_args(_trainer(strategy=types.SimpleNamespace()))


class _Module(pl.LightningModule):
    """A LightningModule holding a transformers model, as people write one."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def training_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=1e-4)


@pytest.mark.slow
def test_a_real_lightning_run_is_measured_stored_and_validated(tiny_lora, tmp_path):
    from ftscope.integrations import FtscopeLightningCallback

    samples = padded_samples(12, 24, seed=1)
    loader = torch.utils.data.DataLoader(samples, batch_size=2, shuffle=False)
    callback = FtscopeLightningCallback(warmup_steps=1, every=1)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=3, accumulate_grad_batches=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(tmp_path), callbacks=[callback])
    trainer.fit(_Module(tiny_lora), loader)

    # step 1 warms up; steps 2 and 3 are recorded, their tokens those of the batches Lightning handed over
    assert [r.step for r in callback.records] == [2, 3]
    for n, r in zip((2, 3), callback.records):
        m = r.measurement
        assert (m["batch"], m["seq_len"], m["micro_batches"]) == (2, 24, 2)
        assert m["tokens"] == sum(int(s["attention_mask"].sum()) for s in samples[(n - 1) * 4:n * 4])
        assert m["memory"]["peak_allocated_bytes"] > 0 and r.estimate is not None
    checks, skipped = store_checks(tmp_path / "ftscope-runs.sqlite")
    assert skipped == [] and [(c.group, c.metric) for c in checks] == [("lightning-cpu", "peak_gib:allocated")] * 2
    scn = checks[0].scenario
    assert (scn.mix.method, scn.mix.lora_rank, scn.mix.precision, scn.workload.gradient_accumulation) == ("lora", 4, "fp32", 2)
    for check, rec in zip(checks, callback.records):
        assert check.predict() / check.measured - 1 == pytest.approx(rec.deviations[0].error, abs=1e-12)
