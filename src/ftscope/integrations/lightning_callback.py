"""`FtscopeLightningCallback`: FtscopeCallback's measurements for a Lightning `Trainer` whose LightningModule
trains a transformers model (held as the module itself or any submodule with an HF config).

    trainer = lightning.pytorch.Trainer(..., callbacks=[FtscopeLightningCallback()])

Lightning's settings are read under TrainingArguments' names (run_config.py maps those): accumulate_grad_batches,
precision (bf16-mixed / 16-mixed; *-true trains the weights in that dtype, which the dtypes say), the optimizer's
class, DeepSpeed's config and FSDP's sharding strategy. A step's batch is read from the batch Lightning hands the
hooks. Importing this module imports lightning (the `lightning` extra).
"""
from __future__ import annotations

import importlib.util
from typing import Any, Mapping

from ..errors import FtscopeError

if importlib.util.find_spec("lightning") is None:
    raise FtscopeError("FtscopeLightningCallback needs lightning: pip install 'ftscope[lightning]'")

from lightning.pytorch import Callback  # noqa: E402

from .model_facts import find_hf_model, run_config  # noqa: E402
from .recorder import RecordingCallback, guarded  # noqa: E402

OPTIMIZERS = {"adamw": "adamw_torch", "adam": "adamw_torch", "sgd": "sgd", "adamw8bit": "adamw_bnb_8bit",
              "pagedadamw8bit": "paged_adamw_8bit"}
"""Optimizer class names (lower case) -> the TrainingArguments `optim` value that means the same."""


def lightning_args(trainer: Any) -> dict[str, Any]:
    """A Lightning Trainer's settings as TrainingArguments keys."""
    precision = str(trainer.precision)
    keys: dict[str, Any] = {"gradient_accumulation_steps": int(trainer.accumulate_grad_batches),
                            "bf16": precision == "bf16-mixed", "fp16": precision in ("16-mixed", "16")}
    if trainer.optimizers:
        name = type(trainer.optimizers[0]).__name__.lower()
        if name not in OPTIMIZERS:
            raise FtscopeError(f"optimizer {type(trainer.optimizers[0]).__name__} is not modelled "
                               "(ftscope knows AdamW, 8-bit AdamW, paged 8-bit AdamW and SGD)")
        keys["optim"] = OPTIMIZERS[name]
    strategy = trainer.strategy
    kind = type(strategy).__name__
    if kind == "DeepSpeedStrategy":
        keys["deepspeed"] = dict(strategy.config)
    elif kind == "FSDPStrategy":
        sharding = str(getattr(strategy, "sharding_strategy", "FULL_SHARD")).rsplit(".", 1)[-1].lower()
        keys["fsdp"] = sharding
    elif kind not in ("SingleDeviceStrategy", "DDPStrategy"):
        raise FtscopeError(f"Lightning strategy {kind} is not modelled (single device, DDP, DeepSpeed or FSDP)")
    return keys


class FtscopeLightningCallback(RecordingCallback, Callback):
    """FtscopeCallback for Lightning: the same measurements, store and one warning (see trainer_callback.py).

    Options: RecordingCallback (the store goes in the Trainer's default_root_dir; `every` defaults to its
    log_every_n_steps)."""

    _open = False
    """A step window is open (its first micro-batch started, its optimizer step not yet done)."""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        gpu, note = self._new_recorder(str(pl_module.device), trainer.default_root_dir, "lightning",
                                       int(getattr(trainer, "log_every_n_steps", 1) or 1), bool(trainer.is_global_zero))
        model = find_hf_model(pl_module)
        try:
            if model is None:
                raise FtscopeError("the LightningModule holds no transformers model (no submodule with an HF config)")
            self.recorder.start(run_config(model, lightning_args(trainer), "hf-trainer", gpu), note or None)
        except FtscopeError as exc:
            self.recorder.start(None, str(exc))

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.recorder is None:
            return
        if not self._open:
            self._record = self.recorder.should_record(trainer.global_step + 1)
            seed = (pl_module, *trainer.optimizers)
            self.recorder = guarded(self.recorder, self.recorder.begin_step, seed, self._record)
            self._open = True
        if self.recorder is not None and isinstance(batch, Mapping):
            self.recorder.add_micro_batch(batch)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.recorder is None or not self._open:
            return
        last = batch_idx + 1 == trainer.num_training_batches
        if (batch_idx + 1) % int(trainer.accumulate_grad_batches) and not last:
            return  # gradients still accumulating: the optimizer step has not run
        self._open = False
        self.recorder = guarded(self.recorder, self.recorder.end_step, trainer.global_step, self._record)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.recorder is not None:
            self.recorder.finish()


__all__ = ["FtscopeLightningCallback", "lightning_args"]
