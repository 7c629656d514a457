"""One rank of a distributed profile: `python -m ftscope.measure.dist_worker` under torchrun.

`measure.distributed.profile_distributed` launches this through torchrun; it is not meant to be run by hand.
Each rank builds the scenario's model (`build.build_model`), wraps it in the engine the mix names, runs the
same warm-up / memory / timed / profiled steps at every batch size, and writes what it measured to
`<out>/rank<R>.json` after every batch (atomic replace), so a rank that dies later still leaves its finished
points behind. At the end rank 0 gathers every rank's report into `<out>/all.json` (which also carries the
ranks of other nodes in a multi-node run).

Engines, chosen by the mix (the engines users train with, not imitations):
  zero_stage 1-3      DeepSpeed `deepspeed.initialize` with the config `plan.emit.deepspeed_config` writes, a
                      client torch AdamW (`zero_allow_untested_optimizer`); offload_optimizer / offload_param
                      from `mix.offload`; MoE blocks are ZeRO-3 leaf modules (`set_z3_leaf_modules`).
  fsdp                torch FSDP2: `fully_shard` on every decoder layer, then the root; reshard_after_forward
                      True for full_shard, False for shard_grad_op; bf16/fp16 mixed precision through
                      `MixedPrecisionPolicy`; optimizer+params offload through `CPUOffloadPolicy`.
  otherwise           torch DDP.
Backend gloo on CPU, NCCL on CUDA; every collective is bounded by the process-group timeout
(`--collective-timeout`), so a rank that stops answering turns into an error on its peers, not a hang.

Memory: CUDA uses the allocator counters (`MemoryMeter`). On CPU the dispatch-level TensorTracker is seeded with
every tensor the process holds when the window opens (gc), so engine-held buffers (DeepSpeed's flat partitions
and fp32 master weights, FSDP2's sharded parameters) are counted; two additions make it see sharded engines
the way a CUDA allocator would: DTensor outputs are counted by their local shard (the mode does not see the
local ops of a tensor subclass), and FSDP2's `alloc_storage` / `free_storage` (storage resizes, which bypass the
dispatcher) are reported to the tracker.

Time in collectives: one extra step under torch.profiler; the union of the intervals of every event whose name
matches COLLECTIVE_PATTERN (any thread; CUDA kernels too on GPUs), so nested or overlapping events count once.

Test hook: FTSCOPE_DIST_FAIL_RANK=r makes rank r fail after FTSCOPE_DIST_FAIL_AFTER (default 1) training steps,
by raising (FTSCOPE_DIST_FAIL_MODE=raise, the default), exiting without a word (exit) or hanging (hang).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import pickle
import re
import socket
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator

COLLECTIVE_PATTERN = r"all_?reduce|all_?gather|reduce_?scatter|broadcast|gloo|nccl"
"""Event names (case-insensitive) counted as time in collectives."""

_steps_done = 0


def _maybe_fail(rank: int) -> None:
    """The FTSCOPE_DIST_FAIL_* test hook, checked before every training step."""
    target = os.environ.get("FTSCOPE_DIST_FAIL_RANK")
    if target is None or int(target) != rank:
        return
    if _steps_done < int(os.environ.get("FTSCOPE_DIST_FAIL_AFTER", "1")):
        return
    mode = os.environ.get("FTSCOPE_DIST_FAIL_MODE", "raise")
    if mode == "exit":
        os._exit(3)
    if mode == "hang":
        while True:
            time.sleep(60)
    raise RuntimeError(f"injected failure on rank {rank} after {_steps_done} steps (FTSCOPE_DIST_FAIL_RANK)")


# -- engines ----------------------------------------------------------------------------------------------------

def engine_name(mix: Any) -> str:
    if mix.fsdp is not None:
        return "fsdp2"
    if mix.zero_stage > 0:
        return f"deepspeed-zero{mix.zero_stage}"
    return "ddp"


def _base_model(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def decoder_layers(model: Any) -> list[Any]:
    """The transformer blocks (the classes HF names in `_no_split_modules`)."""
    base = _base_model(model)
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise RuntimeError(f"{type(base).__name__} names no decoder-layer class (_no_split_modules) to shard")
    return layers


def moe_block_classes(model: Any) -> list[type]:
    """Classes of the modules that own an `experts` child (the MoE blocks)."""
    seen: dict[str, type] = {}
    for m in model.modules():
        if "experts" in dict(m.named_children()):
            seen.setdefault(type(m).__name__, type(m))
    return list(seen.values())


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v
    return base


def run_deepspeed_config(scn: Any, micro_batch: int, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """plan.emit's DeepSpeed config plus what running it with ftscope's client optimizer needs, then the
    caller's overrides (merged key by key)."""
    from ..plan.emit import deepspeed_config

    cfg = deepspeed_config(scn, micro_batch) or {}
    cfg["train_micro_batch_size_per_gpu"] = micro_batch
    cfg["zero_allow_untested_optimizer"] = True  # the client optimizer is torch AdamW (the CPU stack facts)
    if scn.mix.offload != "none":
        cfg["zero_force_ds_cpu_optimizer"] = False  # torch AdamW on the offloaded partition, not DeepSpeedCPUAdam
    cfg["steps_per_print"] = 10**9
    cfg["wall_clock_breakdown"] = False
    return _merge(cfg, overrides or {})


