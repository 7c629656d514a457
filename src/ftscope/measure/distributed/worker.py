"""One rank of a distributed profile: `python -m ftscope.measure.distributed.worker` under torchrun.

`measure.distributed.launcher.profile_distributed` launches this through torchrun; it is not meant to be run by
hand. Each rank builds the scenario's model (`runtime.build.build_model`), wraps it in the engine the mix names,
runs the same warm-up / memory / timed / profiled steps at every batch size (the timed ones through
`runtime.loop.timed_steps`), and writes what it measured to `<out>/rank<R>.json` after every batch (atomic
replace), so a rank that dies later still leaves its finished points behind. At the end rank 0 gathers every
rank's report into `<out>/all.json` (which also carries the ranks of other nodes in a multi-node run).

Engines (engines.py), chosen by the mix (the engines users train with, not imitations):
  zero_stage 1-3      DeepSpeed `deepspeed.initialize` with the config `plan.emit.deepspeed_config` writes, a
                      client torch AdamW (`zero_allow_untested_optimizer`); offload_optimizer / offload_param
                      from `mix.offload`; MoE blocks are ZeRO-3 leaf modules (`set_z3_leaf_modules`).
  fsdp                torch FSDP2: `fully_shard` on every decoder layer, then the root; reshard_after_forward
                      True for full_shard, False for shard_grad_op; bf16/fp16 mixed precision through
                      `MixedPrecisionPolicy`; optimizer+params offload through `CPUOffloadPolicy`.
  otherwise           torch DDP.
Backend gloo on CPU, NCCL on CUDA; every collective is bounded by the process-group timeout
(`--collective-timeout`), so a rank that stops answering turns into an error on its peers, not a hang.

Memory and collective time are measured by rank_metrics.py. Memory: CUDA uses the allocator counters. On CPU
the dispatch-level TensorTracker is seeded with every tensor the process holds when the window opens (gc), so
engine-held buffers (DeepSpeed's flat partitions and fp32 master weights, FSDP2's sharded parameters) are
counted; two additions make it see sharded engines the way a CUDA allocator would: DTensor outputs are counted
by their local shard (the mode does not see the local ops of a tensor subclass), and FSDP2's `alloc_storage` /
`free_storage` (storage resizes, which bypass the dispatcher) are reported to the tracker.

Time in collectives: one extra step under torch.profiler; the union of the intervals of every event whose name
matches COLLECTIVE_PATTERN (any thread; CUDA kernels too on GPUs), so nested or overlapping events count once.

`--step-hook FILE.py:FUNCTION` (or MODULE:FUNCTION) is called before every training step with (rank, optimizer
steps done so far); the tests inject a failing or hanging rank through it.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import pickle
import socket
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from ..runtime.loop import RankPoint, error_text, timed_steps
from .engines import engine_name, make_engine
from .rank_metrics import collective_time, measure_memory, static_breakdown

StepHook = Callable[[int, int], None]


def load_step_hook(spec: str | None) -> StepHook | None:
    """'path/to/file.py:function' or 'package.module:function' -> that function (None for None)."""
    if not spec:
        return None
    where, _, name = spec.rpartition(":")
    if where.endswith(".py"):
        loader = importlib.util.spec_from_file_location(Path(where).stem, where)
        if loader is None or loader.loader is None:
            raise ImportError(f"cannot load the step hook file {where}")
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, name)


class RankReport:
    """This rank's report, `<out>/rank<R>.json`, rewritten atomically whenever it changes."""

    def __init__(self, out: Path) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / f"rank{self.rank}.json"
        self.doc: dict[str, Any] = {"rank": self.rank, "local_rank": self.local_rank, "world_size": self.world,
                                    "node_rank": int(os.environ.get("GROUP_RANK", "0")),
                                    "host": socket.gethostname(), "pid": os.getpid(), "status": "starting",
                                    "points": [], "notes": [], "error": None}
        self.t_start = time.perf_counter()
        self.write()

    def write(self, path: Path | None = None, doc: dict[str, Any] | None = None) -> None:
        path = path or self.path
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc if doc is not None else self.doc, default=str))
        os.replace(tmp, path)

    def say(self, msg: str) -> None:
        if self.rank == 0:
            print(f"ftscope[rank 0] {time.perf_counter() - self.t_start:6.1f}s: {msg}", flush=True)

    def fail(self, exc: BaseException) -> None:
        self.doc["status"] = "error"
        self.doc["error"] = {"message": error_text(exc), "traceback": traceback.format_exc()[-4000:],
                             "batch": self.doc.get("current_batch"), "time": time.time()}
        self.write()
        print(f"ftscope[rank {self.rank}]: failed: {error_text(exc)}", file=sys.stderr, flush=True)


