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
from ..estimate.shared import Shared
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


def _changed(scn: Scenario, change: str, apply: Callable[[Scenario], Scenario],
             memo: dict | None) -> tuple[Scenario, Shared | None]:
    """`scn` with the change (solving the batch when it does), and the memo its GPU types share: with `memo`, the
    changed scenario is built once per change, mix and cluster shape and only its GPU is replaced."""
    def make(s: Scenario) -> Scenario:
        cand = apply(s)
        return cand.with_(micro_batch_size="max") if s.workload.solve_batch else cand
    if memo is None:
        return make(scn), None
    cl = scn.cluster
    key = (change, id(scn.mix), id(scn.workload), cl.gpus_per_node, cl.nodes, cl.inter_node_gbs)
    hit = memo.get(key)
    if hit is None:
        base = make(scn)
        hit = memo[key] = (base, Shared(base), scn)  # scn kept: its mix's and workload's ids are in the key
    return hit[0].with_(gpu=cl.gpu), hit[1]


def fixes(est: Estimate, margin: float = 0.0, memo: dict | None = None) -> list[Fix]:
    """The single changes under which `est`'s scenario fits (leaving `margin` free when its batch is solved).
    `memo`: one dict for the rows of one sweep, whose GPU types then share each change's work."""
    scn = est.scenario
    found = []
    for change, apply in _changes(scn):
        cand, shared = _changed(scn, change, apply, memo)
        try:
            after = estimate(cand, margin=margin if scn.workload.solve_batch else 0.0, strict=False, with_time=False,
                             shared=shared)
        except FtscopeError:  # a change the estimator refuses for this model and GPU is not a fix
            continue
        if after.fits:
            found.append(Fix(change, cand.cluster.world_size, after.micro_batch_size, after.memory.peak_bytes / 2**30,
                             after.headroom_fraction * 100))
    return found


def fixes_per_gpu(rows: list[Estimate], margin: float = 0.0, memo: dict | None = None) -> dict[str, list[Fix]]:
    """{GPU type: its fixes} for every GPU type on which no candidate fits only for lack of memory; each is tried
    on the candidate with the most GPUs of that type. `memo`: see fixes (a new one when None)."""
    out: dict[str, list[Fix]] = {}
    fitting = {e.scenario.cluster.gpu.key for e in rows if e.fits}
    memo = {} if memo is None else memo
    for est in sorted(rows, key=lambda e: -e.scenario.cluster.world_size):
        key = est.scenario.cluster.gpu.key
        if key not in fitting and key not in out and est.status == "does_not_fit":
            out[key] = fixes(est, margin, memo)
    return out