class Engine:
    """A wrapped model and the three timed parts of one training step."""

    def __init__(self, name: str, module: Any, optimizer: Any, device: str, autocast: Any,
                 ds_engine: Any = None) -> None:
        import torch

        self.torch, self.name, self.module, self.opt, self.device = torch, name, module, optimizer, device
        self.autocast, self.ds = autocast, ds_engine

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def _forward(self, batch: dict[str, Any]) -> Any:
        if self.ds is not None:
            return self.ds(**batch).loss
        if self.autocast is not None:
            dev_type = "cuda" if self.device.startswith("cuda") else "cpu"
            with self.torch.autocast(device_type=dev_type, dtype=self.autocast):
                return self.module(**batch).loss
        return self.module(**batch).loss

    def step(self, batches: list[dict[str, Any]], mark: Callable[[str], None] | None = None
             ) -> tuple[float, float, float]:
        """One optimizer step over the micro-batches (gradient accumulation): summed forward, backward and
        optimizer seconds. `mark(phase)` is called after each phase, outside the timed parts. DDP skips the
        all-reduce on all but the last micro-batch (no_sync, as accelerate does); DeepSpeed accumulates itself
        (gradient_accumulation_steps in its config); FSDP2 reduce-scatters every micro-batch into sharded grads."""
        global _steps_done
        mark = mark or (lambda _phase: None)
        fwd = bwd = opt = 0.0
        n = len(batches)
        for i, batch in enumerate(batches):
            last = i == n - 1
            sync = self.module.no_sync() if (self.name == "ddp" and not last) else contextlib.nullcontext()
            with sync:
                self._sync()
                t0 = time.perf_counter()
                loss = self._forward(batch)
                if self.ds is None and n > 1:
                    loss = loss / n  # DeepSpeed scales by its own gradient_accumulation_steps
                self._sync()
                fwd += time.perf_counter() - t0
                mark("forward")
                t0 = time.perf_counter()
                if self.ds is not None:
                    self.ds.backward(loss)
                else:
                    loss.backward()
                self._sync()
                bwd += time.perf_counter() - t0
                mark("backward")
            if self.ds is not None:  # every micro-step: DeepSpeed steps the optimizer at the boundary only
                t0 = time.perf_counter()
                self.ds.step()
                self._sync()
                opt += time.perf_counter() - t0
        if self.ds is None:
            t0 = time.perf_counter()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self._sync()
            opt += time.perf_counter() - t0
        mark("optimizer")
        _steps_done += 1
        return fwd, bwd, opt


