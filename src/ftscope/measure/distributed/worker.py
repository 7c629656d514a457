"""One rank of a distributed profile: `python -m ftscope.measure.distributed.worker` under torchrun.

`measure.distributed.profile_distributed` launches this through torchrun; it is not meant to be run by hand.
Each rank builds the scenario's model (`build.build_model`), wraps it in the engine the mix names, runs the
same warm-up / memory / timed / profiled steps at every batch size, and writes what it measured to
`<out>/rank<R>.json` after every batch (atomic replace), so a rank that dies later still leaves its finished
points behind. At the end rank 0 gathers every rank's report into `<out>/all.json` (which also carries the
ranks of other nodes in a multi-node run).

Engines (measure/engines.py), chosen by the mix (the engines users train with, not imitations):
  zero_stage 1-3      DeepSpeed `deepspeed.initialize` with the config `plan.emit.deepspeed_config` writes, a
                      client torch AdamW (`zero_allow_untested_optimizer`); offload_optimizer / offload_param
                      from `mix.offload`; MoE blocks are ZeRO-3 leaf modules (`set_z3_leaf_modules`).
  fsdp                torch FSDP2: `fully_shard` on every decoder layer, then the root; reshard_after_forward
                      True for full_shard, False for shard_grad_op; bf16/fp16 mixed precision through
                      `MixedPrecisionPolicy`; optimizer+params offload through `CPUOffloadPolicy`.
  otherwise           torch DDP.
Backend gloo on CPU, NCCL on CUDA; every collective is bounded by the process-group timeout
(`--collective-timeout`), so a rank that stops answering turns into an error on its peers, not a hang.

Memory and collective time are measured by measure/rank_metrics.py. Memory: CUDA uses the allocator counters
(`MemoryMeter`). On CPU the dispatch-level TensorTracker is seeded with
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
import json
import os
import pickle
import socket
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import engines
from .engines import engine_name, make_engine
from .rank_metrics import collective_time, measure_memory, static_breakdown


def _maybe_fail(rank: int) -> None:
    """The FTSCOPE_DIST_FAIL_* test hook, checked before every training step."""
    target = os.environ.get("FTSCOPE_DIST_FAIL_RANK")
    if target is None or int(target) != rank:
        return
    if engines.steps_done < int(os.environ.get("FTSCOPE_DIST_FAIL_AFTER", "1")):
        return
    mode = os.environ.get("FTSCOPE_DIST_FAIL_MODE", "raise")
    if mode == "exit":
        os._exit(3)
    if mode == "hang":
        while True:
            time.sleep(60)
    raise RuntimeError(f"injected failure on rank {rank} after {engines.steps_done} steps (FTSCOPE_DIST_FAIL_RANK)")


# -- engines ----------------------------------------------------------------------------------------------------

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

        from ..runtime.batches import LengthSampler, tensors
        from ..runtime.build import build_model

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
        from ..runtime.profile import built_scenario

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
    p = argparse.ArgumentParser(prog="python -m ftscope.measure.distributed.worker", description=__doc__.splitlines()[0])
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
