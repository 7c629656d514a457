"""What a distributed profile returns: a point per (batch, rank) from the ranks' reports, ftscope's per-rank
estimate beside them, and how the launch ended (the first rank error, a timeout, torchrun's own failure)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ...spec.scenario import Scenario
from ..runtime.as_built import built_scenario, estimate_beside
from ..runtime.loop import RankPoint
from .torchrun import Launch


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
    points: list[RankPoint] = field(default_factory=list)
    """Per (batch, rank): what the worker measured (memory, times, collectives, static_bytes), or an error."""
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
            if p.status != "ok":
                continue
            est = (self.estimates.get(p.batch) or {}).get("memory", {})
            measured = p.memory["peak_allocated_bytes"]
            predicted = est.get("allocated_bytes")
            if predicted is not None and self.device == "cpu":
                predicted += est.get("cpu_offload_bytes") or 0.0
            rows.append({"batch": p.batch, "rank": p.rank, "measured_bytes": measured,
                         "estimated_bytes": predicted,
                         "error_pct": None if not predicted else 100.0 * (predicted - measured) / measured,
                         "step_s": p.step_s, "collective_s": (p.collectives or {}).get("collective_s")})
        return rows


def rank_estimate(scn: Scenario, config: dict[str, Any], batch: int) -> dict[str, Any] | None:
    """The per-rank estimate for the model as built, with byte-exact memory beside the rounded GiB."""
    est = estimate_beside(built_scenario(scn, config, batch))
    if est is None:
        return None
    d = est.to_dict()
    d["memory"]["allocated_bytes"] = est.memory.allocated_bytes
    d["memory"]["peak_bytes"] = est.memory.peak_bytes
    d["memory"]["breakdown_bytes"] = dict(est.memory.categories)
    d["memory"]["phases_bytes"] = dict(est.memory.phases)
    d["memory"]["cpu_offload_bytes"] = est.model_memory.cpu_bytes
    d["memory"]["per_rank_of"] = scn.cluster.world_size
    return d


def _first_error(reports: list[dict[str, Any]], run: Launch, timeout_s: float, expected: range) -> str | None:
    """The run's error: the first rank to fail (then the others), a timeout, torchrun's own failure, or ranks
    that never reported."""
    errors = sorted((d for d in reports if d.get("error")), key=lambda d: d["error"].get("time", 0))
    error = None
    if errors:
        error = f"rank {errors[0]['rank']}: {errors[0]['error']['message']}"
        others = [f"rank {d['rank']}: {d['error']['message']}" for d in errors[1:]]
        if others:
            error += " (then " + "; ".join(others)[:600] + ")"
    elif run.timed_out:
        error = f"timed out after {timeout_s:.0f} s (no rank reported an error; a rank hung or was slow)"
    elif run.returncode != 0:
        tail = " | ".join(line for line in run.log[-8:] if line.strip())[-800:]
        error = f"torchrun exited with status {run.returncode}: {tail}"
    if run.timed_out and errors:
        error += f" (the launch timed out after {timeout_s:.0f} s)"
    missing = sorted(set(expected) - {d.get("rank") for d in reports})
    if missing and error is None:
        error = f"ranks {missing} never reported"
    return error


def _rank_points(reports: list[dict[str, Any]], batch_sizes: list[int]) -> list[RankPoint]:
    """Every rank's measured points, plus an error point for the batch a failed rank was on."""
    points = []
    for d in reports:
        done = {p["batch"] for p in d.get("points", [])}
        points.extend(RankPoint.from_dict(p) for p in d.get("points", []))
        if d.get("error"):
            b = d["error"].get("batch") or next((x for x in batch_sizes if x not in done), batch_sizes[0])
            points.append(RankPoint(batch=b, rank=d["rank"], status="error", engine=d.get("engine"),
                                    error=d["error"]["message"], traceback=d["error"].get("traceback")))
    return sorted(points, key=lambda p: (p.batch, p.rank))


def collect(result: DistributedResult, reports: list[dict[str, Any]], run: Launch, wscn: Scenario,
             batch_sizes: list[int], timeout_s: float) -> None:
    """Fill the result from the rank reports: build, DeepSpeed config, notes, error, estimates, points."""
    for d in reports:
        if d.get("rank") == 0 or result.build is None:
            result.build = d.get("build") or result.build
            result.ds_config = d.get("ds_config") or result.ds_config
        for n in d.get("notes", []):
            if n not in result.notes:
                result.notes.append(n)
    first = result.node_rank * result.nproc
    result.error = _first_error(reports, run, timeout_s, range(first, first + result.nproc))
    config = (result.build or {}).get("config")
    if config is not None:
        result.estimates = {b: rank_estimate(wscn, config, b) for b in batch_sizes}
    result.points = _rank_points(reports, batch_sizes)
    result.status = "failed" if (result.error or run.timed_out or run.returncode) else "done"
