"""GPUs (datasheet numbers from the catalog, or inline) and the cluster a run uses."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated, Any

from pydantic import Field

from .. import catalog
from ..errors import FtscopeError
from .schema import Flag, Int, Number, Text, forbid_extra, validate

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


_GPU_FIELDS = {"name", "bf16_tflops", "fp16_tflops", "fp32_tflops", "tf32_tflops", "memory_bandwidth_gbs",
               "intra_node_gbs", "host_link_gbs", "bf16", "flash_attention", "sm_count", "fp8_tflops",
               "peer_to_peer"}


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


Rate = Number(ge=0.1, le=100_000)
"""TFLOP/s or GB/s of a link: 0.1 to 100,000 (a tenth of a phone's GPU to 100x an H200); outside is a typo."""


@forbid_extra
@dataclass(frozen=True)
class InlineGpu:
    """`hardware.gpu` given as a mapping: a catalog `base` with some values replaced, or every rate."""

    base: Text() | None = None
    name: Text() | None = None
    memory_gib: Number(ge=1, le=1_000_000) | None = None
    memory_mib: Number(ge=1024, le=10**9) | None = None
    bf16_tflops: Rate | None = None
    fp16_tflops: Rate | None = None
    fp32_tflops: Rate | None = None
    tf32_tflops: Rate | None = None
    memory_bandwidth_gbs: Number(ge=10, le=1_000_000) | None = None
    intra_node_gbs: Rate | None = None
    host_link_gbs: Rate | None = None
    bf16: Flag() | None = None
    flash_attention: Flag() | None = None
    sm_count: Int(1, 100_000) | None = None
    fp8_tflops: Rate | None = None
    peer_to_peer: Flag() | None = None


GpuRef = Annotated[Text() | InlineGpu, Field(description="a catalog name (ftscope gpus) or an inline mapping")]


def gpu_from_inline(spec: InlineGpu | dict[str, Any]) -> GpuSpec:
    """An inline GPU: `{base: a100-80gb, memory_gib: 96}` overrides a catalog entry; without base, all rates are needed."""
    if not isinstance(spec, InlineGpu):
        spec = validate(InlineGpu, spec, "hardware.gpu")
    given = {f.name: getattr(spec, f.name) for f in fields(InlineGpu) if getattr(spec, f.name) is not None}
    base = gpu_from_catalog(spec.base) if spec.base is not None else None
    values: dict[str, Any] = {f.name: getattr(base, f.name) for f in fields(GpuSpec)} if base else {
        "name": "custom GPU", "intra_node_gbs": 32.0}
    if "memory_gib" in given:
        values["memory_bytes"] = int(given["memory_gib"] * GIB)
    if "memory_mib" in given:
        values["memory_bytes"] = int(given["memory_mib"] * MIB)
    values.update({k: v for k, v in given.items() if k in _GPU_FIELDS})
    values["key"] = f"{base.key}*" if base else "custom"
    missing = [k for k in ("memory_bytes", "fp16_tflops", "fp32_tflops", "memory_bandwidth_gbs") if k not in values]
    if missing:
        raise FtscopeError(f"inline GPU needs {', '.join(m.replace('_bytes', '_gib') for m in missing)} (or base: <catalog gpu>)")
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


@forbid_extra
@dataclass(frozen=True)
class Hardware:
    """The scenario's `hardware:` keys, as given (`to_cluster` resolves the GPU)."""

    gpu: GpuRef = "a100-80gb"
    """A catalog name (ftscope gpus) or an inline mapping ({base: a100-80gb, memory_gib: 96} or every rate)."""
    gpus_per_node: Int(1, 64) = 1
    """GPUs per node (the data-parallel world is gpus_per_node x nodes)."""
    nodes: Int(1, 4096) = 1
    """Machines of gpus_per_node GPUs each."""
    inter_node_gbs: Rate = 25.0
    """Per-GPU network bandwidth between nodes, GB/s per direction (25 = one 200 Gb/s NIC per GPU)."""

    def to_cluster(self) -> Cluster:
        gpu = gpu_from_catalog(self.gpu) if isinstance(self.gpu, str) else gpu_from_inline(self.gpu)
        return Cluster(gpu=gpu, gpus_per_node=self.gpus_per_node, nodes=self.nodes,
                       inter_node_gbs=float(self.inter_node_gbs))
