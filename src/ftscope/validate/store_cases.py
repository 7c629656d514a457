"""Checks from profile runs in a results store: each measured point re-estimated with today's estimator.

CPU runs compare tensor memory (the dispatch tracker's peak against the estimate's allocated bytes): a CPU's
step time says nothing about a GPU's. CUDA runs compare reserved memory and step time too, except step times
timed with the layer timer's synchronizing hooks inside the timed steps (stores written before profile gave the
hooks steps of their own; they read 3-125 % slow on an H200): those are listed as not compared.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import FtscopeError
from ..measure.runtime.as_built import built_scenario
from ..measure.runtime.loop import ProfilePoint, batch_points
from ..measure.store import Store
from ..spec.scenario import Scenario, scenario_from_dict
from .compare import Check


def _scenario(run_scenario: dict) -> Scenario | None:
    """The run's scenario with the model as it was built (None for runs that did not store their build)."""
    raw, build = run_scenario.get("scenario"), run_scenario.get("build") or {}
    if not raw or not build.get("config"):
        return None
    try:
        scn = scenario_from_dict(raw)
    except FtscopeError:
        return None
    return built_scenario(scn, build["config"])


def _point_checks(case: str, group: str, p: ProfilePoint, s: Scenario) -> tuple[list[Check], list[tuple[str, str]]]:
    """CPU: tensor memory. CUDA: allocated and reserved memory, and step time when the timed steps ran bare."""
    b, mem = p.batch, p.memory
    if not mem.get("peak_reserved_bytes"):
        return [Check(case, group, "peak_gib:allocated", mem["peak_allocated_bytes"] / 2**30, s,
                      f"batch {b}; CPU tensor bytes")], []
    # both: tensor accounting (allocated) and what the caching allocator held (reserved)
    out = [Check(case, group, "peak_gib:allocated", mem["peak_allocated_bytes"] / 2**30, s, f"batch {b}"),
           Check(case, group, "peak_gib:reserved", mem["peak_reserved_bytes"] / 2**30, s, f"batch {b}")]
    if p.step_s and not p.hooks_in_timed_steps:
        return out + [Check(case, group, "fwd_bwd_opt_s", p.step_s, s, f"batch {b}")], []
    if p.step_s:
        return out, [(f"{case} batch {b} fwd_bwd_opt_s", "timed with synchronizing layer hooks")]
    return out, []


def store_checks(db: str | Path) -> tuple[list[Check], list[tuple[str, str]]]:
    """Checks from every ok batch point of the store, and (measurement, why) for what is left out."""
    p = Path(db)
    if not p.is_file():
        raise FtscopeError(f"results store not found: {p}")
    out: list[Check] = []
    skipped: list[tuple[str, str]] = []
    with Store(str(p)) as store:
        for run in store.runs():
            scn = _scenario(run.scenario)
            if scn is None:
                continue
            device = str(run.scenario.get("options", {}).get("device", "cpu"))
            for point in batch_points(store, run.id):
                if point.status != "ok" or not point.memory:
                    continue
                checks, left_out = _point_checks(f"db:{p.name}:run{run.id}", f"profile-{device.split(':')[0]}",
                                                 point, scn.with_(micro_batch_size=int(point.batch)))
                out += checks
                skipped += left_out
    return out, skipped
