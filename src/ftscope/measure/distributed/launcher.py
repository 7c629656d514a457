"""profile across ranks: launch the scenario through torchrun on DeepSpeed ZeRO, torch FSDP2 or DDP.

`profile_distributed(scn, nproc=2)` runs `python -m torch.distributed.run` (torchrun) with
`ftscope.measure.distributed.worker` as the per-rank program; the engine follows the scenario's mix (zero_stage 1-3 with
offload -> DeepSpeed, fsdp -> FSDP2, otherwise DDP; see worker.py). Every rank measures, at every batch size,
peak tensor memory, forward / backward / optimizer time and time in collectives (torch.profiler), and writes a
JSON report; the launcher on node 0 stores ONE run with a point per (batch, rank) (`batch=B:rank=R`) and
ftscope's per-rank estimate for the model as built beside each point.

Failure is an answer, never a hang: the ranks run in their own process group; a rank that raises records its
error and exits, torchrun then stops its peers; a collective that never completes fails on the process-group
timeout; and `timeout_s` bounds the whole launch (torchrun's process group is terminated, then every rank
that reported its pid is killed). The run is then stored as failed with the first rank's error.

The DeepSpeed CPU accelerator JIT-compiles a small shared-memory extension on first use (tens of seconds to a
few minutes on 2 cores); its cache is kept in the project (`<project>/.cache/torch_extensions`).
"""
from __future__ import annotations

import json
import pickle
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from ...errors import FtscopeError
from ...spec.scenario import Scenario
from .. import require_torch
from ..runtime.as_built import built_scenario
from ..runtime.profile import DEFAULT_DB
from .results import DistributedResult, collect
from .torchrun import free_port, launch, rank_environment, read_reports

WORKER_MODULE = "ftscope.measure.distributed.worker"


def _check(nproc: int, nnodes: int, node_rank: int, steps: int, warmup: int, batch_sizes: Sequence[int],
           timeout_s: float) -> None:
    if nproc < 1 or nnodes < 1:
        raise FtscopeError("--nproc and --nnodes must be at least 1")
    if not 0 <= node_rank < nnodes:
        raise FtscopeError(f"--node-rank must be in 0..{nnodes - 1}")
    if steps < 1 or warmup < 0:
        raise FtscopeError("--steps must be >= 1 and --warmup >= 0")
    if not batch_sizes or any(int(b) < 1 for b in batch_sizes):
        raise FtscopeError("--batch-sizes must be positive integers")
    if timeout_s <= 0:
        raise FtscopeError("timeout must be above 0 seconds")


def _emit(result: DistributedResult, wscn: Scenario, batch: int, emit_dir: str | Path) -> None:
    """The launch configs of the run (the DeepSpeed JSON exactly as the ranks ran it) under emit_dir."""
    from ...plan.emit import emit

    config = (result.build or {}).get("config")
    paths = emit(built_scenario(wscn, config, batch) if config is not None else wscn, batch, emit_dir)
    if result.ds_config is not None:
        ds_path = Path(emit_dir) / "ds_config.json"
        ds_path.write_text(json.dumps(result.ds_config, indent=2) + "\n")
        if ds_path not in paths:
            paths.insert(0, ds_path)
    result.emitted = [str(p) for p in paths]


def _command(nproc: int, nnodes: int, node_rank: int, master_addr: str, port: int, scn_file: Path, out: Path,
             dev_kind: str, options: dict[str, Any], step_hook: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--nnodes={nnodes}",
           f"--node-rank={node_rank}", f"--master-addr={master_addr}", f"--master-port={port}", "--max-restarts=0",
           "-m", WORKER_MODULE, "--scenario", str(scn_file), "--out", str(out), "--device", dev_kind,
           "--steps", str(options["steps"]), "--warmup", str(options["warmup"]),
           "--batch-sizes", ",".join(map(str, options["batch_sizes"])), "--seed", str(options["seed"]),
           "--collective-timeout", str(options["collective_timeout_s"])]
    if options["shrink"]:
        cmd += ["--shrink", json.dumps(options["shrink"])]
    if options["ds_overrides"]:
        cmd += ["--ds-overrides", json.dumps(options["ds_overrides"])]
    if step_hook:
        cmd += ["--step-hook", step_hook]
    return cmd


