"""Work of one micro-batch on one GPU: FLOPs, bytes moved and kernel launches, per op, by layer type.

Each `Op` is the forward work of one kind of operation summed over the blocks that have it, with how many
times that work recurs in backward (2x where weights train: input and weight gradients; 1x for frozen
weights: input gradients only) and whether gradient checkpointing recomputes it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..spec.scenario import Scenario
from .memory import NF4_BYTES


@dataclass(frozen=True, slots=True)
class Op:
    """Forward work of one operation kind in one micro-batch (summed over the blocks holding it)."""

    kind: str
    """matmul | attention | stream | dequant | dispatch"""
    layer: str
    """attention | mlp | experts | router | lm_head | norms_other | mamba | lora"""
    flops: float
    bytes: float
    kernels: float
    rows: float
    """GEMM rows (tokens per matmul): small ones run below peak."""
    backward: float
    """Backward work as a multiple of the forward work."""
    recompute: bool = True
    """Recomputed under gradient checkpointing (everything inside a block)."""
    grouped: bool = False
    """One grouped/batched GEMM over all experts (grouped_mm, batched_mm): its own efficiency class."""


def _expected_experts_hit(tokens: float, k: int, experts: int) -> float:
    """Expected number of experts that receive at least one of tokens x k routed slots."""
    if experts <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - 1.0 / experts) ** (tokens * k))


def micro_batch_ops(scn: Scenario, batch: int, seq: float) -> list[Op]:
    """The forward ops of one micro-batch of `batch` sequences padded to `seq` tokens."""
    m, mix = scn.model, scn.mix
    a = m.arch
    c = 4.0 if mix.precision == "fp32" else 2.0
    tokens = batch * seq
    top_k = scn.top_k
    full = mix.method == "full"
    lora = m.lora_target_ids(mix.lora_targets) if mix.trains_lora else frozenset()
    rank = mix.lora_rank
    ops: list[Op] = []
    causal = 0.5 if mix.attention in ("flash", "sdpa") else 1.0  # fused kernels skip masked blocks
    for layer, n in m.layer_groups:
        for lin in layer.linears:
            # frozen weights need input gradients only; PEFT's LoRA on a fused expert stack trains W + B @ A,
            # whose weight gradient the grouped GEMM computes in full
            merged = mix.fused_experts and lin.group == "experts" and id(lin) in lora
            bwd = 2.0 if (full or merged) else 1.0
            w = lin.in_features * lin.out_features
            lt = lin.group if lin.group in ("attention", "mlp", "experts", "router", "mamba") else (
                "experts" if lin.group == "shared_expert" else "router")
            if lin.group == "experts":
                slots = tokens * top_k
                hit = _expected_experts_hit(tokens, top_k, lin.count)
                flops = 2.0 * slots * w
                if mix.experts_backend == "batched_mm":
                    w_bytes = c * w * slots          # each routed token gathers its expert's weight
                    kernels, rows = 1.0, max(tokens, 1.0)
                else:
                    w_bytes = c * w * hit
                    kernels = hit if mix.experts_backend in ("eager", "modules") else 1.0
                    rows = slots / max(hit, 1.0)
                byts = w_bytes + c * slots * (lin.in_features + lin.out_features)
                ops.append(Op("matmul", "experts", flops * n, byts * n, kernels * n, rows, bwd,
                              grouped=mix.experts_backend in ("grouped_mm", "batched_mm")))
                if mix.method == "qlora" and not mix.fused_experts:  # bitsandbytes quantizes per-expert modules only
                    ops.append(Op("dequant", "experts", 0.0, (NF4_BYTES + 2.0) * w * hit * n, hit * n, 1, 1.0))
                if mix.experts_backend in ("eager", "modules") and lin.role == "gate":
                    ops.append(Op("dispatch", "experts", 0.0, 0.0, hit * n, 1, 1.0))
                used = hit
            else:
                flops = 2.0 * tokens * w
                byts = c * (w + tokens * (lin.in_features + lin.out_features))
                # torch's checkpoint stops recomputing at the block's last saved tensor: the dense down
                # projection's input, unless a LoRA adapter on it saves later ones (then lora_B is the skipped op)
                rec = not (lin.role == "down" and layer.ffn == "dense" and (full or id(lin) not in lora))
                ops.append(Op("matmul", lt, flops * n, byts * n, n, tokens, bwd, recompute=rec))
                if mix.method == "qlora" and lin.group != "router":
                    ops.append(Op("dequant", lt, 0.0, (NF4_BYTES + 2.0) * w * n, n, 1, 1.0))
                used = 1.0
            if merged:
                # PEFT merges W + B @ A for the whole stack whatever the token count; the experts module reads
                # the parametrized weight twice per forward (two merges, one of them in the graph: backward
                # dA + dB = one merge's FLOPs twice). Inside the experts module, where the profiler's hooks see it.
                merge = 2.0 * rank * lin.in_features * lin.out_features * lin.count
                ops.append(Op("matmul", "experts", 2 * merge * n, 2 * c * 2 * lin.params * n, 2 * 2 * n, lin.out_features, 1.0))
            elif id(lin) in lora:
                # A: in -> r, B: r -> out, both trained (x2 in backward); experts get one adapter each
                lflops = 2.0 * (tokens * (top_k if lin.group == "experts" else 1)) * rank * (lin.in_features + lin.out_features)
                lbytes = c * (tokens * (top_k if lin.group == "experts" else 1)) * (lin.in_features + 2 * rank + lin.out_features)
                ops.append(Op("matmul", "lora", lflops * n, lbytes * n, 3 * n * (used if mix.experts_backend in ("eager", "modules") else 1),
                              tokens, 2.0))
        # attention core and the elementwise traffic of the block
        if layer.mixer == "attention":
            qk = (a.qk_nope_head_dim + a.qk_rope_head_dim) if a.attention == "mla" else a.head_dim
            vd = a.v_head_dim if a.attention == "mla" else a.head_dim
            att_flops = 2.0 * batch * seq * seq * a.num_heads * (qk + vd) * causal
            att_bytes = c * tokens * a.num_heads * (qk * 2 + vd * 2)
            kernels = 1.0
            if mix.attention == "eager":
                att_bytes += (4 + 2 + 4) * 2 * batch * a.num_heads * seq * seq  # scores written, softmaxed, read
                kernels = 6.0
            ops.append(Op("attention", "attention", att_flops * n, att_bytes * n, kernels * n, tokens,
                          2.5 if mix.attention != "eager" else 2.0))
        elif layer.mixer == "mamba":
            di, ds = a.mamba_d_inner, a.mamba_d_state
            ops.append(Op("stream", "mamba", 9.0 * tokens * di * ds * n, c * tokens * di * 8 * n, 6 * n, tokens, 2.0))
        # norms, residuals, activations, RoPE: about a dozen passes over hidden-sized tensors per block
        inter = a.intermediate_size if layer.ffn == "dense" else a.moe_intermediate_size * max(top_k, 1)
        stream_bytes = c * tokens * (12 * a.hidden_size + 4 * inter)
        ops.append(Op("stream", "norms_other", 0.0, stream_bytes * n, 18 * n, tokens, 2.0))
    # LM head and loss (not inside a checkpointed block)
    v, h = a.vocab_size, a.hidden_size
    head_trained = full
    ops.append(Op("matmul", "lm_head", 2.0 * tokens * h * v, c * (h * v + tokens * (h + v)), 1, tokens,
                  2.0 if head_trained else 1.0, recompute=False))
    ops.append(Op("stream", "lm_head", 0.0, tokens * v * (c + 4 * 4), 6, tokens, 1.5, recompute=False))
    return ops


def model_flops(scn: Scenario, tokens: float, seq: float) -> float:
    """Model FLOPs of one training pass over `tokens` (for MFU): 6 x active params x tokens when weights train,
    4x for frozen ones (no weight gradients), plus causal attention; recompute is not useful work."""
    m = scn.model
    # the embedding lookup is not a matmul, but a tied LM head is the same matrix used as one
    a0 = m.arch
    head_matmul = a0.vocab_size * a0.hidden_size if m.lm_head_params == 0 else 0
    active = m.active_params(scn.top_k or None) - m.embedding_params + head_matmul
    factor = 6.0 if scn.mix.method == "full" else 4.0
    a = m.arch
    attn = 0.0
    if a.num_heads:
        n_att = sum(n for layer, n in m.layer_groups if layer.mixer == "attention")
        attn = 2.0 * tokens * seq * a.num_heads * a.head_dim * n_att * 3.0  # fwd 2*s*d*heads (causal half of 4), bwd 2x
    return factor * active * tokens + attn


def step_flops(scn: Scenario, batch: int, seq: float) -> dict[str, float]:
    """FLOPs one micro-batch executes: forward, backward and recompute (what a FLOP counter would report)."""
    fwd = bwd = rec = 0.0
    for op in micro_batch_ops(scn, batch, seq):
        fwd += op.flops
        bwd += op.flops * op.backward
        if scn.mix.gradient_checkpointing and op.recompute:
            rec += op.flops
    return {"forward": fwd, "backward": bwd, "recompute": rec, "total": fwd + bwd + rec}
