"""Efficiency parameters of the time model, and the calibration file that stores fitted values.

Few and physical: the fraction of peak FLOP/s large matmuls reach and how fast that falls for short ones,
the fraction of memory bandwidth streaming kernels reach, a per-kernel launch floor, a per-step host
overhead, the dequantization bandwidth, the MoE dispatch cost of the eager expert loop, the collective
bandwidth fraction. A GPU with no measurements uses the shared values.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import FtscopeError


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of hardware peaks and fixed costs (defaults: the bundled calibration)."""

    matmul: float = 0.72
    """Fraction of dense tensor peak that large GEMMs reach."""
    matmul_half_rows: float = 64.0
    """GEMM rows (tokens) at which efficiency is half of `matmul`: short GEMMs run far below peak."""
    grouped_matmul: float = 1.0
    """Grouped expert GEMMs (one kernel over all experts: grouped_mm, batched_mm) relative to `matmul`."""
    attention: float = 0.45
    """Fraction of peak fused attention kernels (flash / sdpa) reach."""
    bandwidth: float = 0.80
    """Fraction of memory bandwidth that streaming kernels reach (elementwise, optimizer, weight reads)."""
    dequant_bandwidth: float = 0.65
    """Fraction of memory bandwidth the 4-bit dequantization kernels reach."""
    kernel_floor_us: float = 6.0
    """Minimum time of one kernel launch (microseconds)."""
    step_overhead_s: float = 0.03
    """Host time per optimizer step outside the GPU kernels (data loading, logging, Python)."""
    microbatch_overhead_s: float = 0.005
    """Host time per micro-batch (collation, transfer, hooks)."""
    expert_dispatch_us: float = 40.0
    """Per expert, per MoE layer, per pass: routing, indexing and host sync of the eager expert loop."""
    communication: float = 0.70
    """Fraction of link bandwidth collectives reach."""
    cpu_adam_params_per_s: float = 1.0e9
    """Parameters per second DeepSpeed's CPU Adam updates (offloaded optimizer). Prior, not fitted."""
    collective_latency_us: float = 50.0
    """Fixed cost of one collective (launch + ring latency). Prior, not fitted: no published case times it."""
    zero3_hook_us: float = 150.0
    """DeepSpeed ZeRO-3's Python fetch/release hooks per parameterised module per pass (FSDP2 gathers per
    block instead). Prior, not fitted: no published case times ZeRO-3."""


PARAM_NAMES = tuple(f.name for f in fields(Efficiency))


@dataclass(frozen=True)
class Calibration:
    """Shared efficiency values plus per-GPU overrides, with where they came from."""

    shared: Efficiency
    per_gpu: dict[str, Efficiency]
    provenance: dict[str, Any]

    def for_gpu(self, gpu_key: str) -> tuple[Efficiency, bool]:
        """(efficiency, calibrated?) for one GPU: calibrated is True when the GPU has its own measurements."""
        key = gpu_key.rstrip("*")
        if key in self.per_gpu:
            return self.per_gpu[key], True
        return self.shared, key in self.provenance.get("gpus", ())

    def to_dict(self) -> dict[str, Any]:
        return {"shared": asdict(self.shared),
                "per_gpu": {k: _diff(v, self.shared) for k, v in sorted(self.per_gpu.items())},
                "provenance": self.provenance}


def _diff(eff: Efficiency, base: Efficiency) -> dict[str, float]:
    return {k: v for k, v in asdict(eff).items() if v != getattr(base, k)}


def calibration_from_dict(data: dict[str, Any]) -> Calibration:
    try:
        shared = replace(Efficiency(), **data.get("shared", {}))
        per_gpu = {k: replace(shared, **v) for k, v in (data.get("per_gpu") or {}).items()}
    except TypeError as exc:
        raise FtscopeError(f"calibration file has an unknown parameter: {exc}") from None
    return Calibration(shared=shared, per_gpu=per_gpu, provenance=data.get("provenance", {}))


@lru_cache(maxsize=8)
def load_calibration(path: str | None = None) -> Calibration:
    """The calibration at `path`, or the bundled default (fitted by `ftscope calibrate`)."""
    if path is None:
        res = resources.files("ftscope").joinpath("data", "calibration.json")
        if not res.is_file():
            return Calibration(Efficiency(), {}, {"source": "built-in defaults (no calibration file)"})
        text = res.read_text()
    else:
        p = Path(path)
        if not p.is_file():
            raise FtscopeError(f"calibration file not found: {p}")
        text = p.read_text()
    try:
        return calibration_from_dict(json.loads(text))
    except json.JSONDecodeError as exc:
        raise FtscopeError(f"malformed calibration file {path}: {exc}") from None
