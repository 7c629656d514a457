"""profile: run real fine-tuning steps and record what the IISWC study characterized, on CUDA or CPU.

Per batch size: peak memory (CUDA allocator counters, or a dispatch-level tensor tracker on CPU), synchronized
forward / backward / optimizer times, time by layer type (module hooks), tokens routed to every expert in every
layer, NVML utilization on CUDA, tokens/s and samples/s; ftscope's estimate for the model as built sits beside
every point. Results go to the SQLite store point by point, so a killed sweep resumes where it stopped.
"""
from __future__ import annotations

import gc
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from ...errors import FtscopeError
from ...spec.scenario import Scenario
from .. import require_torch
from ..store import Store
from .as_built import built_scenario, estimate_beside
from .loop import ProfilePoint, Stepper, make_optimizer, resolve_device, timed_steps

DEFAULT_DB = "ftscope-runs.sqlite"


@dataclass
class ProfileResult:
    run_id: int | None
    db: str | None
    device: str
    build: dict[str, Any]
    environment: dict[str, Any]
    points: list[ProfilePoint] = field(default_factory=list)
    max_batch: dict[str, Any] | None = None
    skipped: list[str] = field(default_factory=list)
    """Points already in the store (with --resume) that were not run again."""

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "db": self.db, "device": self.device, "build": self.build,
                "environment": self.environment, "points": [p.to_dict() for p in self.points],
                "max_batch": self.max_batch, "skipped": self.skipped}


@dataclass
class Rig:
    """A built model ready to step: the model, its optimizer and stepper, and batches in the workload's shapes."""

    scn: Scenario
    device: str
    model: Any
    info: Any
    """BuildInfo of the model as built."""
    optimizer: Any
    stepper: Stepper
    batches: Any
    """SyntheticBatches."""
    cap_bytes: int | None
    """Memory cap of the meters (the tracker's simulated OOM on CPU)."""

    def step(self, size: int, worst: bool = False) -> tuple[tuple[float, float, float], list[Any]]:
        """One training step at micro-batch `size`: its times and the batch shape."""
        data, shapes = self.batches.draw(size, worst=worst)
        return self.stepper.step(data), shapes

    def estimate(self, batch: int) -> dict[str, Any] | None:
        est = estimate_beside(built_scenario(self.scn, self.info.config, batch))
        return est.to_dict() if est is not None else None


