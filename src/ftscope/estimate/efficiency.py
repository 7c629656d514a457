"""Efficiency parameters of the time model, and the calibration file that stores fitted values.

Few and physical: the fraction of peak FLOP/s large matmuls reach and how fast that falls for short ones,
the fraction of memory bandwidth streaming kernels reach, a per-kernel launch floor, a per-step host
overhead, the dequantization bandwidth, the MoE dispatch cost of the eager expert loop, the collective
bandwidth fraction. A GPU with no measurements uses the shared values.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from importlib import resources
from typing import Any

from ..errors import FtscopeError
from ..files import parse_json, read_text, show
from ..spec.schema import Number, Text, forbid_extra, validate

Fraction = Number(gt=0, le=1)
"""Achieved share of a hardware peak."""
Micros = Number(ge=0, le=1e6)
Seconds = Number(ge=0, le=3600)


@forbid_extra
@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of hardware peaks and fixed costs (defaults: the bundled calibration)."""

    matmul: Fraction = 0.72
    """Fraction of dense tensor peak that large GEMMs reach."""
    matmul_half_rows: Number(gt=0, le=1e6) = 64.0
    """GEMM rows (tokens) at which efficiency is half of `matmul`: short GEMMs run far below peak."""
    grouped_matmul: Number(gt=0, le=4) = 1.0
    """Grouped expert GEMMs (one kernel over all experts: grouped_mm, batched_mm) relative to `matmul`."""
    attention: Fraction = 0.45
    """Fraction of peak fused attention kernels (flash / sdpa) reach."""
    bandwidth: Fraction = 0.80
    """Fraction of memory bandwidth that streaming kernels reach (elementwise, optimizer, weight reads)."""
    dequant_bandwidth: Fraction = 0.65
    """Fraction of memory bandwidth the 4-bit dequantization kernels reach."""
    kernel_floor_us: Micros = 6.0
    """Minimum time of one kernel launch (microseconds)."""
    step_overhead_s: Seconds = 0.03
    """Host time per optimizer step outside the GPU kernels (data loading, logging, Python)."""
    microbatch_overhead_s: Seconds = 0.005
    """Host time per micro-batch (collation, transfer, hooks)."""
    expert_dispatch_us: Micros = 40.0
    """Per expert, per MoE layer, per pass: routing, indexing and host sync of the eager expert loop."""
    communication: Fraction = 0.70
    """Fraction of link bandwidth collectives reach."""
    cpu_adam_params_per_s: Number(ge=1e3, le=1e13) = 1.0e9
    """Parameters per second DeepSpeed's CPU Adam updates (offloaded optimizer). Prior, not fitted."""
    collective_latency_us: Micros = 50.0
    """Fixed cost of one collective (launch + ring latency). Prior, not fitted: no published case times it."""
    zero3_hook_us: Micros = 150.0
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


@forbid_extra
@dataclass(frozen=True)
class CalibrationFile:
    """A calibration JSON as written by `ftscope calibrate --out`: shared values, per-GPU overrides, provenance."""

    shared: dict[Text(), Any] | None = None
    per_gpu: dict[Text(), dict[Text(), Any]] | None = None
    provenance: dict[Text(), Any] | None = None


def calibration_from_dict(data: Any, where: str = "calibration") -> Calibration:
    """Check a calibration mapping (every value a finite number in its physical range) and build it."""
    given = validate(CalibrationFile, data, source=where)
    shared = validate(Efficiency, given.shared or {}, "shared", source=where)
    per_gpu = {gpu: validate(Efficiency, {**asdict(shared), **values}, f"per_gpu.{gpu}", source=where)
               for gpu, values in (given.per_gpu or {}).items()}
    return Calibration(shared=shared, per_gpu=per_gpu, provenance=given.provenance or {})


@lru_cache(maxsize=8)
def load_calibration(path: str | None = None) -> Calibration:
    """The calibration at `path`, or the bundled default (fitted by `ftscope calibrate`)."""
    if path is None:
        res = resources.files("ftscope").joinpath("data", "calibration.json")
        if not res.is_file():
            return Calibration(Efficiency(), {}, {"source": "built-in defaults (no calibration file)"})
        return calibration_from_dict(parse_json(res.read_text(), "bundled calibration.json"), "bundled calibration.json")
    where = f"calibration file {show(path)}"
    return calibration_from_dict(parse_json(read_text(path, "calibration file"), where), where)
