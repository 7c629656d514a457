"""Hours, GPU-hours and dollars of the whole run from the step time and a dated price."""
from __future__ import annotations

import math

from .. import catalog
from ..spec.scenario import Scenario
from .result import RunCost, TimeEstimate


def price_of(scn: Scenario) -> tuple[float | None, str]:
    """($/GPU-hour, where it came from): the scenario's override, else the cheapest dated catalog price."""
    if scn.usd_per_gpu_hour is not None:
        return scn.usd_per_gpu_hour, "scenario price.usd_per_gpu_hour"
    if scn.cluster.gpu.key.endswith("*") or scn.cluster.gpu.key == "custom":
        return None, "inline GPU: set price.usd_per_gpu_hour"
    rows = catalog.prices_for(scn.cluster.gpu.key)
    if not rows:
        return None, "no price in the catalog"
    p = rows[0]
    return float(p["usd_per_gpu_hour"]), f"{p['provider']} {p['date']}"


def run_cost(scn: Scenario, t: TimeEstimate, batch: int, price: tuple[float | None, str] | None = None) -> RunCost:
    """The run's hours and dollars at step time `t` (`price`: price_of(scn), when already known)."""
    world = scn.cluster.world_size
    steps = run_steps(scn, batch)
    hours = steps * t.step_s / 3600.0
    gpu_hours = hours * world
    usd, source = price if price is not None else price_of(scn)
    return RunCost(hours=hours, gpu_hours=gpu_hours, usd=None if usd is None else gpu_hours * usd,
                   usd_per_gpu_hour=usd, price_source=source, steps=steps)


def run_steps(scn: Scenario, batch: int) -> int:
    """Optimizer steps of the whole run at this micro-batch."""
    wl = scn.workload
    replicas = max(scn.cluster.world_size // scn.mix.model_parallel, 1)  # a tensor / pipeline / context group runs one micro-batch
    samples_per_step = batch * wl.gradient_accumulation * replicas * wl.samples_per_sequence()
    return math.ceil(wl.samples_per_epoch() * wl.epochs / samples_per_step)