def make_engine(scn: Any, model: Any, info: Any, device: str, micro_batch: int, timeout_s: float,
                notes: list[str], ds_overrides: dict[str, Any] | None = None) -> tuple[Engine, dict[str, Any] | None]:
    """Wrap the built model in the mix's engine; returns (engine, the DeepSpeed config used or None)."""
    import torch

    from .profile import make_optimizer

    mix = scn.mix
    name = engine_name(mix)
    autocast = getattr(torch, info.autocast_dtype) if info.autocast_dtype else None
    if name.startswith("deepspeed"):
        import deepspeed
        from datetime import timedelta

        deepspeed.init_distributed(dist_backend="nccl" if device.startswith("cuda") else "gloo",
                                   timeout=timedelta(seconds=timeout_s), verbose=False)
        cfg = run_deepspeed_config(scn, micro_batch, ds_overrides)
        if mix.zero_stage == 3 and scn.model.is_moe:
            classes = moe_block_classes(model)
            if classes:
                deepspeed.utils.set_z3_leaf_modules(model, classes)
                notes.append("ZeRO-3 leaf modules: " + ", ".join(c.__name__ for c in classes))
        if mix.optimizer != "adamw":
            notes.append(f"optimizer {mix.optimizer} passed to DeepSpeed as a client optimizer")
        opt = make_optimizer(model, scn)
        ds, ds_opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
        return Engine(name, ds.module, ds_opt, device, None, ds_engine=ds), cfg
    if name == "fsdp2":
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        kwargs: dict[str, Any] = {"reshard_after_forward": mix.fsdp == "full_shard"}
        if info.autocast_dtype is not None:
            dtype = getattr(torch, info.autocast_dtype)  # accelerate's FSDP2 policy: param and reduce dtype
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
            autocast = None  # FSDP2 casts the gathered parameters itself
        if mix.offload == "optimizer+params":
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device.startswith("cuda"))
        elif mix.offload == "optimizer":
            notes.append("FSDP2 has no optimizer-only offload: optimizer state stays on the device")
        for layer in decoder_layers(model):
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
        opt = make_optimizer(model, scn)
        return Engine(name, model, opt, device, autocast), None
    from torch.nn.parallel import DistributedDataParallel

    ids = [torch.device(device).index] if device.startswith("cuda") else None
    ddp = DistributedDataParallel(model, device_ids=ids)
    opt = make_optimizer(model, scn)
    return Engine(name, ddp, opt, device, autocast), None


# -- memory -----------------------------------------------------------------------------------------------------

_TRACKER_CLASS: Any = None


def _tracker_class() -> Any:
    """TensorTracker that counts DTensors by their local shard and can be told about storage resizes."""
    global _TRACKER_CLASS
    if _TRACKER_CLASS is None:
        from torch.distributed.tensor import DTensor

        from .memory import TensorTracker

        def local(x: Any) -> Any:
            if isinstance(x, DTensor):
                return x._local_tensor
            if isinstance(x, (tuple, list)) and any(isinstance(o, (DTensor, tuple, list)) for o in x):
                return [local(o) for o in x]
            return x

        class ShardAwareTracker(TensorTracker):
            def _register(self, t: Any) -> None:
                super()._register(local(t))

            def _after_op(self, out: Any) -> None:
                super()._after_op(local(out))

            def resized(self, t: Any) -> None:
                """A storage changed size outside the dispatcher (FSDP2 alloc_storage / free_storage)."""
                st = t.untyped_storage()
                key, n = st._cdata, st.nbytes()
                entry = self._storages.get(key)
                delta = n - (entry[1] if entry is not None else 0)
                if delta:
                    self._commit(st, key, delta)
                    self.peak_bytes = max(self.peak_bytes, self.live_bytes)

        _TRACKER_CLASS = ShardAwareTracker
    return _TRACKER_CLASS


