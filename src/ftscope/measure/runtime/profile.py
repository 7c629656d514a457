"""profile: run real fine-tuning steps and record what the IISWC study characterized, on CUDA or CPU.

Per batch size: peak memory (CUDA allocator counters, or a dispatch-level tensor tracker on CPU), synchronized
forward / backward / optimizer times, time by layer type (module hooks), tokens routed to every expert in every
layer, NVML utilization on CUDA, tokens/s and samples/s; ftscope's estimate for the model as built sits beside
every point. Results go to the SQLite store point by point, so a killed sweep resumes where it stopped.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from ...errors import FtscopeError
from ...spec.scenario import Scenario
from .. import require_torch

DEFAULT_DB = "ftscope-runs.sqlite"


@dataclass
class ProfilePoint:
    """Everything measured at one batch size."""

    batch: int
    status: str
    """ok | oom | error"""
    steps: int = 0
    step_s: float | None = None
    """forward + backward + optimizer, synchronized, per step."""
    wall_step_s: float | None = None
    """Wall time per step, batch creation included: the independent check on the three parts."""
    forward_s: float | None = None
    backward_s: float | None = None
    optimizer_s: float | None = None
    tokens_per_s: float | None = None
    """Non-padding tokens per second."""
    samples_per_s: float | None = None
    padded_len_mean: float | None = None
    memory: dict[str, Any] | None = None
    """Peak of the longest batch: MemoryReport.to_dict()."""
    layer_times: dict[str, Any] | None = None
    """Seconds by layer type per step (forward, backward, recompute); on CUDA from the hooked steps."""
    expert_load: dict[str, Any] | None = None
    """[layer][expert] token counts over the timed steps (CUDA: the hooked steps), imbalance statistics."""
    utilization: dict[str, Any] | None = None
    hooked_step_s: float | None = None
    """CUDA: step time with the layer timer's synchronizing hooks, measured in steps of their own (layer_times
    and expert_load come from those); step_s is from bare steps."""
    error: str | None = None
    estimate: dict[str, Any] | None = None
    """ftscope's estimate for the model as built (memory, limits, time) at this batch size."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise FtscopeError("--device cuda but torch sees no CUDA device (use --device cpu)")
    if device != "cpu" and not device.startswith("cuda"):
        raise FtscopeError(f"--device must be auto, cuda or cpu; got {device!r}")
    return device


def make_optimizer(model: Any, scn: Scenario) -> Any:
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    name = scn.mix.optimizer
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-4)
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise FtscopeError(f"optimizer {name} needs bitsandbytes: pip install 'ftscope[measure]'") from None
    cls = bnb.optim.PagedAdamW8bit if name == "paged_adamw_8bit" else bnb.optim.AdamW8bit
    return cls(params, lr=1e-4)


class Stepper:
    """One synchronized training step split into forward, backward and optimizer time."""

    def __init__(self, model: Any, optimizer: Any, device: str, autocast_dtype: str | None) -> None:
        import torch

        self.torch = torch
        self.model, self.opt, self.device = model, optimizer, device
        self.autocast = getattr(torch, autocast_dtype) if autocast_dtype else None

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def __call__(self, batch: dict[str, Any]) -> tuple[float, float, float]:
        torch = self.torch
        self._sync()
        t0 = time.perf_counter()
        if self.autocast is not None:
            with torch.autocast(device_type="cuda" if self.device.startswith("cuda") else "cpu", dtype=self.autocast):
                loss = self.model(**batch).loss
        else:
            loss = self.model(**batch).loss
        self._sync()
        t1 = time.perf_counter()
        loss.backward()
        self._sync()
        t2 = time.perf_counter()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self._sync()
        t3 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2


def built_scenario(scn: Scenario, config: dict[str, Any], batch: int) -> Scenario:
    """The scenario with the model as actually built (shrunk), for the estimate beside each point."""
    from dataclasses import replace

    from ...spec.model import model_from_config

    model = model_from_config(config, name=f"{scn.model.name} (as built)")
    mix = scn.mix
    if model.is_moe and mix.experts_top_k and mix.experts_top_k > model.arch.num_experts:
        mix = replace(mix, experts_top_k=model.arch.num_experts)
    return replace(scn, model=model, mix=mix).with_(micro_batch_size=batch)


