"""Stored rows as typed values: what `validate --db` and `report --db` read from a results store, checked.

A store can be edited by hand or written by an older ftscope; a row whose fields are missing, of the wrong type,
negative or not finite is not read as a measurement: `point_of` / `run_of` raise one FtscopeError saying why, and
the readers list that row as not compared (or leave it out of the charts, saying so) instead of crashing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..spec.schema import Flag, Int, Number, Text, validate
from .store import Point, Run

Figure = Number(ge=0, le=1e18)


@dataclass(frozen=True)
class StoredMemory:
    peak_allocated_bytes: Number(gt=0, le=1e18)
    """Compared as a percentage: zero would make the error infinite."""
    peak_reserved_bytes: Figure | None = None


@dataclass(frozen=True)
class LayerTimes:
    total_s: dict[Text(), Figure]


@dataclass(frozen=True)
class ExpertCounts:
    counts: list[list[Figure]]


@dataclass(frozen=True)
class Utilization:
    available: Flag() = False
    sm_mean: Figure | None = None
    mem_bw_mean: Figure | None = None


@dataclass(frozen=True)
class StoredPoint:
    """One batch point as profile stored it (the fields the readers use)."""

    batch: Int(1, 10**7)
    memory: StoredMemory | None = None
    step_s: Figure | None = None
    hooked_step_s: Figure | None = None
    forward_s: Figure | None = None
    backward_s: Figure | None = None
    optimizer_s: Figure | None = None
    samples_per_s: Figure | None = None
    layer_times: LayerTimes | None = None
    expert_load: ExpertCounts | None = None
    utilization: Utilization | None = None
    seq_len: Int(1, 10**7) | None = None
    """The padded length the point ran at when it is not the run scenario's (a training run's own batches: the
    longest micro-batch of the step)."""
    micro_batches: Int(1, 100_000) | None = None
    """Micro-batches in the timed step (gradient accumulation) when not the run scenario's."""
    uniform_shape: Flag() | None = None
    """False when the step's micro-batches had different padded lengths: its time is no one scenario's."""
    hooks_in_timed_steps: Flag() | None = None
    """False: the timed steps ran without the layer timer's hooks (also said by a hooked_step_s beside them)."""


@dataclass(frozen=True)
class Build:
    config: dict[Text(), Any] | None = None


@dataclass(frozen=True)
class Options:
    device: Text() = "cpu"
    source: Text() = "profile"
    """What measured the run: profile, or a training run's callback (ftscope.integrations: trainer, lightning)."""


@dataclass(frozen=True)
class StoredRun:
    """What profile stored about a run (scenario as given, the config as built, options)."""

    scenario: dict[Any, Any]
    build: Build | None = None
    options: Options = Options()


def point_of(point: Point) -> StoredPoint:
    """The typed batch point; FtscopeError (why) for a row that cannot be read as one."""
    return validate(StoredPoint, point.measurement, source=f"run {point.run_id} point {point.key}")


def run_of(run: Run) -> StoredRun:
    return validate(StoredRun, run.scenario, source=f"run {run.id}")
