"""Efficiency parameters of the time model, and the calibration file that stores fitted values.

Few and physical, each named once below with its unit and provenance: the fraction of peak large GEMMs reach per
GPU architecture (shapes then decide how much of it a GEMM gets, see kernels.py), attention kernels' fraction
per implementation and sequence length, streaming and dequantization bandwidth, per-kernel GPU floor and host
cost, collective bandwidth and overlap. A GPU with no measurements uses the shared values.
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
    """Achieved fractions of hardware peaks and fixed costs: the only tunable numbers of the time model.

    Each field says its unit and where its value comes from: "fitted" ones are set by `ftscope calibrate` on the
    published cases, the H200 profile store and the published-runs corpus (values and sources in
    data/calibration.json); "prior" ones are physical estimates no measured point constrains, with the reason.
    Defaults are starting points for the fit."""

    gemm_ampere: Fraction = 0.80
    """Fitted. Fraction of the dense bf16/fp16 tensor peak large GEMMs reach on Ampere (A100, A40, RTX 30)."""
    gemm_ada: Fraction = 0.80
    """Fitted. The same on Ada (RTX 40, L40S, RTX 6000 Ada)."""
    gemm_hopper: Fraction = 0.70
    """Fitted. The same on Hopper (H100, H200, H800): power and clock limits keep cuBLAS further from peak."""
    gemm_other: Fraction = 0.70
    """Prior, not fitted: Volta, Turing, Blackwell, CDNA have no measured point; the Hopper-like value."""
    gemm_k_half: Number(ge=0, le=1e6) = 64.0
    """Prior: GEMM depth K (elements) at which the tensor-core pipeline runs half full (LoRA's rank-r GEMMs): a
    128 x 128 tile's main loop advances 64 deep per stage, so a GEMM a few stages deep spends about as long
    filling and draining the pipeline as computing. Not fitted: only LoRA's short GEMMs see it, and their
    bytes mostly bound them."""
    grouped_matmul: Number(gt=0, le=4) = 1.0
    """Prior, not fitted: grouped expert GEMMs (grouped_mm, batched_mm: one launch for all experts) relative to
    dense ones, beyond what each group's own tiles and SM fill cost (kernels.py). They run the same tiles as a
    dense GEMM: DeepGEMM's contiguous grouped GEMMs reach the dense rate (H800 FP8, 4 groups of 8192 x 7168 x
    2048 at 1,114 TFLOP/s against 1,031 for a dense 4096 x 7168 x 2048; deepseek-ai/DeepGEMM#74). Fitted, it
    swung from 0.49 to 0.80 with the H200 store held out or not (two NeMo Qwen3-MoE rows disagree by 2x)."""
    fp8_gemm: Number(gt=0, le=2) = 0.70
    """Fitted. FP8 GEMMs' fraction of the FP8 peak relative to bf16 GEMMs' fraction of the bf16 peak (scaling,
    amax bookkeeping and smaller tiles keep FP8 further from its doubled peak)."""
    attention: Fraction = 0.55
    """Fitted. Fraction of the dense peak FlashAttention-2 / sdpa reach at long sequences on Ampere and Ada."""
    attention_hopper: Fraction = 0.35
    """Fitted. The same kernels on Hopper, which they run without its wgmma units."""
    attention_flash3: Fraction = 0.60
    """Prior, not fitted (no run in the data uses it): FlashAttention-3 on H100, 1.5-2x FlashAttention-2
    (Shah et al. 2024, FlashAttention-3: up to 740 TFLOP/s forward, backward slower)."""
    attention_flash1: Number(gt=0, le=4) = 0.5
    """Prior: the 2022 kernels (FlashAttention v1, its Triton port) relative to FlashAttention-2 on the same GPU
    (Dao 2023, FlashAttention-2: 1.7-3.0x faster than v1, 1.3-2.5x faster than the Triton port)."""
    attention_seq_half: Number(ge=0, le=1e6) = 300.0
    """Prior: sequence length (tokens) at which fused attention runs at half its long-sequence rate, read off
    Dao 2023's A100 forward + backward curves (about 60 % of the 16k rate at 512 tokens, 75 % at 1k, 85 % at 2k).
    Not fitted: with one source of very long runs held out, a fit swings it from 50 to 3,000."""
    bandwidth: Fraction = 0.80
    """Fitted. Fraction of memory bandwidth streaming kernels reach (elementwise, optimizer, weight reads)."""
    dequant_bandwidth: Fraction = 0.65
    """Fitted. Fraction of memory bandwidth the 4-bit dequantization kernels reach."""
    kernel_floor_us: Micros = 4.0
    """Fitted. GPU time of the shortest kernel (launch latency, fill and drain), microseconds."""
    host_us_per_kernel: Micros = 20.0
    """Fitted. Host (Python + PyTorch dispatch) time per launched kernel in eager mode, microseconds: a step
    whose kernels are shorter than this is host-bound."""
    sync_us: Micros = 50.0
    """Fitted. One host-device synchronization (the eager expert loop's nonzero per expert), microseconds."""
    step_overhead_s: Seconds = 0.03
    """Fitted. Host time per optimizer step outside the GPU kernels (data loading, logging, zero_grad), seconds."""
    microbatch_overhead_s: Seconds = 0.005
    """Prior: host time per micro-batch (collation, host-to-device copy), seconds."""
    communication: Fraction = 0.70
    """Fitted. Fraction of the link bandwidth collectives reach (NCCL bus bandwidth over the datasheet rate)."""
    comm_overlap: Number(ge=0, le=1) = 0.80
    """Fitted. Fraction of the concurrent compute behind which prefetched or bucketed collectives hide (FSDP
    prefetch, ZeRO overlap_comm, DDP buckets); the rest of the collective time is exposed."""
    comm_overlap_host: Number(ge=0, le=1) = 0.0
    """Prior, not fitted: the same for collectives staged through host memory (GeForce GPUs, whose driver disables
    PCIe peer-to-peer): NCCL's shared-memory transport copies each chunk GPU -> host -> GPU with a CPU proxy
    thread, over the PCIe link the GPU's own traffic shares, so none is counted as hidden. Only Answer.AI's
    3090 / 4090 rows run such collectives: no held-out source could check a fitted value."""
    compile_stream_bytes: Fraction = 0.3
    """Prior: torch.compile's share of eager elementwise memory traffic. Inductor fuses each norm with its residual
    add, RoPE and the gated activation into single kernels, close to the fused kernels' traffic (compute.py counts
    both): 172 of 590 kB per token and block for Llama-3.1-8B, 0.29; its cross-entropy reads the logits once
    instead of upcasting and log-softmaxing them (about 5 of 18 bytes per logit). Only torchtune's rows compile,
    so no held-out source could check a fit."""
    compile_kernels: Fraction = 0.3
    """Prior: torch.compile's share of eager elementwise kernel launches (about 18 per block fuse into ~5)."""
    cpu_adam_params_per_s: Number(ge=1e3, le=1e13) = 1.0e9
    """Prior: parameters per second DeepSpeed's CPU Adam updates (offloaded optimizer)."""
    collective_latency_us: Micros = 50.0
    """Prior: fixed cost of one collective (launch + ring latency), microseconds."""
    zero3_hook_us: Micros = 150.0
    """Prior: DeepSpeed ZeRO-3's Python fetch/release hooks per parameterised module per pass, microseconds."""


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