def profile_distributed(scn: Scenario, nproc: int, nnodes: int = 1, node_rank: int = 0,
                        master_addr: str = "127.0.0.1", master_port: int | None = None, device: str = "auto",
                        steps: int = 2, warmup: int = 1, batch_sizes: Sequence[int] = (1, 2),
                        shrink: dict[str, Any] | None = None, db: str | None = DEFAULT_DB,
                        emit_dir: str | Path | None = None, timeout_s: float = 600,
                        progress: Callable[[str], None] | None = None, collective_timeout_s: float | None = None,
                        seed: int = 0, env: dict[str, str] | None = None,
                        ds_overrides: dict[str, Any] | None = None, step_hook: str | None = None) -> DistributedResult:
    """Profile the scenario on `nproc` ranks per node x `nnodes` nodes through torchrun (see the module docstring).

    Run it once per node with that node's `node_rank`; node 0 stores the run. `collective_timeout_s` (default:
    half of timeout_s, 60-300 s) is the process-group timeout; `env` adds variables for the ranks;
    `ds_overrides` is merged into the DeepSpeed config (and into the emitted ds_config.json); `step_hook`
    ('FILE.py:FUNCTION') is called by every rank before every training step (tests inject failures with it).
    """
    require_torch()
    from ..runtime.environment import environment
    from ..runtime.loop import resolve_device
    from ..runtime.profile import sweep_id
    from ..store import Store
    from .engines import engine_name

    _check(nproc, nnodes, node_rank, steps, warmup, batch_sizes, timeout_s)
    dev = resolve_device(device)
    dev_kind = "cuda" if dev.startswith("cuda") else "cpu"
    say = progress or (lambda _msg: None)
    wscn = scn.with_(gpus_per_node=nproc, nodes=nnodes)  # the estimate is per rank of this world
    batch_sizes = [int(b) for b in batch_sizes]
    coll_timeout = collective_timeout_s or max(60.0, min(300.0, timeout_s / 2))
    port = master_port or (free_port(master_addr) if nnodes == 1 else 29500)
    backend, engine = ("nccl" if dev_kind == "cuda" else "gloo"), engine_name(scn.mix)
    options = {"device": dev_kind, "nproc": nproc, "nnodes": nnodes, "world_size": nproc * nnodes, "engine": engine,
               "backend": backend, "steps": steps, "warmup": warmup, "batch_sizes": batch_sizes, "shrink": shrink,
               "seed": seed, "collective_timeout_s": coll_timeout, "timeout_s": timeout_s,
               "ds_overrides": ds_overrides}
    work = Path(tempfile.mkdtemp(prefix="ftscope-dist-"))
    (work / "scenario.pkl").write_bytes(pickle.dumps(wscn))
    out = work / "ranks"
    cmd = _command(nproc, nnodes, node_rank, master_addr, port, work / "scenario.pkl", out, dev_kind, options,
                   step_hook)
    store = Store(db) if (db and node_rank == 0) else None
    env_info = environment(dev)
    run_id = None if store is None else store.start_run({"scenario": wscn.to_dict(), "options": options}, env_info,
                                                        sweep_id=sweep_id(wscn, options))
    result = DistributedResult(run_id=run_id, db=db if store is not None else None, status="failed", error=None,
                               engine=engine, backend=backend, device=dev_kind, nproc=nproc, nnodes=nnodes,
                               node_rank=node_rank, world_size=nproc * nnodes, command=cmd, wall_s=0.0,
                               returncode=None, environment=env_info)
    say(f"torchrun: {nproc} x {nnodes} ranks, {engine} over {backend} (collective timeout {coll_timeout:.0f} s)")
    run = launch(cmd, rank_environment(dev_kind, env), work, out, timeout_s, say)
    result.wall_s, result.returncode, result.log_tail = run.wall_s, run.returncode, run.log[-60:]
    collect(result, read_reports(out), run, wscn, batch_sizes, timeout_s)
    if emit_dir is not None:
        _emit(result, wscn, batch_sizes[0], emit_dir)
    if store is not None and run_id is not None:
        for p in result.points:
            store.record_point(run_id, f"batch={p.batch}:rank={p.rank}", p.status, p.to_dict(),
                               result.estimates.get(p.batch))
        store.finish_run(run_id, result.status, result.error)
    say(f"{result.status} in {result.wall_s:.1f} s" + (f": {result.error}" if result.error else ""))
    shutil.rmtree(work, ignore_errors=True)
    return result
