"""Checks from profile runs in a results store: each measured point re-estimated with today's estimator.

CPU runs compare tensor memory (the dispatch tracker's peak against the estimate's allocated bytes): a CPU's
step time says nothing about a GPU's. CUDA runs compare reserved memory and step time too, except step times
timed with the layer timer's synchronizing hooks inside the timed steps (stores written before profile gave the
hooks steps of their own; they read 3-125 % slow on an H200): those are listed as not compared. So is every run
or point that cannot be re-estimated (no config as built, a scenario today's checks refuse, a damaged row), with
the reason: nothing in the store is dropped silently. The store is opened read-only.

Runs written by a training run's callback (ftscope.integrations) store each step's own shape (micro-batch, padded
length, micro-batches per step) and are re-estimated at it; a step whose micro-batches had different padded lengths
is compared for memory (at the longest) but not for time.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import FtscopeError
from ..spec.resolve import model_from_config
from ..spec.scenario import Scenario, scenario_from_dict
from .compare import Check


def _scenario(run_scenario: dict, build_config: dict | None, label: str) -> Scenario:
    """The run's scenario with the model as built (so a model path that no longer resolves, e.g. a relative one,
    does not matter); FtscopeError saying why it cannot be re-estimated."""
    if not build_config:
        raise FtscopeError("no config as built in the store")
    model = model_from_config(build_config, name=f"{run_scenario.get('model', label)} (as built)")
    mix = run_scenario.get("mix")
    if isinstance(mix, dict) and isinstance(mix.get("experts_top_k"), int) and model.is_moe:
        # a shrunk model may have fewer experts than the scenario's top-k
        run_scenario = {**run_scenario, "mix": {**mix, "experts_top_k": min(mix["experts_top_k"], model.arch.num_experts)}}
    return scenario_from_dict(run_scenario, model=model)


def store_checks(db: str | Path) -> tuple[list[Check], list[tuple[str, str]]]:
    """Checks from every ok batch point of the store, and (measurement, why) for what is left out."""
    from ..measure.store import Store
    from ..measure.store_rows import point_of, run_of

    p = Path(db)
    out: list[Check] = []
    skipped: list[tuple[str, str]] = []
    with Store(p, readonly=True) as store:
        for run in store.runs():
            case = f"db:{p.name}:run{run.id}"
            try:
                stored = run_of(run)
                scn = _scenario(stored.scenario, stored.build.config if stored.build else None, f"profile run {run.id}")
            except FtscopeError as exc:
                skipped.append((f"{case} (every point)", f"cannot re-estimate: {exc}"))
                continue
            device = stored.options.device
            for point in store.points(run.id):
                if point.status != "ok" or not point.key.startswith("batch="):
                    continue
                try:
                    m = point_of(point)
                except FtscopeError as exc:
                    skipped.append((f"{case} {point.key}", str(exc)))
                    continue
                if m.memory is None:
                    skipped.append((f"{case} {point.key}", "no memory recorded"))
                    continue
                bare = "hooked_step_s" in point.measurement or m.hooks_in_timed_steps is False
                out += _point_checks(case, f"{stored.options.source}-{device.split(':')[0]}", _at_point(scn, m), m,
                                     bare, skipped)
        skipped += [(f"db:{p.name} {row}", f"unreadable row: {why}") for row, why in store.unreadable]
    return out, skipped


def _at_point(scn: Scenario, m) -> Scenario:
    """The run's scenario at the point's batch shape: its micro-batch, and for a training run's own steps their
    padded length and number of micro-batches."""
    changes = {"micro_batch_size": m.batch}
    if m.seq_len is not None:
        changes["seq_len"] = m.seq_len
    if m.micro_batches is not None:
        changes["gradient_accumulation"] = m.micro_batches
    return scn.with_(**changes)


def _point_checks(case: str, group: str, s: Scenario, m, bare_steps: bool, skipped: list) -> list[Check]:
    b, mem = m.batch, m.memory
    shape = f"batch {b}" if m.seq_len is None else f"batch {b} x {m.seq_len}"
    if mem.peak_reserved_bytes:
        # both: tensor accounting (allocated) and what the caching allocator held (reserved)
        out = [Check(case, group, "peak_gib:allocated", mem.peak_allocated_bytes / 2**30, s, shape),
               Check(case, group, "peak_gib:reserved", mem.peak_reserved_bytes / 2**30, s, shape)]
        if m.step_s and m.uniform_shape is False:
            skipped.append((f"{case} {shape} fwd_bwd_opt_s", "micro-batches of different padded lengths in one step"))
        elif m.step_s and bare_steps:
            out.append(Check(case, group, "fwd_bwd_opt_s", m.step_s, s, shape))
        elif m.step_s:
            skipped.append((f"{case} {shape} fwd_bwd_opt_s", "timed with synchronizing layer hooks"))
        return out
    return [Check(case, group, "peak_gib:allocated", mem.peak_allocated_bytes / 2**30, s, f"{shape}; CPU tensor bytes")]