def sweep_id(scn: Scenario, options: dict[str, Any]) -> str:
    text = json.dumps({"scenario": scn.to_dict(), "options": options}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_options(steps: int, warmup: int, batch_sizes: Sequence[int], memory_cap_gib: float | None,
                   data: str | None, tokenizer: str | None) -> None:
    if steps < 1 or warmup < 0:
        raise FtscopeError("--steps must be >= 1 and --warmup >= 0")
    if any(b < 1 for b in batch_sizes):
        raise FtscopeError("--batch-sizes must be positive integers")
    if memory_cap_gib is not None and not memory_cap_gib > 0:
        raise FtscopeError("--memory-cap-gib must be above 0")
    if (data is None) != (tokenizer is None):
        raise FtscopeError("--data and --tokenizer go together (a local JSONL and a local tokenizer.json)")


def build_rig(scn: Scenario, device: str, shrink: dict[str, Any] | None, weights: str | None, data: str | None,
              tokenizer: str | None, seed: int, memory_cap_gib: float | None) -> Rig:
    """Build the scenario's model on the device (seeded) with its optimizer and a batch source."""
    import torch

    from .batches import LengthSampler, SyntheticBatches, read_jsonl_lengths
    from .build import build_model

    torch.manual_seed(seed)
    model, info = build_model(scn, device=device, shrink=shrink, weights=weights)
    if info.vocab_size is None:
        raise FtscopeError("the built config has no vocab_size")
    opt = make_optimizer(model, scn)
    lengths = read_jsonl_lengths(data, tokenizer) if data else None
    batches = SyntheticBatches(LengthSampler(scn, seed, lengths), info.vocab_size, device,
                               torch.Generator().manual_seed(seed))
    return Rig(scn, device, model, info, opt, Stepper(model, opt, device, info.autocast_dtype), batches,
               int(memory_cap_gib * 2**30) if memory_cap_gib else None)


def _hooked(rig: Rig, b: int, steps: int) -> tuple[Any, Any, float]:
    """(LayerTimer, ExpertLoad, seconds per step) of hooked steps of their own (CUDA)."""
    from .expert_load import ExpertLoad
    from .hooks import LayerTimer

    timer, load = LayerTimer(rig.model), ExpertLoad(rig.model)
    hooked = 0.0
    for _ in range(steps):
        hooked += sum(rig.step(b)[0])
    return timer, load, hooked / steps


def _attach_hook_results(point: ProfilePoint, timer: Any, load: Any, steps: int) -> None:
    if timer is not None:
        point.layer_times = {k: {kk: vv / steps for kk, vv in v.items()} if isinstance(v, dict) else v
                             for k, v in timer.result().to_dict().items()}
        timer.remove()
    if load is not None:
        if load.is_moe:
            point.expert_load = load.to_dict()
        load.remove()


def measure_point(rig: Rig, b: int, steps: int, warmup: int, hooks: bool, separate: bool) -> ProfilePoint:
    """Warm-up steps, one memory step on the longest batch, `steps` timed steps (and on CUDA hooked steps of
    their own): one ProfilePoint."""
    from .expert_load import ExpertLoad
    from .hooks import LayerTimer
    from .meters import MemoryMeter
    from .utilization import UtilizationSampler

    if rig.device.startswith("cuda"):
        # each point starts from an emptied cache, as a run at this batch size alone would: blocks cached
        # for earlier batch sizes otherwise raise its reserved peak (measured on an H200: +27 % at 8B b8)
        import torch
        gc.collect()
        torch.cuda.empty_cache()
    for _ in range(warmup):
        rig.step(b)
    # memory on the longest batch the run can see, in its own step (the CPU tracker slows timing)
    with MemoryMeter(rig.device, seed=(rig.model, rig.optimizer), cap_bytes=rig.cap_bytes) as meter:
        rig.step(b, worst=True)
    # On CUDA the layer timer synchronizes at every module boundary, which makes a small step host-bound
    # (measured on an H200: 1B LoRA b1 0.136 s hooked); so there the timed steps run bare and the hooks
    # get steps of their own. On CPU synchronizing is free and the hooks ride along (+2 % measured).
    riding = hooks and not separate
    timer = LayerTimer(rig.model) if riding else None
    load = ExpertLoad(rig.model) if riding else None
    with UtilizationSampler() as util:
        totals = timed_steps(lambda _: rig.step(b), range(steps))
    point = ProfilePoint(batch=b, status="ok", **totals.point_fields(), memory=meter.report.to_dict(),
                         utilization=asdict(util.summary()), hooks_in_timed_steps=riding)
    hooked_steps = steps
    if hooks and separate:
        hooked_steps = min(steps, 2)
        timer, load, point.hooked_step_s = _hooked(rig, b, hooked_steps)
    _attach_hook_results(point, timer, load, hooked_steps)
    return point


def _measure_or_fail(rig: Rig, b: int, steps: int, warmup: int, hooks: bool, separate: bool) -> ProfilePoint:
    try:
        return measure_point(rig, b, steps, warmup, hooks, separate)
    except Exception as exc:  # noqa: BLE001 - an OOM or a failed point is recorded, the sweep goes on
        point = ProfilePoint.failed(b, exc, limit=400)
        rig.optimizer.zero_grad(set_to_none=True)
        exc.__traceback__ = None
        gc.collect()
        return point


def recorded_tries(store: Any, run_id: int) -> list[Any]:
    """The max-batch tries a killed run already recorded, so a resumed search does not repeat them."""
    from .max_batch import Try

    out = []
    for p in store.points(run_id):
        m = p.measurement
        if p.key.startswith("maxbatch:try=") and isinstance(m.get("batch"), int) and m.get("status") in ("ok", "oom"):
            out.append(Try(batch=m["batch"], status=m["status"], seconds=float(m.get("seconds") or 0.0),
                           error=m.get("error")))
    return out


def search_max_batch(rig: Rig, cap: int, on_try: Callable[[Any], None],
                     recorded: Sequence[Any] = ()) -> tuple[dict[str, Any], dict | None]:
    """The largest batch that fits, found by running the longest batches (grow, then bisect); with the
    estimator's max micro-batch beside it (when no cap simulates a smaller device). `recorded`: tries a killed
    run already made."""
    from .max_batch import find_max_batch, oom_probe

    probe = oom_probe(lambda b: rig.step(b, worst=True), rig.device, (rig.model, rig.optimizer), rig.cap_bytes,
                      rig.optimizer)
    found = find_max_batch(probe, start=1, cap=cap, on_try=on_try, recorded=recorded)
    est = rig.estimate(1)
    limit = (est or {}).get("limits", {}).get("max_micro_batch_size") if rig.cap_bytes is None else None
    return {**found.to_dict(), "estimate_max_micro_batch_size": limit}, est


def profile(scn: Scenario, device: str = "auto", steps: int = 3, warmup: int = 1,
            batch_sizes: Sequence[int] = (1, 2, 4), find_max_batch: bool = False, shrink: dict[str, Any] | None = None,
            weights: str | None = None, data: str | None = None, tokenizer: str | None = None,
            db: str | None = DEFAULT_DB, resume: bool = False, memory_cap_gib: float | None = None,
            hooks: bool = True, seed: int = 0, max_batch_cap: int = 256,
            separate_hooked_steps: bool | None = None, progress: Callable[[str], None] | None = None) -> ProfileResult:
    """Profile the scenario at each batch size (or search the largest that fits); see the module docstring."""
    require_torch(("bitsandbytes",) if scn.mix.method == "qlora" else ())
    from .environment import environment

    _check_options(steps, warmup, batch_sizes, memory_cap_gib, data, tokenizer)
    dev = resolve_device(device)
    say = progress or (lambda _msg: None)
    rig = build_rig(scn, dev, shrink, weights, data, tokenizer, seed, memory_cap_gib)
    env = environment(dev)
    options = {"device": dev, "steps": steps, "warmup": warmup, "shrink": shrink, "data": data, "weights": weights,
               "memory_cap_gib": memory_cap_gib, "find_max_batch": find_max_batch, "seed": seed,
               "empty_cache_per_point": dev.startswith("cuda")}
    store = Store(db) if db else None
    run_id, done = None, set()
    if store is not None:
        run_id = store.start_run({"scenario": scn.to_dict(), "options": options, "build": asdict(rig.info)}, env,
                                 sweep_id=sweep_id(scn, options), resume=resume)
        done = store.done_keys(run_id) if resume else set()
    result = ProfileResult(run_id=run_id, db=db, device=dev, build=asdict(rig.info), environment=env)
    separate = hooks and (dev.startswith("cuda") if separate_hooked_steps is None else separate_hooked_steps)
    for b in batch_sizes if not find_max_batch else ():
        key = f"batch={b}"
        if key in done:
            result.skipped.append(key)
            say(f"batch {b}: already in the store, skipped")
            continue
        say(f"batch {b}: {warmup} warm-up + {steps} timed steps")
        point = _measure_or_fail(rig, b, steps, warmup, hooks, separate)
        point.estimate = rig.estimate(b)
        result.points.append(point)
        if store is not None:
            store.record_point(run_id, key, point.status, point.to_dict(), point.estimate)
    if find_max_batch:
        def on_try(t: Any) -> None:
            say(f"max-batch search: batch {t.batch} {t.status}")
            if store is not None:
                store.record_point(run_id, f"maxbatch:try={t.batch}", t.status, asdict(t), None)

        recorded = recorded_tries(store, run_id) if store is not None and resume else []
        result.max_batch, est = search_max_batch(rig, max_batch_cap, on_try, recorded)
        if store is not None:  # when not even batch 1 fits, the sweep's answer is an OOM, not a result
            store.record_point(run_id, "maxbatch", "ok" if result.max_batch.get("max_batch") else "oom",
                               result.max_batch, est)
    if store is not None:
        store.finish_run(run_id, "done")
    return result