@dataclass
class RankRun:
    """The rank's wrapped model and its batches."""

    rank: int
    device: str
    engine: Any
    """engines.Engine: a Stepper over the wrapped model."""
    model: Any
    batches: Any
    """runtime.batches.SyntheticBatches, seeded per rank (data parallel: each rank its own samples)."""
    micro_batches: int
    """Gradient accumulation: micro-batches per optimizer step."""
    hook: StepHook | None = None

    def step(self, b: int, worst: bool = False, mark: Any = None) -> tuple[tuple[float, float, float], list[Any]]:
        if self.hook is not None:
            self.hook(self.rank, self.engine.steps_done)
        data, shapes = self.batches.draw(b, self.micro_batches, worst)
        return self.engine.step(data, mark), shapes


def start(args: argparse.Namespace, report: RankReport) -> RankRun:
    """Join the process group, build the model and wrap it in the mix's engine."""
    import torch
    import torch.distributed as dist
    from datetime import timedelta

    from ..runtime.as_built import built_scenario
    from ..runtime.batches import LengthSampler, SyntheticBatches
    from ..runtime.build import build_model

    scn = pickle.loads(Path(args.scenario).read_bytes())
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(report.local_rank)
    device = f"cuda:{report.local_rank}" if cuda else "cpu"
    backend = "nccl" if cuda else "gloo"
    report.doc.update(device=device, backend=backend, engine=engine_name(scn.mix), status="running")
    report.say("imports done")
    dist.init_process_group(backend, timeout=timedelta(seconds=args.collective_timeout),
                            **({"device_id": torch.device(device)} if cuda else {}))
    report.say(f"{backend} process group up, world size {report.world}; building {scn.model.name}")
    torch.manual_seed(args.seed)
    model, info = build_model(scn, device=device, shrink=json.loads(args.shrink) if args.shrink else None)
    report.doc["build"] = asdict(info)
    # the DeepSpeed bucket sizes follow the model as built (plan.emit reads its hidden size)
    run_scn = built_scenario(scn, info.config, batch_sizes[0])
    engine, ds_cfg = make_engine(run_scn, model, info, device, batch_sizes[0], args.collective_timeout,
                                 report.doc["notes"], json.loads(args.ds_overrides) if args.ds_overrides else None)
    report.doc["ds_config"] = ds_cfg
    report.write()
    report.say(f"{engine.name} ready")
    batches = SyntheticBatches(LengthSampler(scn, args.seed), int(info.vocab_size), device,
                               torch.Generator().manual_seed(args.seed + report.rank))
    return RankRun(report.rank, device, engine, model, batches, int(scn.workload.gradient_accumulation),
                   load_step_hook(args.step_hook))


def measure_batch(run: RankRun, b: int, steps: int, warmup: int) -> RankPoint:
    """Warm-up steps, one memory step on the longest batch (peaks per phase), timed steps, one profiled step."""
    for _ in range(warmup):
        run.step(b)
    static = static_breakdown(run.engine, run.model)
    with measure_memory(run.device, run.engine.name == "fsdp2") as mem:
        run.step(b, worst=True, mark=mem["mark"])
    totals = timed_steps(lambda _: run.step(b), range(steps))
    coll = collective_time(lambda: run.step(b), run.device)
    return RankPoint(batch=b, status="ok", **totals.point_fields(), memory=dict(mem), rank=run.rank,
                     engine=run.engine.name, gradient_accumulation=run.micro_batches, static_bytes=static,
                     collectives=coll)


def run(args: argparse.Namespace) -> int:
    report = RankReport(Path(args.out))
    try:
        import torch.distributed as dist

        rank_run = start(args, report)
        for b in (int(x) for x in args.batch_sizes.split(",")):
            report.say(f"batch {b} x {rank_run.micro_batches} micro-batches: {args.warmup} warm-up + 1 memory + "
                       f"{args.steps} timed + 1 profiled steps")
            report.doc["current_batch"] = b
            report.doc["points"].append(measure_batch(rank_run, b, args.steps, args.warmup).to_dict())
            report.doc.pop("current_batch", None)
            report.write()
        report.doc["status"] = "ok"
        report.write()
        gathered: list[Any] = [None] * report.world if report.rank == 0 else []
        dist.gather_object(report.doc, gathered if report.rank == 0 else None, dst=0)
        if report.rank == 0:
            report.write(report.out / "all.json", {"ranks": gathered})
        report.say("done")
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure is reported in the rank file, then the rank exits
        report.fail(exc)
        return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ftscope.measure.distributed.worker",
                                description=__doc__.splitlines()[0])
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
    p.add_argument("--step-hook", default=None, help="FILE.py:FUNCTION called before every training step with "
                                                     "(rank, steps done)")
    args = p.parse_args(argv)
    code = run(args)
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        os._exit(code)  # skip interpreter teardown: a peer may hold this rank in a collective
    return code


if __name__ == "__main__":
    sys.exit(main())
