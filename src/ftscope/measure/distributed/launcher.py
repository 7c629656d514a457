"""profile across ranks: launch the scenario through torchrun on DeepSpeed ZeRO, torch FSDP2 or DDP.

`profile_distributed(scn, nproc=2)` runs `python -m torch.distributed.run` (torchrun) with
`ftscope.measure.distributed.worker` as the per-rank program; the engine follows the scenario's mix (zero_stage 1-3 with
offload -> DeepSpeed, fsdp -> FSDP2, otherwise DDP; see dist_worker). Every rank measures, at every batch size,
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
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ...errors import FtscopeError
from ...spec.scenario import Scenario
from .. import require_torch
from ..runtime.profile import DEFAULT_DB

WORKER_MODULE = "ftscope.measure.distributed.worker"


@dataclass
class DistributedResult:
    """One distributed profile: a point per (batch, rank), the estimate per batch, and how the launch ended."""

    run_id: int | None
    """Store run id (None when nothing was stored: db=None, or a node other than 0)."""
    db: str | None
    status: str
    """done | failed"""
    error: str | None
    """The first rank error ('rank 1: RuntimeError: ...'), a timeout, or torchrun's own failure."""
    engine: str
    """ddp | deepspeed-zero1..3 | fsdp2"""
    backend: str
    """gloo | nccl"""
    device: str
    nproc: int
    nnodes: int
    node_rank: int
    world_size: int
    command: list[str]
    wall_s: float
    returncode: int | None
    """torchrun's exit status (None: killed on timeout)."""
    build: dict[str, Any] | None = None
    """BuildInfo of rank 0's model."""
    environment: dict[str, Any] = field(default_factory=dict)
    points: list[dict[str, Any]] = field(default_factory=list)
    """Per (batch, rank): what dist_worker measured (memory, times, collectives, static_bytes), or an error."""
    estimates: dict[int, Any] = field(default_factory=dict)
    """Batch -> ftscope's per-rank estimate (Estimate.to_dict() plus memory.allocated_bytes / breakdown_bytes)."""
    ds_config: dict[str, Any] | None = None
    """The DeepSpeed config the ranks ran with."""
    emitted: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    log_tail: list[str] = field(default_factory=list)
    """The last lines torchrun and the ranks printed."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["estimates"] = {str(k): v for k, v in self.estimates.items()}
        return d

    def memory_rows(self) -> list[dict[str, Any]]:
        """Per (batch, rank): measured peak tensor bytes vs the estimate's per-rank tensor bytes, and % error.

        On CPU the device is the host, so what an offloading engine moves "to the CPU" is still counted by the
        tracker: there the estimate compared is device bytes + the estimate's CPU-offload bytes."""
        rows = []
        for p in self.points:
            if p.get("status") != "ok":
                continue
            est = (self.estimates.get(p["batch"]) or {}).get("memory", {})
            measured = p["memory"]["peak_allocated_bytes"]
            predicted = est.get("allocated_bytes")
            if predicted is not None and self.device == "cpu":
                predicted += est.get("cpu_offload_bytes") or 0.0
            rows.append({"batch": p["batch"], "rank": p["rank"], "measured_bytes": measured,
                         "estimated_bytes": predicted,
                         "error_pct": None if not predicted else 100.0 * (predicted - measured) / measured,
                         "step_s": p.get("step_s"), "collective_s": (p.get("collectives") or {}).get("collective_s")})
        return rows


def project_root() -> Path:
    """The source checkout ftscope runs from (where pyproject.toml sits), else the working directory."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "src" / "ftscope").is_dir():
            return parent
    return Path.cwd()


def extensions_dir() -> Path:
    """Where DeepSpeed's JIT-compiled ops are cached: $TORCH_EXTENSIONS_DIR, else <project>/.cache/torch_extensions."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(env) if env else project_root() / ".cache" / "torch_extensions"