@contextlib.contextmanager
def _fsdp_resize_hooks(tracker: Any) -> Iterator[None]:
    """Report FSDP2's storage resizes to the tracker while it runs (they bypass the dispatcher)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    saved = (_fsdp_param.alloc_storage, _fsdp_param.free_storage, _fsdp_param_group.alloc_storage)

    def alloc(t: Any) -> None:
        saved[0](t)
        tracker.resized(t)

    def free(t: Any) -> None:
        saved[1](t)
        tracker.resized(t)

    _fsdp_param.alloc_storage, _fsdp_param.free_storage, _fsdp_param_group.alloc_storage = alloc, free, alloc
    try:
        yield
    finally:
        _fsdp_param.alloc_storage, _fsdp_param.free_storage, _fsdp_param_group.alloc_storage = saved


def live_tensors() -> list[Any]:
    """Every tensor Python can reach right now (after a collection)."""
    import torch

    gc.collect()
    tensor = torch.Tensor
    return [o for o in gc.get_objects() if issubclass(type(o), tensor)]  # type(): no __class__ look-ups


def static_breakdown(engine: Engine, model: Any) -> dict[str, int]:
    """Bytes of the tensor storages alive between steps, by what holds them: weights (parameters, ZeRO-3
    partitions), gradients, optimizer (state and master copies), other (engine buffers, caches)."""
    import torch
    from torch.distributed.tensor import DTensor

    seen: set[int] = set()
    out = {"weights": 0, "gradients": 0, "optimizer": 0, "other": 0}

    def add(t: Any, cat: str) -> None:
        if not isinstance(t, torch.Tensor):
            return
        if isinstance(t, DTensor):
            t = t._local_tensor
        if t.is_meta:
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        if st._cdata in seen:
            return
        seen.add(st._cdata)
        out[cat] += st.nbytes()

    params = list(model.parameters())
    for p in params:
        add(p, "weights")
        add(getattr(p, "ds_tensor", None), "weights")
    for p in params:
        add(p.grad, "gradients")
    opt = engine.opt
    base = getattr(opt, "optimizer", opt)  # DeepSpeed wraps the client optimizer
    for o in {id(opt): opt, id(base): base}.values():
        for st in getattr(o, "state", {}).values():
            for v in (st.values() if isinstance(st, dict) else ()):
                add(v, "optimizer")
        for group in getattr(o, "param_groups", ()):
            for p in group["params"]:
                add(p, "optimizer")  # ZeRO's fp32 master partitions (model params were counted above)
                add(p.grad, "gradients")
    for t in live_tensors():
        add(t, "other")
    return out


@contextlib.contextmanager
def measure_memory(device: str, fsdp: bool) -> Iterator[dict[str, Any]]:
    """Peak memory over the block: CUDA allocator counters, or the shard-aware tracker seeded with every live
    tensor. Yields a dict whose "mark" entry, called with a phase name at the end of each phase, records the
    peak of that phase in "phase_peak_bytes"; after the block the dict holds the MemoryReport fields."""
    import torch

    from .memory import MemoryReport, peak_rss_bytes, reset_peak_rss, rss_bytes

    phases: dict[str, int] = {}
    box: dict[str, Any] = {}
    windowed = reset_peak_rss()
    rss0 = rss_bytes()
    if device.startswith("cuda"):
        idx = torch.device(device).index
        torch.cuda.synchronize(idx)
        torch.cuda.reset_peak_memory_stats(idx)
        start = int(torch.cuda.memory_allocated(idx))
        peak_reserved = 0

        def mark(phase: str) -> None:
            nonlocal peak_reserved
            torch.cuda.synchronize(idx)
            phases[phase] = max(phases.get(phase, 0), int(torch.cuda.max_memory_allocated(idx)))
            peak_reserved = max(peak_reserved, int(torch.cuda.max_memory_reserved(idx)))
            torch.cuda.reset_peak_memory_stats(idx)

        box["mark"] = mark
        yield box
        mark("end")
        peak = max(phases.values())
        phases.pop("end")
        report = MemoryReport(device=device, method="cuda-allocator", peak_allocated_bytes=peak,
                              peak_reserved_bytes=peak_reserved, start_allocated_bytes=start,
                              end_allocated_bytes=int(torch.cuda.memory_allocated(idx)), rss_start_bytes=rss0,
                              rss_peak_bytes=peak_rss_bytes(), rss_peak_is_windowed=windowed)
    else:
        tracker = _tracker_class()(*live_tensors())
        start = tracker.live_bytes

        def mark(phase: str) -> None:
            phases[phase] = max(phases.get(phase, 0), tracker.peak_bytes)
            tracker.reset_peak()

        box["mark"] = mark
        hooks = _fsdp_resize_hooks(tracker) if fsdp else contextlib.nullcontext()
        with hooks, tracker:
            yield box
        mark("end")
        peak = max(phases.values())
        phases.pop("end")
        report = MemoryReport(device="cpu", method="dispatch-tracker", peak_allocated_bytes=peak,
                              peak_reserved_bytes=None, start_allocated_bytes=start,
                              end_allocated_bytes=tracker.live_bytes, rss_start_bytes=rss0,
                              rss_peak_bytes=peak_rss_bytes(), rss_peak_is_windowed=windowed)
    box.pop("mark")
    box.update(report.to_dict())
    box["phase_peak_bytes"] = phases
    box["peak_phase"] = max(phases, key=phases.get)


# -- collectives ------------------------------------------------------------------------------------------------

def collective_time(step: Callable[[], Any], device: str) -> dict[str, Any]:
    """Run `step` once under torch.profiler; time in events matching COLLECTIVE_PATTERN (union of intervals)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    pat = re.compile(COLLECTIVE_PATTERN, re.IGNORECASE)
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        step()
    wall = time.perf_counter() - t0
    spans: list[tuple[float, float]] = []
    by_name: dict[str, dict[str, float]] = {}
    for ev in prof.events():
        if not pat.search(ev.name):
            continue
        start, end = ev.time_range.start, ev.time_range.end
        spans.append((start, end))
        d = by_name.setdefault(ev.name, {"count": 0, "total_s": 0.0})
        d["count"] += 1
        d["total_s"] += (end - start) / 1e6
    spans.sort()
    total = 0.0
    cur_s = cur_e = None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    top = dict(sorted(by_name.items(), key=lambda kv: -kv[1]["total_s"])[:12])
    return {"pattern": COLLECTIVE_PATTERN, "collective_s": total / 1e6, "profiled_step_s": wall,
            "fraction": (total / 1e6) / wall if wall > 0 else None, "events": top,
            "note": "one extra step under torch.profiler; union of matching event intervals on every thread"}


