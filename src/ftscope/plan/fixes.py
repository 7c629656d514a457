"""For a GPU on which nothing fits: the single changes that make it fit (checkpointing, ZeRO-3, QLoRA, more GPUs).

Each change is tried alone on the candidate with the most GPUs of that type, by re-estimating memory only (no
time model): a handful of memory models per GPU type, milliseconds. A change the frameworks refuse for this
model and GPU is skipped, as is one that changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import FtscopeError
from ..estimate import estimate
from ..estimate.result import Estimate
from ..spec.scenario import Scenario


@dataclass(frozen=True)
class Fix:
    """One change that makes a candidate fit, and what it leaves."""

    change: str
    """In words: 'gradient checkpointing', 'ZeRO-3', 'QLoRA', '16 GPUs'."""
    gpus: int
    """GPUs the candidate uses with the change."""
    micro_batch_size: int
    """The largest micro-batch that fits with the change (the scenario's own when it fixes one)."""
    peak_gib: float
    headroom_pct: float

    def to_dict(self) -> dict[str, Any]:
        return {"change": self.change, "gpus": self.gpus, "micro_batch_size": self.micro_batch_size, "peak_gib": round(self.peak_gib, 3),
                "headroom_pct": round(self.headroom_pct, 2)}

    def text(self) -> str:
        return (f"{self.change} on {self.gpus} GPU{'s' if self.gpus > 1 else ''} (b{self.micro_batch_size}, {self.peak_gib:.1f} GiB, "
                f"{self.headroom_pct:.0f} % free)")


def _changes(scn: Scenario) -> list[tuple[str, Callable[[Scenario], Scenario]]]:
    mix, cl = scn.mix, scn.cluster
    out: list[tuple[str, Callable[[Scenario], Scenario]]] = []
    if not mix.gradient_checkpointing:
        out.append(("gradient checkpointing", lambda s: s.with_(gradient_checkpointing=True)))
    if mix.shard_stage < 3 and cl.world_size > 1:
        out.append(("ZeRO-3", lambda s: s.with_(zero_stage=3, fsdp=None)))
    if mix.method != "qlora":
        out.append(("QLoRA", lambda s: s.with_(method="qlora")))
    more = cl.nodes * 2
    out.append(("more GPUs", lambda s: s.with_(nodes=more)))
    return out


def fixes(est: Estimate, margin: float = 0.0) -> list[Fix]:
    """The single changes under which `est`'s scenario fits (leaving `margin` free when its batch is solved)."""
    scn = est.scenario
    found = []
    for change, apply in _changes(scn):
        cand = apply(scn)
        if scn.workload.solve_batch:
            cand = cand.with_(micro_batch_size="max")
        try:
            after = estimate(cand, margin=margin if scn.workload.solve_batch else 0.0, strict=False, with_time=False)
        except FtscopeError:  # a change the estimator refuses for this model and GPU is not a fix
            continue
        if after.fits:
            found.append(Fix(change, cand.cluster.world_size, after.micro_batch_size, after.memory.peak_bytes / 2**30,
                             after.headroom_fraction * 100))
    return found


def fixes_per_gpu(rows: list[Estimate], margin: float = 0.0) -> dict[str, list[Fix]]:
    """{GPU type: its fixes} for every GPU type on which no candidate fits only for lack of memory; each is tried
    on the candidate with the most GPUs of that type."""
    out: dict[str, list[Fix]] = {}
    fitting = {e.scenario.cluster.gpu.key for e in rows if e.fits}
    for est in sorted(rows, key=lambda e: -e.scenario.cluster.world_size):
        key = est.scenario.cluster.gpu.key
        if key not in fitting and key not in out and est.status == "does_not_fit":
            out[key] = fixes(est, margin)
    return out
