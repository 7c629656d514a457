"""FLOP formulas torch's FlopCounterMode lacks, for the ops a traced CPU step runs: CPU flash attention, the
memory-efficient kernel (what CUDA runs for MLA), grouped_mm, bitsandbytes' 4-bit GEMM. Causal kernels count the
lower triangle only."""
from __future__ import annotations

import math
from typing import Any


def _causal_fraction(s_q: int, s_k: int, is_causal: bool) -> float:
    """Share of the score matrix a causal kernel computes: the lower triangle with its diagonal."""
    if not is_causal or s_q != s_k or s_q == 0:
        return 1.0
    return (s_q + 1) / (2 * s_q)


def _sdpa_cpu_flops(query, key, value, dropout_p=0.0, is_causal=False, *args, out_shape=None, **kwargs) -> int:
    """CPU flash attention forward: QK^T and PV, 2 FLOPs per multiply-add (GQA keys are broadcast)."""
    b, h, s_q, d_q = query
    s_k, d_v = key[-2], value[-1]
    return int(2 * b * h * s_q * s_k * (d_q + d_v) * _causal_fraction(s_q, s_k, is_causal))


def _sdpa_cpu_backward_flops(grad_out, query, key, value, out, logsumexp, dropout_p=0.0, is_causal=False,
                             *args, out_shape=None, **kwargs) -> int:
    """Backward: recomputed scores, dV, dP, dQ, dK (torch's sdpa_backward_flop_count: 2bhs^2 (3 d_qk + 2 d_v))."""
    b, h, s_q, d_q = query
    s_k, d_v = key[-2], value[-1]
    return int(2 * b * h * s_q * s_k * (3 * d_q + 2 * d_v) * _causal_fraction(s_q, s_k, is_causal))


def _sdpa_efficient_flops(query, key, value, attn_bias=None, compute_log_sumexp=False, dropout_p=0.0,
                          is_causal=False, *args, out_shape=None, **kwargs) -> int:
    """Memory-efficient attention forward (what CUDA runs when q/k and v head dims differ, e.g. MLA)."""
    return _sdpa_cpu_flops(query, key, value, dropout_p, is_causal)


def _sdpa_efficient_backward_flops(grad_out, query, key, value, attn_bias, out, logsumexp, philox_seed,
                                   philox_offset, dropout_p, grad_input_mask, is_causal=False, *args,
                                   out_shape=None, **kwargs) -> int:
    return _sdpa_cpu_backward_flops(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal)


def _grouped_mm_flops(mat_a, mat_b, *args, out_shape=None, **kwargs) -> int:
    """grouped_mm: each row of a 2-D operand meets one group's matrix, so FLOPs are 2 x rows x K x N whatever
    the split (forward 2-D x 3-D, input grad 2-D x 3-D, weight grad 2-D x 2-D -> 3-D); 3-D x 3-D is a bmm."""
    if len(mat_a) == 2 and len(mat_b) == 3:
        return 2 * mat_a[0] * mat_a[1] * mat_b[-1]
    if len(mat_a) == 2 and len(mat_b) == 2:
        return 2 * mat_a[0] * mat_a[1] * mat_b[1]
    if len(mat_a) == 3 and len(mat_b) == 2:   # b's columns are split among a's groups
        return 2 * mat_a[1] * mat_a[2] * mat_b[-1]
    return 2 * mat_a[0] * mat_a[1] * mat_a[2] * mat_b[-1]


def _gemm_4bit_flops(a, b, shape_b, *args, out_shape=None, **kwargs) -> int:
    """bitsandbytes' fused NF4 GEMM: x [.., K] times the dequantized [N, K] weight."""
    n, k = shape_b
    return 2 * math.prod(a[:-1]) * k * n


def flop_formulas() -> dict[Any, Any]:
    import torch

    aten = torch.ops.aten
    out = {aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flops,
           aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward_flops,
           aten._scaled_dot_product_efficient_attention: _sdpa_efficient_flops,
           aten._scaled_dot_product_efficient_attention_backward: _sdpa_efficient_backward_flops,
           aten._grouped_mm: _grouped_mm_flops}
    if hasattr(torch.ops, "bitsandbytes") and hasattr(torch.ops.bitsandbytes, "gemm_4bit"):
        out[torch.ops.bitsandbytes.gemm_4bit] = _gemm_4bit_flops
    return out
