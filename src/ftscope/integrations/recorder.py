"""The measuring core both callbacks share: one optimizer step at a time, its time, tokens and peak memory; every
recorded step a point in the results store with ftscope's estimate for the step's own shape beside it; once per run
a warning when the two differ by more than the published error (tolerance.py).

The step window runs from the loop's step-begin to its step-end hook: the micro-batches' forward and backward, the
gradient clipping and the optimizer step, synchronized on CUDA at both ends; the data loading before it is not in it
(transformers 5 fetches a step's batches before on_step_begin). That is what `validate` compares as fwd_bwd_opt_s.
Peak memory: on CUDA the allocator's counters, reset at every step; on CPU ftscope's dispatch-level tensor tracker,
only in recorded steps (it costs ~15 us per op), with the process's peak RSS beside it.

A measurement must never break the run it measures: a scenario ftscope cannot express is logged once and the steps
are still recorded (validate lists such a run as not re-estimated, with the reason).
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import FtscopeError
from ..measure.runtime.as_built import estimate_beside
from .run_config import RunConfig, run_scenario, scenario_mapping
from .tolerance import Deviation, deviations, measured_metrics, warning_text

log = logging.getLogger("ftscope.integrations")


def batch_inputs(data: Mapping[str, Any]) -> tuple[Any, Any] | None:
    """(input_ids or inputs_embeds, attention_mask) of a batch or a forward's keyword arguments; None without."""
    ids = data.get("input_ids")
    if ids is None:
        ids = data.get("inputs_embeds")
    if ids is None or not hasattr(ids, "shape") or len(ids.shape) < 2:
        return None
    return ids, data.get("attention_mask")


STORE_NAME = "ftscope-runs.sqlite"


def resolve_store(db: str | os.PathLike[str] | None, folder: str) -> str | None:
    """The store a callback writes: 'auto' is ftscope-runs.sqlite in the run's own folder; None keeps nothing."""
    if db is None:
        return None
    path = Path(folder) / STORE_NAME if db == "auto" else Path(db)
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.fspath(path)


def guarded(recorder: "RunRecorder", fn: Any, *args: Any) -> "RunRecorder | None":
    """`fn(*args)`, where an error stops the measuring, never the training it measures: logged, the stored run
    closed as failed, and None returned for the callback to keep (it then measures no more)."""
    try:
        fn(*args)
        return recorder
    except Exception as exc:  # noqa: BLE001 - the user's run goes on whatever ftscope's measuring hits
        log.warning("ftscope stopped measuring this run: %s: %s", type(exc).__name__, exc)
        try:
            recorder.finish("failed", f"{type(exc).__name__}: {exc}"[:400])
        except Exception:  # noqa: BLE001 - a store that failed once may fail again; the run still goes on
            pass
        return None


@dataclass
class StepRecord:
    """What one recorded step measured and what ftscope estimated for it."""

    step: int
    measurement: dict[str, Any]
    estimate: dict[str, Any] | None
    deviations: list[Deviation] = field(default_factory=list)


class RunRecorder:
    """Measures optimizer steps; see the module docstring. `every`: record every n-th step (and the first after
    `warmup_steps`, which are measured but not recorded: allocator warm-up and the optimizer's first state)."""

    def __init__(self, device: str, db: str | None, source: str, every: int = 1, warmup_steps: int = 1,
                 write: bool = True) -> None:
        self.device, self.db, self.source = device, db, source
        self.every, self.warmup_steps = max(1, int(every)), max(0, int(warmup_steps))
        self.write = write
        """False on every rank but the first of a multi-process run: one process writes the store."""
        self.on_cuda = device.startswith("cuda")
        self.run: RunConfig | None = None
        self.problem: str | None = None
        """Why the run cannot be estimated, when it cannot."""
        self.records: list[StepRecord] = []
        self.run_id: int | None = None
        self.warned = False
        self._store: Any = None
        self._estimates: dict[tuple[int, int, int], tuple[Any, Any]] = {}
        self._shapes: list[tuple[int, int]] = []
        self._tokens: list[Any] = []
        self._meter: Any = None
        self._t0: float | None = None

    # -- the run ----------------------------------------------------------------------------------------------
    def start(self, run: RunConfig | None, problem: str | None = None) -> None:
        self.run, self.problem = run, problem
        if problem:
            log.warning("ftscope cannot read this run's configuration (%s): its steps are recorded, not estimated",
                        problem)

    def should_record(self, step: int) -> bool:
        """Whether optimizer step `step` (1-based) becomes a point."""
        return step > self.warmup_steps and (step == self.warmup_steps + 1 or step % self.every == 0)

    def finish(self, status: str = "done", error: str | None = None) -> None:
        if self._store is not None:
            self._store.finish_run(self.run_id, status, error)
            self._store.close()
            self._store = None

    # -- one step -----------------------------------------------------------------------------------------------
    def begin_step(self, seed: tuple[Any, ...], record: bool) -> None:
        """Open the step window; `seed`: the model and optimizer (the CPU tracker must see what exists before)."""
        from ..measure.runtime.meters import MemoryMeter

        self._shapes, self._tokens = [], []
        self._meter = None
        if self.on_cuda or (record and self.device == "cpu"):
            self._meter = MemoryMeter(self.device, seed=seed if not self.on_cuda else ())
            self._meter.__enter__()
        self._t0 = time.perf_counter()

    def add_micro_batch(self, data: Mapping[str, Any]) -> None:
        """Count one micro-batch's shape and non-padding tokens (kept as a tensor: no sync until the step ends)."""
        found = batch_inputs(data)
        if found is None:
            return
        ids, mask = found
        self._shapes.append((int(ids.shape[0]), int(ids.shape[1])))
        self._tokens.append(mask.sum() if mask is not None and hasattr(mask, "sum") else ids.shape[0] * ids.shape[1])

    def end_step(self, step: int, record: bool) -> StepRecord | None:
        """Close the window; for a recorded step, store the point, compare it with the estimate, warn once."""
        if self._t0 is None:
            return None
        self._sync()
        seconds = time.perf_counter() - self._t0
        self._t0 = None
        memory = None
        if self._meter is not None:
            self._meter.__exit__(None, None, None)
            memory = self._meter.report.to_dict() if self._meter.report is not None else None
            self._meter = None
        if not record or not self._shapes:
            return None
        measurement = self._measurement(step, seconds, memory)
        rec = self._compare(step, measurement)
        self.records.append(rec)
        self._keep(rec)
        return rec

    def _sync(self) -> None:
        if self.on_cuda:
            import torch
            torch.cuda.synchronize(torch.device(self.device))

    def _measurement(self, step: int, seconds: float, memory: dict[str, Any] | None) -> dict[str, Any]:
        tokens = sum(int(t) for t in self._tokens)
        samples = sum(b for b, _ in self._shapes)
        return {"batch": max(b for b, _ in self._shapes), "seq_len": max(s for _, s in self._shapes),
                "micro_batches": len(self._shapes), "uniform_shape": len(set(self._shapes)) == 1,
                "step_s": seconds, "tokens": tokens, "padded_tokens": sum(b * s for b, s in self._shapes),
                "tokens_per_s": tokens / seconds if seconds > 0 else None,
                "samples_per_s": samples / seconds if seconds > 0 else None, "memory": memory,
                "hooks_in_timed_steps": False, "global_step": step, "source": self.source}

    # -- the estimate beside it ---------------------------------------------------------------------------------
    def _estimate(self, shape: tuple[int, int, int]) -> tuple[Any, Any]:
        """(scenario, estimate) of the run at a (micro-batch, padded length, micro-batches) shape, cached."""
        if shape not in self._estimates:
            scn = est = None
            if self.run is not None and self.problem is None:
                try:
                    scn = run_scenario(self.run, *shape)
                    est = estimate_beside(scn)
                except FtscopeError as exc:
                    self.problem = str(exc)
                    log.warning("ftscope cannot estimate this run (%s): its steps are recorded, not compared", exc)
            self._estimates[shape] = (scn, est)
        return self._estimates[shape]

    def _compare(self, step: int, m: dict[str, Any]) -> StepRecord:
        scn, est = self._estimate((m["batch"], m["seq_len"], m["micro_batches"]))
        if est is None:
            return StepRecord(step, m, None)
        found = deviations(measured_metrics(m, self.on_cuda), est, scn)
        if any(d.exceeds for d in found) and not self.warned:
            self.warned = True
            log.warning(warning_text(step, found, self.db if self.write else None))
        return StepRecord(step, m, est.to_dict(), found)

    # -- the store ----------------------------------------------------------------------------------------------
    def _keep(self, rec: StepRecord) -> None:
        if not self.write or self.db is None:
            return
        if self._store is None:
            self._open(rec.measurement)
        self._store.record_point(self.run_id, f"batch={rec.measurement['batch']}/step={rec.step}", "ok",
                                 rec.measurement, rec.estimate)

    def _open(self, first: dict[str, Any]) -> None:
        """Start the store's run at the first recorded step, whose shape is the run scenario's."""
        from ..measure.runtime.environment import environment
        from ..measure.store import Store

        scenario: dict[str, Any] = {"model": self.run.model_name if self.run else "model"}
        notes: list[str] = []
        if self.run is not None:
            try:
                scenario, notes = scenario_mapping(self.run, first["batch"], first["seq_len"], first["micro_batches"])
            except FtscopeError as exc:
                self.problem = self.problem or str(exc)
        row = {"scenario": scenario, "options": {"device": self.device, "source": self.source, "every": self.every,
                                                 "warmup_steps": self.warmup_steps},
               "build": {"config": self.run.model_config if self.run else None},
               "run_config": {k: v for k, v in self.run.to_dict().items() if k != "model_config"} if self.run else None, "notes": notes, "problem": self.problem}
        self._store = Store(self.db)
        self.run_id = self._store.start_run(row, environment(self.device))