def rank_environment(device: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment torchrun and the ranks get."""
    env = dict(os.environ)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir()))
    env.setdefault("DS_BUILD_OPS", "0")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if device == "cpu":
        env["OMP_NUM_THREADS"] = env.get("FTSCOPE_RANK_THREADS", "1")  # N ranks share the cores
        env["DS_ACCELERATOR"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
    src = str(project_root() / "src")
    if (project_root() / "src" / "ftscope").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def prebuild_deepspeed_ops() -> Path:
    """JIT-compile DeepSpeed's CPU shared-memory comm op into the project cache now (what the first CPU
    DeepSpeed run would otherwise do); returns the cache folder. For `make test` / CI warm-up."""
    require_torch(("deepspeed",))
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir()))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        builder.load(verbose=False)
    return Path(os.environ["TORCH_EXTENSIONS_DIR"])


def _free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr if addr not in ("localhost",) else "127.0.0.1", 0))
        return int(s.getsockname()[1])


def _estimate(scn: Scenario, config: dict[str, Any], batch: int) -> dict[str, Any] | None:
    """The per-rank estimate for the model as built, with byte-exact memory beside the rounded GiB."""
    from ...estimate import estimate
    from ..runtime.profile import built_scenario

    try:
        est = estimate(built_scenario(scn, config, batch), strict=False)
    except FtscopeError:
        return None
    d = est.to_dict()
    d["memory"]["allocated_bytes"] = est.memory.allocated_bytes
    d["memory"]["peak_bytes"] = est.memory.peak_bytes
    d["memory"]["breakdown_bytes"] = dict(est.memory.categories)
    d["memory"]["phases_bytes"] = dict(est.memory.phases)
    d["memory"]["cpu_offload_bytes"] = est.model_memory.cpu_bytes
    d["memory"]["per_rank_of"] = scn.cluster.world_size
    return d


def _read_reports(out: Path) -> list[dict[str, Any]]:
    """Rank reports: all.json (every rank, gathered by rank 0) when the run got that far, else rank<R>.json."""
    gathered = out / "all.json"
    if gathered.is_file():
        try:
            return sorted(json.loads(gathered.read_text())["ranks"], key=lambda d: d["rank"])
        except (OSError, ValueError, KeyError):
            pass
    docs = []
    for f in sorted(out.glob("rank*.json")):
        try:
            docs.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(docs, key=lambda d: d.get("rank", 0))


def _kill(proc: subprocess.Popen, out: Path) -> None:
    """Stop torchrun's process group, then any rank (by the pid it reported) still alive."""
    with_pids = [d.get("pid") for d in _read_reports(out) if d.get("pid")]
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    for pid in with_pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError):
            pass


