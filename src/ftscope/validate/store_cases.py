"""Checks from profile runs in a results store: each measured point re-estimated with today's estimator.

CPU runs compare tensor memory (the dispatch tracker's peak against the estimate's allocated bytes): a CPU's
step time says nothing about a GPU's. CUDA runs compare reserved memory and step time too, except step times
timed with the layer timer's synchronizing hooks inside the timed steps (stores written before profile gave the
hooks steps of their own; they read 3-125 % slow on an H200): those are listed as not compared.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import FtscopeError
from ..spec.model import model_from_config
from ..spec.scenario import Scenario, scenario_from_dict
from .compare import Check


def _scenario(run_scenario: dict, label: str) -> Scenario | None:
    raw, build = run_scenario.get("scenario"), run_scenario.get("build") or {}
    if not raw or not build.get("config"):
        return None
    try:
        scn = scenario_from_dict(raw)
    except FtscopeError:
        return None
    model = model_from_config(build["config"], name=f"{raw.get('model', label)} (as built)")
    mix = scn.mix
    if model.is_moe and mix.experts_top_k and mix.experts_top_k > model.arch.num_experts:
        mix = replace(mix, experts_top_k=model.arch.num_experts)
    return replace(scn, model=model, mix=mix)


def store_checks(db: str | Path) -> tuple[list[Check], list[tuple[str, str]]]:
    """Checks from every ok batch point of the store, and (measurement, why) for what is left out."""
    from ..measure.store import Store

    p = Path(db)
    if not p.is_file():
        raise FtscopeError(f"results store not found: {p}")
    out: list[Check] = []
    skipped: list[tuple[str, str]] = []
    with Store(str(p)) as store:
        for run in store.runs():
            label = f"profile run {run.id}"
            scn = _scenario(run.scenario, label)
            if scn is None:
                continue
            device = str(run.scenario.get("options", {}).get("device", "cpu"))
            for point in store.points(run.id):
                m = point.measurement
                if point.status != "ok" or not point.key.startswith("batch=") or not m.get("memory"):
                    continue
                b = int(m["batch"])
                s = scn.with_(micro_batch_size=b)
                mem = m["memory"]
                case = f"db:{p.name}:run{run.id}"
                group = f"profile-{device.split(':')[0]}"
                if mem.get("peak_reserved_bytes"):
                    # both: tensor accounting (allocated) and what the caching allocator held (reserved)
                    out.append(Check(case, group, "peak_gib:allocated", mem["peak_allocated_bytes"] / 2**30, s, f"batch {b}"))
                    out.append(Check(case, group, "peak_gib:reserved", mem["peak_reserved_bytes"] / 2**30, s, f"batch {b}"))
                    if m.get("step_s") and "hooked_step_s" in m:
                        out.append(Check(case, group, "fwd_bwd_opt_s", m["step_s"], s, f"batch {b}"))
                    elif m.get("step_s"):
                        skipped.append((f"{case} batch {b} fwd_bwd_opt_s", "timed with synchronizing layer hooks"))
                else:
                    out.append(Check(case, group, "peak_gib:allocated", mem["peak_allocated_bytes"] / 2**30, s,
                                     f"batch {b}; CPU tensor bytes"))
    return out, skipped
