"""The estimate of one scenario, and its JSON form (field names are the public contract in design.md)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..spec.hardware import GIB
from ..spec.scenario import Scenario
from .comm_buffers import comm_buffer_bytes
from .memory import MemoryBreakdown, MemoryModel
from .solvers import max_seq_len

TIGHT_MARGIN = 0.05
"""Headroom below this fraction of usable memory is "tight": the memory model's held-out error (a few %) and the
allocator's run-to-run spread can use it up (`--margin` on plan and recommend changes it)."""
STATUSES = ("fits", "tight", "does_not_fit", "unsupported")


@dataclass(frozen=True)
class TimeEstimate:
    """One optimizer step and the throughput it implies."""

    step_s: float
    """All micro-batches of one optimizer step, all GPUs in lock-step."""
    tokens_per_s: float
    """Whole job, non-padding tokens."""
    samples_per_s: float
    mfu: float
    """Model FLOPs (6 x active params x tokens for full, 4x for frozen) over peak."""
    breakdown_s: dict[str, float]
    """forward, backward, recompute, optimizer, communication (the exposed part), dequant, other (sum = step_s)."""
    by_layer_s: dict[str, float] = field(default_factory=dict)
    """attention, mlp, experts, router, lm_head, norms_other per step."""
    calibrated: bool = False
    """True when the efficiency parameters came from measurements on this GPU."""
    communication_hidden_s: float = 0.0
    """Collective time overlapped with compute (not in step_s; `communication` is what stays exposed)."""


@dataclass(frozen=True)
class RunCost:
    hours: float
    gpu_hours: float
    usd: float | None
    usd_per_gpu_hour: float | None
    price_source: str
    steps: int


@dataclass(frozen=True)
class Estimate:
    """Everything ftscope predicts for one scenario."""

    scenario: Scenario
    micro_batch_size: int
    """The micro-batch used (solved when the scenario asked for "max")."""
    seq_len: int
    """The padded length memory must hold (the longest batch)."""
    memory: MemoryBreakdown
    model_memory: MemoryModel
    max_micro_batch_size: int
    margin: float
    time: TimeEstimate | None = None
    run: RunCost | None = None
    reason: str | None = None
    """Why the scenario cannot run (unsupported combination or does not fit); None when it can."""
    warnings: tuple[str, ...] = ()
    tight_margin: float = TIGHT_MARGIN
    """Headroom below this fraction of usable memory makes a fit "tight"."""

    @property
    def max_seq_len(self) -> int:
        """Largest sequence length that fits at this micro-batch (solved on first use: plan rarely needs it)."""
        cached = self.__dict__.get("_max_seq_len")
        if cached is None:
            cached = max_seq_len(self.model_memory, self.micro_batch_size, self.margin)
            object.__setattr__(self, "_max_seq_len", cached)
        return cached

    @property
    def fits(self) -> bool:
        return self.reason is None and self.memory.fit_bytes <= self.model_memory.capacity_bytes * (1 - self.margin)

    @property
    def nccl_bytes(self) -> float:
        """NCCL's communicator buffers per GPU (estimate/comm_buffers.py): outside torch's allocator."""
        return comm_buffer_bytes(self.scenario)

    @property
    def device_bytes(self) -> float:
        """What nvidia-smi shows per GPU at the peak: the reserved peak, the CUDA context and NCCL's buffers."""
        return self.memory.peak_bytes + self.model_memory.allocator.cuda_context_gib * GIB + self.nccl_bytes

    @property
    def headroom_bytes(self) -> float:
        """Usable memory left at the peak before the run runs out (negative when it does not fit): the capacity less
        what must fit (MemoryBreakdown.fit_bytes; cached blocks beyond it the allocator releases when it must)."""
        return self.model_memory.capacity_bytes - self.memory.fit_bytes

    @property
    def headroom_fraction(self) -> float:
        return self.headroom_bytes / self.model_memory.capacity_bytes

    @property
    def status(self) -> str:
        """fits | tight (fits with less than `tight_margin` of usable memory left) | does_not_fit | unsupported (a
        combination that cannot run at all)."""
        if self.reason is not None and not self.reason.startswith("does not fit"):
            return "unsupported"
        if not self.fits:
            return "does_not_fit"
        # the product the solvers' limit computes, so a batch solved to leave the margin is never called tight
        tight = self.memory.fit_bytes > self.model_memory.capacity_bytes * (1.0 - self.tight_margin)
        return "tight" if tight else "fits"

    def to_dict(self) -> dict[str, Any]:
        mem, mm, scn = self.memory, self.model_memory, self.scenario
        gib = lambda b: round(b / GIB, 3)  # noqa: E731
        resolved = scn.to_dict()
        resolved["workload"]["micro_batch_size"] = self.micro_batch_size
        out: dict[str, Any] = {
            "scenario": resolved,
            "label": f"{scn.model.name} | {scn.cluster.world_size}x {scn.cluster.gpu.key} | {scn.mix.label()} | b{self.micro_batch_size}",
            "model": {"name": scn.model.name, "total_params": scn.model.total_params,
                      "active_params": scn.model.active_params(scn.top_k or None),
                      "trainable_params": mm.trainable_params, "source": scn.model.source},
            "memory": {
                "peak_gib": gib(mem.peak_bytes),
                "allocated_gib": gib(mem.allocated_bytes),
                "device_gib": gib(self.device_bytes),
                "nccl_gib": gib(self.nccl_bytes),
                "breakdown_gib": {k: gib(v) for k, v in mem.categories.items()},
                "phases_gib": {k: gib(v) for k, v in mem.phases.items()},
                "peak_phase": mem.phase,
                "capacity_gib": gib(mm.capacity_bytes),
                "fits": self.fits,
                "status": self.status,
                "headroom_gib": gib(self.headroom_bytes),
                "headroom_pct": round(self.headroom_fraction * 100, 2),
                "cpu_offload_gib": gib(mm.cpu_bytes),
                "seq_len": self.seq_len,
                "metric": "reserved (torch.cuda.max_memory_reserved); device_gib adds the CUDA context and NCCL's "
                          "buffers (nccl_gib): what nvidia-smi shows",
            },
            "limits": {"max_micro_batch_size": self.max_micro_batch_size, "max_seq_len": self.max_seq_len,
                       "safety_margin": self.margin, "tight_margin": self.tight_margin},
            "time": None,
            "run": None,
            "reason": self.reason,
            "warnings": list(self.warnings),
        }
        if self.time is not None:
            t = self.time
            out["time"] = {"step_s": round(t.step_s, 6), "tokens_per_s": round(t.tokens_per_s, 3),
                           "samples_per_s": round(t.samples_per_s, 5), "mfu": round(t.mfu, 4),
                           "breakdown_s": {**{k: round(v, 6) for k, v in t.breakdown_s.items()},
                                           "communication_exposed": round(t.breakdown_s["communication"], 6),
                                           "communication_hidden": round(t.communication_hidden_s, 6)},
                           "by_layer_s": {k: round(v, 6) for k, v in t.by_layer_s.items()},
                           "calibrated": t.calibrated}
        if self.run is not None:
            r = self.run
            out["run"] = {"hours": round(r.hours, 4), "gpu_hours": round(r.gpu_hours, 4),
                          "usd": None if r.usd is None else round(r.usd, 2),
                          "usd_per_gpu_hour": r.usd_per_gpu_hour, "price_source": r.price_source, "steps": r.steps}
        return out