def profile_distributed(scn: Scenario, nproc: int, nnodes: int = 1, node_rank: int = 0,
                        master_addr: str = "127.0.0.1", master_port: int | None = None, device: str = "auto",
                        steps: int = 2, warmup: int = 1, batch_sizes: Sequence[int] = (1, 2),
                        shrink: dict[str, Any] | None = None, db: str | None = DEFAULT_DB,
                        emit_dir: str | Path | None = None, timeout_s: float = 600,
                        progress: Callable[[str], None] | None = None, collective_timeout_s: float | None = None,
                        seed: int = 0, env: dict[str, str] | None = None,
                        ds_overrides: dict[str, Any] | None = None) -> DistributedResult:
    """Profile the scenario on `nproc` ranks per node x `nnodes` nodes through torchrun (see the module docstring).

    Run it once per node with that node's `node_rank`; node 0 stores the run. `collective_timeout_s` (default:
    half of timeout_s, 60-300 s) is the process-group timeout; `env` adds variables for the ranks;
    `ds_overrides` is merged into the DeepSpeed config (and into the emitted ds_config.json).
    """
    require_torch()
    from ..runtime.environment import environment
    from .engines import engine_name
    from ..runtime.profile import resolve_device, sweep_id
    from ..store import Store

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
    dev = resolve_device(device)
    dev_kind = "cuda" if dev.startswith("cuda") else "cpu"
    say = progress or (lambda _msg: None)
    world = nproc * nnodes
    wscn = scn.with_(gpus_per_node=nproc, nodes=nnodes)  # the estimate is per rank of this world
    batch_sizes = [int(b) for b in batch_sizes]
    coll_timeout = collective_timeout_s or max(60.0, min(300.0, timeout_s / 2))
    port = master_port or (_free_port(master_addr) if nnodes == 1 else 29500)

    work = Path(tempfile.mkdtemp(prefix="ftscope-dist-"))
    scn_file = work / "scenario.pkl"
    scn_file.write_bytes(pickle.dumps(wscn))
    out = work / "ranks"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--nnodes={nnodes}",
           f"--node-rank={node_rank}", f"--master-addr={master_addr}", f"--master-port={port}", "--max-restarts=0",
           "-m", WORKER_MODULE, "--scenario", str(scn_file), "--out", str(out), "--device", dev_kind,
           "--steps", str(steps), "--warmup", str(warmup), "--batch-sizes", ",".join(map(str, batch_sizes)),
           "--seed", str(seed), "--collective-timeout", str(coll_timeout)]
    if shrink:
        cmd += ["--shrink", json.dumps(shrink)]
    if ds_overrides:
        cmd += ["--ds-overrides", json.dumps(ds_overrides)]
    backend = "nccl" if dev_kind == "cuda" else "gloo"
    engine = engine_name(scn.mix)
    options = {"device": dev_kind, "nproc": nproc, "nnodes": nnodes, "world_size": world, "engine": engine,
               "backend": backend, "steps": steps, "warmup": warmup, "batch_sizes": batch_sizes, "shrink": shrink,
               "seed": seed, "collective_timeout_s": coll_timeout, "timeout_s": timeout_s,
               "ds_overrides": ds_overrides}
    store = Store(db) if (db and node_rank == 0) else None
    run_id = None
    env_info = environment(dev)
    if store is not None:
        run_id = store.start_run({"scenario": wscn.to_dict(), "options": options}, env_info,
                                 sweep_id=sweep_id(wscn, options))
    result = DistributedResult(run_id=run_id, db=db if store is not None else None, status="failed", error=None,
                               engine=engine, backend=backend, device=dev_kind, nproc=nproc, nnodes=nnodes,
                               node_rank=node_rank, world_size=world, command=cmd, wall_s=0.0, returncode=None,
                               environment=env_info)
    say(f"torchrun: {nproc} x {nnodes} ranks, {engine} over {backend} (collective timeout {coll_timeout:.0f} s)")

    log: deque[str] = deque(maxlen=200)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=rank_environment(dev_kind, env), cwd=str(work), text=True, errors="replace",
                            start_new_session=True)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            log.append(line)
            if line.startswith("ftscope[rank"):
                say(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        say(f"timed out after {timeout_s:.0f} s: stopping every rank")
        _kill(proc, out)
    except BaseException:
        _kill(proc, out)
        raise
    reader.join(timeout=5)
    result.wall_s = time.perf_counter() - t0
    result.returncode = None if timed_out else proc.returncode
    result.log_tail = list(log)[-60:]

    reports = _read_reports(out)
    errors = sorted((d for d in reports if d.get("error")), key=lambda d: d["error"].get("time", 0))
    for d in reports:
        if d.get("rank") == 0 or result.build is None:
            result.build = d.get("build") or result.build
            result.ds_config = d.get("ds_config") or result.ds_config
        for n in d.get("notes", []):
            if n not in result.notes:
                result.notes.append(n)
    if errors:
        first = errors[0]
        result.error = f"rank {first['rank']}: {first['error']['message']}"
        others = [f"rank {d['rank']}: {d['error']['message']}" for d in errors[1:]]
        if others:
            result.error += " (then " + "; ".join(others)[:600] + ")"
    elif timed_out:
        result.error = f"timed out after {timeout_s:.0f} s (no rank reported an error; a rank hung or was slow)"
    elif proc.returncode != 0:
        tail = " | ".join(line for line in list(log)[-8:] if line.strip())[-800:]
        result.error = f"torchrun exited with status {proc.returncode}: {tail}"
    if timed_out and errors:
        result.error += f" (the launch timed out after {timeout_s:.0f} s)"
    missing = sorted(set(range(node_rank * nproc, (node_rank + 1) * nproc)) - {d.get("rank") for d in reports})
    if missing and result.error is None:
        result.error = f"ranks {missing} never reported"

    # estimates and points
    config = (result.build or {}).get("config")
    if config is not None:
        for b in batch_sizes:
            result.estimates[b] = _estimate(wscn, config, b)
    for d in reports:
        done = {p["batch"] for p in d.get("points", [])}
        result.points.extend(d.get("points", []))
        if d.get("error"):
            b = d["error"].get("batch") or next((x for x in batch_sizes if x not in done), batch_sizes[0])
            result.points.append({"batch": b, "rank": d["rank"], "status": "error", "engine": d.get("engine"),
                                  "error": d["error"]["message"], "traceback": d["error"].get("traceback")})
    result.points.sort(key=lambda p: (p["batch"], p["rank"]))
    result.status = "failed" if (result.error or timed_out or proc.returncode) else "done"

    if emit_dir is not None:
        from ...plan.emit import emit
        from ..runtime.profile import built_scenario

        escn = built_scenario(wscn, config, batch_sizes[0]) if config is not None else wscn
        paths = emit(escn, batch_sizes[0], emit_dir)
        if result.ds_config is not None:
            ds_path = Path(emit_dir) / "ds_config.json"
            ds_path.write_text(json.dumps(result.ds_config, indent=2) + "\n")  # exactly what the ranks ran with
            if ds_path not in paths:
                paths.insert(0, ds_path)
        result.emitted = [str(p) for p in paths]

    if store is not None and run_id is not None:
        for p in result.points:
            key = f"batch={p['batch']}:rank={p['rank']}"
            store.record_point(run_id, key, p["status"], p, result.estimates.get(p["batch"]))
        store.finish_run(run_id, result.status, result.error)
    say(f"{result.status} in {result.wall_s:.1f} s" + (f": {result.error}" if result.error else ""))
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return result


if __name__ == "__main__":  # python -m ftscope.measure.distributed.launcher --prebuild
    if sys.argv[1:] == ["--prebuild"]:
        print(prebuild_deepspeed_ops())
    else:
        sys.exit("usage: python -m ftscope.measure.distributed.launcher --prebuild   (JIT-compile DeepSpeed's CPU comm op)")