class RecordingCallback:
    """What both callbacks hold: their options and the recorder of the run in progress.

    db: the store ('auto': ftscope-runs.sqlite in the run's own folder; None: keep nothing, still compare). every:
    record every n-th optimizer step (default: the loop's logging interval). warmup_steps: steps measured but not
    recorded (the allocator's warm-up and the optimizer's first state). gpu: the catalog GPU when ftscope does not
    know the device's name."""

    def __init__(self, db: str | os.PathLike[str] | None = "auto", every: int | None = None, warmup_steps: int = 1,
                 gpu: str | None = None) -> None:
        self.db, self.every, self.warmup_steps, self.gpu = db, every, warmup_steps, gpu
        self.recorder: RunRecorder | None = None
        self._record = False

    @property
    def records(self) -> list[StepRecord]:
        """Every recorded step: its measurement, the estimate beside it and their deviations."""
        return self.recorder.records if self.recorder else []

    @property
    def store_path(self) -> str | None:
        return self.recorder.db if self.recorder else None

    def _new_recorder(self, device: str, folder: str, source: str, every: int, write: bool) -> tuple[str | None, str]:
        """Start measuring a run on `device`: its recorder, and (catalog GPU, note why none) for its scenario."""
        from .model_facts import gpu_key

        self.recorder = RunRecorder(device, resolve_store(self.db, folder), source, self.every or every,
                                    self.warmup_steps, write=write)
        return (self.gpu, "") if self.gpu else gpu_key(device)


__all__ = ["RecordingCallback", "RunRecorder", "StepRecord", "batch_inputs", "guarded", "resolve_store", "STORE_NAME"]