def sweep_id(scn: Scenario, options: dict[str, Any]) -> str:
    text = json.dumps({"scenario": scn.to_dict(), "options": options}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def profile(scn: Scenario, device: str = "auto", steps: int = 3, warmup: int = 1,
            batch_sizes: Sequence[int] = (1, 2, 4), find_max_batch: bool = False, shrink: dict[str, Any] | None = None,
            weights: str | None = None, data: str | None = None, tokenizer: str | None = None,
            db: str | None = DEFAULT_DB, resume: bool = False, memory_cap_gib: float | None = None,
            hooks: bool = True, seed: int = 0, max_batch_cap: int = 256,
            separate_hooked_steps: bool | None = None, progress: Callable[[str], None] | None = None) -> ProfileResult:
    """Profile the scenario at each batch size (or search the largest that fits); see the module docstring."""
    require_torch(("bitsandbytes",) if scn.mix.method == "qlora" else ())
    import torch

    from .batches import LengthSampler, read_jsonl_lengths, tensors
    from .build import build_model
    from .environment import environment
    from .expert_load import ExpertLoad
    from .hooks import LayerTimer
    from .utilization import UtilizationSampler
    from .meters import MemoryMeter, is_oom
    from .max_batch import find_max_batch as search_max
    from ..store import Store

    if steps < 1 or warmup < 0:
        raise FtscopeError("--steps must be >= 1 and --warmup >= 0")
    if any(b < 1 for b in batch_sizes):
        raise FtscopeError("--batch-sizes must be positive integers")
    if memory_cap_gib is not None and not memory_cap_gib > 0:
        raise FtscopeError("--memory-cap-gib must be above 0")
    if (data is None) != (tokenizer is None):
        raise FtscopeError("--data and --tokenizer go together (a local JSONL and a local tokenizer.json)")
    dev = resolve_device(device)
    cuda = dev.startswith("cuda")
    torch.manual_seed(seed)
    say = progress or (lambda _msg: None)
    model, info = build_model(scn, device=dev, shrink=shrink, weights=weights)
    if info.config.get("vocab_size") is None:
        raise FtscopeError("the built config has no vocab_size")
    vocab = int(info.config.get("vocab_size"))
    opt = make_optimizer(model, scn)
    step = Stepper(model, opt, dev, info.autocast_dtype)
    lengths = read_jsonl_lengths(data, tokenizer) if data else None
    sampler = LengthSampler(scn, seed, lengths)
    gen = torch.Generator().manual_seed(seed)
    cap = int(memory_cap_gib * 2**30) if memory_cap_gib else None
    env = environment(dev)
    options = {"device": dev, "steps": steps, "warmup": warmup, "shrink": shrink, "data": data, "weights": weights,
               "memory_cap_gib": memory_cap_gib, "find_max_batch": find_max_batch, "seed": seed,
               "empty_cache_per_point": cuda}
    store = Store(db) if db else None
    run_id = None
    done: set[str] = set()
    if store is not None:
        run_id = store.start_run({"scenario": scn.to_dict(), "options": options, "build": asdict(info)}, env,
                                 sweep_id=sweep_id(scn, options), resume=resume)
        done = store.done_keys(run_id) if resume else set()
    result = ProfileResult(run_id=run_id, db=db, device=dev, build=asdict(info), environment=env)

    def estimate_for(b: int) -> dict[str, Any] | None:
        from ...estimate import estimate
        try:
            return estimate(built_scenario(scn, info.config, b), strict=False).to_dict()
        except FtscopeError:
            return None

    def one_step(shape: Any) -> None:
        step(tensors(shape, vocab, dev, gen))

    def measure(b: int) -> ProfilePoint:
        if cuda:
            # each point starts from an emptied cache, as a run at this batch size alone would: blocks cached
            # for earlier batch sizes otherwise raise its reserved peak (measured on an H200: +27 % at 8B b8)
            import gc
            gc.collect()
            torch.cuda.empty_cache()
        for _ in range(warmup):
            one_step(sampler.batch(b))
        # memory on the longest batch the run can see, in its own step (the CPU tracker slows timing)
        with MemoryMeter(dev, seed=(model, opt), cap_bytes=cap) as meter:
            one_step(sampler.worst(b))
        mem = meter.report.to_dict()
        # On CUDA the layer timer synchronizes at every module boundary, which makes a small step host-bound
        # (measured on an H200: 1B LoRA b1 0.136 s hooked); so there the timed steps run bare and the hooks
        # get steps of their own. On CPU synchronizing is free and the hooks ride along (+2 % measured).
        separate = hooks and (cuda if separate_hooked_steps is None else separate_hooked_steps)
        timer = LayerTimer(model) if hooks and not separate else None
        load = ExpertLoad(model) if hooks and not separate else None
        sampler_util = UtilizationSampler()
        fwd = bwd = optim = 0.0
        tokens = samples = padded = 0
        with sampler_util:
            wall0 = time.perf_counter()
            for _ in range(steps):
                shape = sampler.batch(b)
                f, bk, o = step(tensors(shape, vocab, dev, gen))
                fwd, bwd, optim = fwd + f, bwd + bk, optim + o
                tokens += shape.tokens
                samples += len(shape.lengths)
                padded += shape.padded_len
            wall = time.perf_counter() - wall0
        total = fwd + bwd + optim
        point = ProfilePoint(
            batch=b, status="ok", steps=steps, step_s=total / steps, wall_step_s=wall / steps,
            forward_s=fwd / steps, backward_s=bwd / steps,
            optimizer_s=optim / steps, tokens_per_s=tokens / total, samples_per_s=samples / total,
            padded_len_mean=padded / steps, memory=mem,
            utilization=asdict(sampler_util.summary()))
        hooked_steps = steps
        if separate:
            timer, load = LayerTimer(model), ExpertLoad(model)
            hooked_steps = min(steps, 2)
            hooked = 0.0
            for _ in range(hooked_steps):
                hooked += sum(step(tensors(sampler.batch(b), vocab, dev, gen)))
            point.hooked_step_s = hooked / hooked_steps
        if timer is not None:
            lt = timer.result()
            point.layer_times = {k: {kk: vv / hooked_steps for kk, vv in v.items()} if isinstance(v, dict) else v
                                 for k, v in lt.to_dict().items()}
            timer.remove()
        if load is not None:
            if load.is_moe:
                point.expert_load = load.to_dict()
            load.remove()
        return point

    for b in batch_sizes if not find_max_batch else ():
        key = f"batch={b}"
        if key in done:
            result.skipped.append(key)
            say(f"batch {b}: already in the store, skipped")
            continue
        say(f"batch {b}: {warmup} warm-up + {steps} timed steps")
        try:
            point = measure(b)
        except Exception as exc:  # noqa: BLE001 - an OOM or a failed point is recorded, the sweep goes on
            status = "oom" if is_oom(exc) else "error"
            if status == "error" and isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            point = ProfilePoint(batch=b, status=status, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:400] if str(exc) else ''}")
            opt.zero_grad(set_to_none=True)
            exc.__traceback__ = None
            import gc
            gc.collect()
        point.estimate = estimate_for(b)
        result.points.append(point)
        if store is not None:
            store.record_point(run_id, key, point.status, point.to_dict(), point.estimate)

    if find_max_batch:
        def try_batch(b: int) -> bool:
            with MemoryMeter(dev, seed=(model, opt), cap_bytes=cap):
                try:
                    one_step(sampler.worst(b))
                finally:
                    opt.zero_grad(set_to_none=True)
            return True

        def on_try(t: Any) -> None:
            say(f"max-batch search: batch {t.batch} {t.status}")
            if store is not None:
                store.record_point(run_id, f"maxbatch:try={t.batch}", t.status, asdict(t), None)

        found = search_max(try_batch, start=1, cap=max_batch_cap, on_try=on_try)
        est = estimate_for(1)
        result.max_batch = {**found.to_dict(), "estimate_max_micro_batch_size":
                            (est or {}).get("limits", {}).get("max_micro_batch_size") if cap is None else None}
        if store is not None:
            store.record_point(run_id, "maxbatch", "ok", result.max_batch, est)
    if store is not None:
        store.finish_run(run_id, "done")
    return result
