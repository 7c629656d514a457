"""`FtscopeCallback`: a transformers `TrainerCallback` that measures the user's own training run and checks
ftscope's estimate against it (recorder.py does the measuring; run_config.py reads the run's settings).

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[FtscopeCallback()])

Importing this module imports transformers (the `measure` extra); `ftscope.integrations` itself does not.
"""
from __future__ import annotations

import importlib.util
import math
from typing import Any

from ..errors import FtscopeError

if importlib.util.find_spec("transformers") is None:
    raise FtscopeError("FtscopeCallback needs transformers: pip install 'ftscope[measure]'")

from transformers import TrainerCallback  # noqa: E402

from .model_facts import run_config  # noqa: E402
from .recorder import RecordingCallback, guarded  # noqa: E402


def training_args_keys(args: Any) -> dict[str, Any]:
    """TrainingArguments as the keys ftscope's TrainingArguments reader takes, with the DeepSpeed config the
    Trainer resolved (a dict, 'auto' values filled) in place of its file name."""
    keys = args.to_dict()
    ds = getattr(getattr(args, "hf_deepspeed_config", None), "config", None)
    if keys.get("deepspeed") and isinstance(ds, dict):
        keys["deepspeed"] = ds
    return keys


def record_every(args: Any, max_steps: int) -> int:
    """The Trainer's logging interval in steps (a fraction of the run below 1, as TrainingArguments reads it)."""
    steps = float(getattr(args, "logging_steps", 1) or 1)
    if str(getattr(args, "logging_strategy", "steps")).rsplit(".", 1)[-1].lower() != "steps":
        return 1
    return max(1, math.ceil(steps * max_steps) if steps < 1 else int(steps))


class FtscopeCallback(RecordingCallback, TrainerCallback):
    """Per optimizer step: step time, tokens/s and peak memory; per logged step a point in an ftscope results store
    (`validate --db` and, for CUDA runs, `calibrate --db` read it) with the estimate for the run's own config beside
    it; one logged warning when they differ by more than ftscope's published error. Options: RecordingCallback
    (the store goes in the run's output_dir; `every` defaults to the Trainer's logging_steps)."""

    _hook: Any = None
    """The forward pre-hook counting micro-batches, while a run is measured."""
    _in_step = False

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        gpu, note = self._new_recorder(str(getattr(args, "device", "cpu")), args.output_dir, "trainer",
                                       record_every(args, state.max_steps), bool(state.is_world_process_zero))
        framework = "trl-sft" if type(args).__name__ == "SFTConfig" else "hf-trainer"
        try:
            self.recorder.start(run_config(model, training_args_keys(args), framework, gpu), note or None)
        except FtscopeError as exc:
            self.recorder.start(None, str(exc))
        if model is not None:
            self._hook = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        """Each training forward inside a step: its micro-batch's shape and tokens."""
        if self._in_step and module.training and self.recorder is not None:
            self.recorder.add_micro_batch(kwargs if "input_ids" in kwargs or not args else {"input_ids": args[0]})

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                      **kwargs: Any) -> None:
        if self.recorder is None:
            return
        self._record = self.recorder.should_record(state.global_step + 1)
        self.recorder = guarded(self.recorder, self.recorder.begin_step, (model, optimizer), self._record)
        self._in_step = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.recorder is None or not self._in_step:
            return
        self._in_step = False
        self.recorder = guarded(self.recorder, self.recorder.end_step, state.global_step, self._record)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.recorder is not None:
            self.recorder.finish()


__all__ = ["FtscopeCallback", "record_every", "training_args_keys"]