# -- the rank's run ---------------------------------------------------------------------------------------------

def _write(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, default=str))
    os.replace(tmp, path)


def _error_text(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0][:600] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"


def run(args: argparse.Namespace) -> int:
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"rank{rank}.json"
    doc: dict[str, Any] = {"rank": rank, "local_rank": local_rank, "world_size": world,
                           "node_rank": int(os.environ.get("GROUP_RANK", "0")), "host": socket.gethostname(),
                           "pid": os.getpid(), "status": "starting", "points": [], "notes": [], "error": None}
    _write(path, doc)
    t_start = time.perf_counter()

    def say(msg: str) -> None:
        if rank == 0:
            print(f"ftscope[rank 0] {time.perf_counter() - t_start:6.1f}s: {msg}", flush=True)

    try:
        import torch
        import torch.distributed as dist
        from datetime import timedelta

        from .batches import LengthSampler, tensors
        from .build import build_model

        scn = pickle.loads(Path(args.scenario).read_bytes())
        shrink = json.loads(args.shrink) if args.shrink else None
        batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
        cuda = args.device.startswith("cuda")
        if cuda:
            torch.cuda.set_device(local_rank)
            device = f"cuda:{local_rank}"
        else:
            device = "cpu"
        backend = "nccl" if cuda else "gloo"
        doc.update(device=device, backend=backend, engine=engine_name(scn.mix), status="running")
        say("imports done")
        dist.init_process_group(backend, timeout=timedelta(seconds=args.collective_timeout),
                                **({"device_id": torch.device(device)} if cuda else {}))
        say(f"{backend} process group up, world size {world}; building {scn.model.name}")
        torch.manual_seed(args.seed)
        model, info = build_model(scn, device=device, shrink=shrink)
        doc["build"] = asdict(info)
        vocab = int(info.config.get("vocab_size") or info.config.get("text_config", {}).get("vocab_size"))
        from .profile import built_scenario

        # the DeepSpeed bucket sizes follow the model as built (plan.emit reads its hidden size)
        run_scn = built_scenario(scn, info.config, batch_sizes[0])
        engine, ds_cfg = make_engine(run_scn, model, info, device, batch_sizes[0], args.collective_timeout,
                                     doc["notes"], json.loads(args.ds_overrides) if args.ds_overrides else None)
        doc["ds_config"] = ds_cfg
        _write(path, doc)
        say(f"{engine.name} ready")
        sampler = LengthSampler(scn, args.seed)
        gen = torch.Generator().manual_seed(args.seed + rank)  # data parallel: each rank its own samples

        gas = int(scn.workload.gradient_accumulation)

        def batches(b: int, worst: bool = False) -> tuple[list[dict[str, Any]], list[Any]]:
            shapes = [sampler.worst(b) if worst else sampler.batch(b) for _ in range(gas)]
            return [tensors(sh, vocab, device, gen) for sh in shapes], shapes

        def one(b: int, worst: bool = False, mark: Any = None) -> tuple[tuple[float, float, float], list[Any]]:
            _maybe_fail(rank)
            data, shapes = batches(b, worst)
            return engine.step(data, mark), shapes

        for b in batch_sizes:
            say(f"batch {b} x {gas} micro-batches: {args.warmup} warm-up + 1 memory + {args.steps} timed + 1 "
                "profiled steps")
            doc["current_batch"] = b
            for _ in range(args.warmup):
                one(b)
            static = static_breakdown(engine, model)
            with measure_memory(device, engine.name == "fsdp2") as mem:
                one(b, worst=True, mark=mem["mark"])
            fwd = bwd = opt_s = 0.0
            tokens = samples = padded = 0
            wall0 = time.perf_counter()
            for _ in range(args.steps):
                (f, bk, o), shapes = one(b)
                fwd, bwd, opt_s = fwd + f, bwd + bk, opt_s + o
                tokens += sum(sh.tokens for sh in shapes)
                samples += sum(len(sh.lengths) for sh in shapes)
                padded += sum(sh.padded_len for sh in shapes) / gas
            wall = time.perf_counter() - wall0
            coll = collective_time(lambda: one(b), device)
            total = fwd + bwd + opt_s
            n = args.steps
            doc["points"].append({
                "batch": b, "rank": rank, "status": "ok", "engine": engine.name, "steps": n,
                "gradient_accumulation": gas,
                "step_s": total / n, "wall_step_s": wall / n, "forward_s": fwd / n, "backward_s": bwd / n,
                "optimizer_s": opt_s / n, "tokens_per_s": tokens / total, "samples_per_s": samples / total,
                "padded_len_mean": padded / n, "memory": dict(mem), "static_bytes": static, "collectives": coll,
            })
            doc.pop("current_batch", None)
            _write(path, doc)
        doc["status"] = "ok"
        _write(path, doc)
        gathered: list[Any] = [None] * world if rank == 0 else []
        dist.gather_object(doc, gathered if rank == 0 else None, dst=0)
        if rank == 0:
            _write(out / "all.json", {"ranks": gathered})
        say("done")
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure is reported in the rank file, then the rank exits
        doc["status"] = "error"
        doc["error"] = {"message": _error_text(exc), "traceback": traceback.format_exc()[-4000:],
                        "batch": doc.get("current_batch"), "time": time.time()}
        _write(path, doc)
        print(f"ftscope[rank {rank}]: failed: {_error_text(exc)}", file=sys.stderr, flush=True)
        return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ftscope.measure.dist_worker", description=__doc__.splitlines()[0])
    p.add_argument("--scenario", required=True, help="pickled Scenario written by profile_distributed")
    p.add_argument("--out", required=True, help="folder for rank<R>.json and all.json")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--batch-sizes", default="1")
    p.add_argument("--shrink", default=None, help="JSON object of build.apply_shrink keys")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ds-overrides", default=None, help="JSON merged into the DeepSpeed config")
    p.add_argument("--collective-timeout", type=float, default=300.0, help="process-group timeout, seconds")
    args = p.parse_args(argv)
    code = run(args)
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        os._exit(code)  # skip interpreter teardown: a peer may hold this rank in a collective
    return code


if __name__ == "__main__":
    sys.exit(main())
