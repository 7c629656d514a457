"""GPUs (datasheet numbers from the catalog, or inline) and the cluster a run uses."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from .. import catalog
from ..errors import FtscopeError, did_you_mean

MIB = 2**20
GIB = 2**30


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator's capacity and peak rates (dense, no sparsity)."""

    key: str
    """Catalog key (a100-80gb) or 'custom'."""
    name: str
    """Device name as torch / nvidia-smi print it."""
    memory_bytes: int
    """Total device memory as the device reports it."""
    bf16_tflops: float | None
    """Dense bf16 tensor-core TFLOP/s; None when the GPU has no bf16."""
    fp16_tflops: float
    fp32_tflops: float
    """Non-tensor-core FP32 TFLOP/s."""
    memory_bandwidth_gbs: float
    """HBM/GDDR bandwidth, GB/s (1e9)."""
    intra_node_gbs: float
    """GPU-to-GPU bandwidth inside a node per direction (NVLink or PCIe), GB/s."""
    host_link_gbs: float = 32.0
    """GPU <-> CPU per direction (PCIe), GB/s: bounds optimizer/parameter offload."""
    intra_node_link: str = "pcie4"
    bf16: bool = True
    flash_attention: bool = True
    """FlashAttention-2 kernels exist for this GPU."""
    tf32_tflops: float | None = None
    architecture: str = ""
    source: str = ""
    sm_count: int = 0
    """Streaming multiprocessors (CUs on AMD): GEMM tiles run in waves of this many (0: unknown)."""
    fp8_tflops: float | None = None
    """Dense FP8 tensor peak; None when the GPU has no FP8 units."""
    peer_to_peer: bool = True
    """False where the driver disables PCIe P2P (GeForce): collectives are staged through host memory."""

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    def matmul_tflops(self, precision: str) -> float:
        """Peak for the dtype matmuls run in under this precision."""
        if precision.startswith("bf16"):
            return float(self.bf16_tflops or self.fp16_tflops)
        if precision.startswith("fp16"):
            return float(self.fp16_tflops)
        return float(self.tf32_tflops or self.fp32_tflops)


_INLINE_KEYS = {"name", "memory_gib", "memory_mib", "bf16_tflops", "fp16_tflops", "fp32_tflops", "tf32_tflops",
                "memory_bandwidth_gbs", "intra_node_gbs", "host_link_gbs", "bf16", "flash_attention", "base",
                "sm_count", "fp8_tflops", "peer_to_peer"}


def gpu_from_catalog(name: str) -> GpuSpec:
    key = catalog.resolve_gpu_name(name)
    e = catalog.gpu_table()[key]
    return GpuSpec(
        key=key, name=e.get("name", key), memory_bytes=int(e["memory_mib"]) * MIB,
        bf16_tflops=e.get("bf16_tflops"), fp16_tflops=float(e.get("fp16_tflops") or e.get("bf16_tflops") or 0),
        fp32_tflops=float(e["fp32_tflops"]), memory_bandwidth_gbs=float(e["memory_bandwidth_gbs"]),
        intra_node_gbs=float(e.get("intra_node_gbs") or e.get("host_link_gbs") or 32),
        host_link_gbs=float(e.get("host_link_gbs") or 32), intra_node_link=str(e.get("intra_node_link", "pcie4")),
        bf16=bool(e.get("bf16", True)), flash_attention=bool(e.get("flash_attention", True)),
        tf32_tflops=e.get("tf32_tflops"), architecture=str(e.get("architecture", "")), source=str(e.get("source", "")),
        sm_count=int(e.get("sm_count") or 0), fp8_tflops=e.get("fp8_tflops"), peer_to_peer=bool(e.get("peer_to_peer", True)),
    )


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_positive(key: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok:
        raise FtscopeError(f"{key} must be a positive number; got {_show(value)}")


def gpu_from_inline(spec: dict[str, Any]) -> GpuSpec:
    """An inline GPU: `{base: a100-80gb, memory_gib: 96}` overrides a catalog entry; without base, all rates are needed."""
    unknown = set(spec) - _INLINE_KEYS
    if unknown:
        k = sorted(unknown)[0]
        raise FtscopeError(f"unknown key hardware.gpu.{k}{did_you_mean(k, _INLINE_KEYS)}")
    base = gpu_from_catalog(spec["base"]) if "base" in spec else None
    values: dict[str, Any] = {f.name: getattr(base, f.name) for f in fields(GpuSpec)} if base else {
        "key": "custom", "name": spec.get("name", "custom GPU"), "intra_node_gbs": 32.0}
    for k in ("memory_gib", "memory_mib", "bf16_tflops", "fp16_tflops", "fp32_tflops", "tf32_tflops",
              "memory_bandwidth_gbs", "intra_node_gbs", "host_link_gbs", "sm_count", "fp8_tflops"):
        if k in spec:
            _check_positive(f"hardware.gpu.{k}", spec[k], allow_none=k in ("bf16_tflops", "tf32_tflops", "fp8_tflops"))
    for k in ("bf16", "flash_attention", "peer_to_peer"):
        if k in spec and not isinstance(spec[k], bool):
            raise FtscopeError(f"hardware.gpu.{k} must be true or false; got {_show(spec[k])}")
    if "memory_gib" in spec:
        values["memory_bytes"] = int(float(spec["memory_gib"]) * GIB)
    if "memory_mib" in spec:
        values["memory_bytes"] = int(float(spec["memory_mib"]) * MIB)
    for k in ("name", "bf16_tflops", "fp16_tflops", "fp32_tflops", "tf32_tflops", "memory_bandwidth_gbs",
              "intra_node_gbs", "host_link_gbs", "bf16", "flash_attention", "fp8_tflops", "peer_to_peer"):
        if k in spec:
            values[k] = spec[k]
    if "sm_count" in spec:
        if not float(spec["sm_count"]).is_integer():
            raise FtscopeError(f"hardware.gpu.sm_count must be a whole number; got {_show(spec['sm_count'])}")
        values["sm_count"] = int(spec["sm_count"])
    values["key"] = f"{values.get('key', 'custom')}*" if base else "custom"
    missing = [k for k in ("memory_bytes", "fp16_tflops", "fp32_tflops", "memory_bandwidth_gbs") if k not in values]
    if missing:
        raise FtscopeError(f"inline GPU needs {', '.join(m.replace('_bytes', '_gib') for m in missing)} (or base: <catalog gpu>)")
    for k in ("memory_bytes", "fp16_tflops", "fp32_tflops", "memory_bandwidth_gbs", "intra_node_gbs", "host_link_gbs"):
        v = values.get(k)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0 or v != v):
            raise FtscopeError(f"hardware.gpu.{k.replace('_bytes', '_gib')} must be a positive number, got {v!r}")
    values.setdefault("bf16_tflops", values.get("fp16_tflops") if values.get("bf16", True) else None)
    return GpuSpec(**{f.name: values[f.name] for f in fields(GpuSpec) if f.name in values})


@dataclass(frozen=True)
class Cluster:
    """The GPUs a run uses: `gpus_per_node` x `nodes` of one GPU type."""

    gpu: GpuSpec
    gpus_per_node: int = 1
    nodes: int = 1
    inter_node_gbs: float = 25.0
    """Per-GPU network bandwidth between nodes, GB/s per direction (25 = one 200 Gb/s NIC per GPU)."""

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes
