"""GEMM efficiency by shape and attention kernel throughput on one GPU: the data behind ftscope's time model.

Measures, with CUDA events (warm-up, then repeats until ~20 ms of work), and writes one JSON under OUT/data/:
- bf16 GEMMs over the shapes fine-tuning runs: M (tokens) from 64 to 16,384 against the (N, K) of Llama-7B/8B/
  70B and Mixtral matrices, LoRA's rank-r GEMMs, and FP8 (torch._scaled_mm) where the GPU has FP8 units;
- grouped expert GEMMs (torch._grouped_mm) over tokens per expert;
- attention through torch's sdpa backends (flash, memory-efficient, cuDNN, math) and the flash_attn package when
  installed (FlashAttention-2 / -3), causal, head dim 128, forward and forward + backward, sequence 256 to 16k.
Each row also carries ftscope's prediction (kernels.gemm_utilization, the GPU catalog's peak) for a side-by-side.

Run on a GPU:  OUT=/tmp/ga bash benchmarks/gpu/gemm_attention.sh          (about 4-6 minutes on one H100/H200)
Dry run (CPU): DRY_RUN=1 OUT=/tmp/ga bash benchmarks/gpu/gemm_attention.sh (tiny shapes: checks the flow)
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

MODEL_SHAPES = {  # (N, K) of one weight matrix: out_features, in_features
    "llama-7b qkv/o": (4096, 4096), "llama-7b gate/up": (11008, 4096), "llama-7b down": (4096, 11008),
    "llama3-8b gate/up": (14336, 4096), "llama-70b o": (8192, 8192), "llama-70b gate/up": (28672, 8192),
    "lora A r16": (16, 4096), "lora B r16": (4096, 16), "lora A r64": (64, 4096),
}
ROWS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
SEQS = (256, 512, 1024, 2048, 4096, 8192, 16384)
DRY = {"shapes": {"small": (256, 128), "lora A r8": (8, 128)}, "rows": (16, 64), "seqs": (64, 128), "heads": 2,
       "head_dim": 32}


class Clock:
    """Times a callable on the device: CUDA events on a GPU, perf_counter on CPU."""

    def __init__(self, torch, device: str, budget_s: float):
        self.torch, self.device, self.deadline = torch, device, time.monotonic() + budget_s

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def __call__(self, fn, min_s: float = 0.02, max_reps: int = 200) -> float:
        torch = self.torch
        fn()   # warm-up (and autotuning)
        if self.device == "cuda":
            torch.cuda.synchronize()
        reps, total = 0, 0.0
        while reps < max_reps and (total < min_s or reps < 3):
            if self.device == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                torch.cuda.synchronize()
                total += a.elapsed_time(b) / 1e3
            else:
                t = time.perf_counter()
                fn()
                total += time.perf_counter() - t
            reps += 1
            if self.device == "cpu" and reps >= 1:
                break
        return total / reps


def gpu_info(torch, device: str) -> dict:
    from ftscope.spec.hardware import gpu_from_catalog
    info = {"device": device, "torch": torch.__version__, "python": platform.python_version()}
    if device != "cuda":
        return {**info, "name": "cpu", "sm_count": 0, "catalog": None}
    props = torch.cuda.get_device_properties(0)
    info.update(name=props.name, sm_count=props.multi_processor_count, memory_mib=props.total_memory // 2**20,
                capability=f"{props.major}.{props.minor}")
    try:
        info["catalog"] = gpu_from_catalog(props.name).key
    except Exception:  # noqa: BLE001 - an uncatalogued GPU still gets measured
        info["catalog"] = None
    return info


def predicted(info: dict, m: int, n: int, k: int, groups: int = 1) -> dict:
    """ftscope's shape utilization and the catalog's dense bf16 peak for this GPU (None without a catalog entry)."""
    from ftscope.estimate.efficiency import Efficiency
    from ftscope.estimate.kernels import gemm_utilization
    from ftscope.spec.hardware import gpu_from_catalog
    util = gemm_utilization(m, n, k, info.get("sm_count") or 0, groups, Efficiency().gemm_k_half)
    peak = gpu_from_catalog(info["catalog"]).matmul_tflops("bf16") if info.get("catalog") else None
    return {"ftscope_utilization": round(util, 4), "catalog_bf16_tflops": peak}


def gemms(torch, clock: Clock, info: dict, shapes: dict, rows, dtype) -> list[dict]:
    out = []
    dev = clock.device
    for label, (n, k) in shapes.items():
        w = torch.randn(n, k, device=dev, dtype=dtype)
        for m in rows:
            if clock.left() < 0:
                return out
            x = torch.randn(m, k, device=dev, dtype=dtype)
            s = clock(lambda: x @ w.t())
            tf = 2 * m * n * k / s / 1e12
            out.append({"kind": "gemm", "dtype": str(dtype).split(".")[-1], "label": label, "m": m, "n": n, "k": k,
                        "seconds": s, "tflops": tf, **predicted(info, m, n, k)})
    return out


def fp8_gemms(torch, clock: Clock, info: dict, shapes: dict, rows) -> list[dict]:
    if clock.device != "cuda" or not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return []
    out = []
    one = torch.ones((), device="cuda")
    for label, (n, k) in shapes.items():
        if n % 16 or k % 16:
            continue
        w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        for m in rows:
            if clock.left() < 0 or m % 16:
                continue
            x = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
            try:
                s = clock(lambda: torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
            except Exception as exc:  # noqa: BLE001 - FP8 needs sm89+; record why it did not run
                return out + [{"kind": "gemm_fp8", "error": str(exc).splitlines()[0][:200]}]
            out.append({"kind": "gemm_fp8", "label": label, "m": m, "n": n, "k": k, "seconds": s,
                        "tflops": 2 * m * n * k / s / 1e12})
    return out


def grouped(torch, clock: Clock, info: dict, dtype) -> list[dict]:
    if clock.device != "cuda" or not hasattr(torch, "_grouped_mm"):
        return []
    out, experts, n, k = [], 8, 14336, 4096
    w = torch.randn(experts, k, n, device="cuda", dtype=dtype)
    for per_expert in (16, 64, 256, 1024, 4096):
        if clock.left() < 0:
            break
        x = torch.randn(experts * per_expert, k, device="cuda", dtype=dtype)
        offs = torch.arange(per_expert, experts * per_expert + 1, per_expert, device="cuda", dtype=torch.int32)
        try:
            s = clock(lambda: torch._grouped_mm(x, w, offs=offs))
        except Exception as exc:  # noqa: BLE001
            return out + [{"kind": "grouped_gemm", "error": str(exc).splitlines()[0][:200]}]
        out.append({"kind": "grouped_gemm", "experts": experts, "rows_per_expert": per_expert, "n": n, "k": k,
                    "seconds": s, "tflops": 2 * experts * per_expert * n * k / s / 1e12,
                    **predicted(info, per_expert, n, k, experts)})
    return out


def _sdpa_backends(torch) -> dict:
    try:
        from torch.nn.attention import SDPBackend
    except ImportError:
        return {}
    names = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION", "math": "MATH"}
    return {k: getattr(SDPBackend, v) for k, v in names.items() if hasattr(SDPBackend, v)}


def attention(torch, clock: Clock, seqs, heads: int, head_dim: int, dtype) -> list[dict]:
    import torch.nn.functional as F
    out = []
    dev = clock.device
    backends = _sdpa_backends(torch) if dev == "cuda" else {"math": None}
    try:
        from flash_attn import flash_attn_func  # FlashAttention-2 (or -3 as flash_attn_interface)
    except ImportError:
        flash_attn_func = None
    tokens = 16384 if dev == "cuda" else 256
    for seq in seqs:
        b = max(tokens // seq, 1)
        q, k, v = (torch.randn(b, heads, seq, head_dim, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
        flops = 4 * b * heads * seq * seq * head_dim * 0.5   # causal forward; backward is 2.5x
        impls = {}
        for name, backend in backends.items():
            if backend is None:
                impls[name] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                from torch.nn.attention import sdpa_kernel
                impls[name] = (lambda be: lambda: _with(sdpa_kernel(be), lambda: F.scaled_dot_product_attention(
                    q, k, v, is_causal=True)))(backend)
        if flash_attn_func is not None:
            qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
            impls["flash_attn"] = lambda: flash_attn_func(qt, kt, vt, causal=True)
        for name, fn in impls.items():
            if clock.left() < 0:
                return out
            row = {"kind": "attention", "impl": name, "batch": b, "heads": heads, "head_dim": head_dim, "seq": seq}
            try:
                fwd = clock(fn)
                both = clock(lambda: fn().sum().backward())
            except Exception as exc:  # noqa: BLE001 - a backend that cannot run this shape says why
                out.append({**row, "error": str(exc).splitlines()[0][:200]})
                continue
            out.append({**row, "forward_s": fwd, "forward_backward_s": both, "forward_tflops": flops / fwd / 1e12,
                        "forward_backward_tflops": 3.5 * flops / both / 1e12})
    return out


def _with(ctx, fn):
    with ctx:
        return fn()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="Folder; results go to OUT/data/gemm_attention.json")
    ap.add_argument("--dry-run", action="store_true", help="Tiny shapes on CPU: checks the flow")
    ap.add_argument("--budget-s", type=float, default=420.0, help="Stop starting measurements after this long")
    args = ap.parse_args(argv)
    import torch
    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    clock = Clock(torch, device, args.budget_s)
    info = gpu_info(torch, device)
    dry = args.dry_run or device == "cpu"
    shapes, rows = (DRY["shapes"], DRY["rows"]) if dry else (MODEL_SHAPES, ROWS)
    seqs, heads, hd = (DRY["seqs"], DRY["heads"], DRY["head_dim"]) if dry else (SEQS, 32, 128)
    started = time.monotonic()
    results = gemms(torch, clock, info, shapes, rows, dtype)
    results += attention(torch, clock, seqs, heads, hd, dtype)
    results += grouped(torch, clock, info, dtype)
    results += fp8_gemms(torch, clock, info, shapes, rows)
    path = Path(args.out) / "data" / "gemm_attention.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"gpu": info, "dry_run": dry, "seconds": round(time.monotonic() - started, 1), "results": results}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(results)} measurements in {doc['seconds']} s -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
