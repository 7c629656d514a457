"""Work of one micro-batch on one GPU: FLOPs, bytes moved, kernel launches and GEMM shapes, per op, by layer type.

Each `Op` is the forward work of one kind of operation summed over the blocks this GPU holds, with how many
times that work recurs in backward (2x where weights train: input and weight gradients; 1x for frozen
weights: input gradients only) and whether gradient checkpointing recomputes it. The parallel layout is applied
here: tensor parallelism splits every matmul and the heads, context parallelism the tokens, pipeline
parallelism the blocks (the LM head stays on the last stage), expert parallelism the experts.
"""
from __future__ import annotations

from typing import NamedTuple

from ..spec.scenario import Scenario, fast_replace
from .memory import kbit_bytes_per_weight
from .shared import KeyMemo

LOSS_TRAFFIC = {
    "standard": (lambda c: c + 4 * 4, 1.5, 6),
    "fused": (lambda c: c, 2.0, 1),
}
"""mix.loss -> (bytes per logit the loss moves in forward, given the compute dtype's size; backward traffic as a
multiple of it; kernels). standard: the logits upcast to fp32 and log-softmaxed by separate kernels (read c, write
4, read 4, write 4, gather), the backward about 1.5x that. fused: flash-attn's cross-entropy kernel (llm-foundry's
default loss_fn) reads the compute-dtype logits once in forward, and in backward reads them again and writes their
gradient (2x). The other losses are counted as standard."""
PEFT_ADAPTER_KERNELS = 4
"""Kernels one PEFT LoRA adapter launches besides its two GEMMs: dropout (identity at p=0 launches none), the
input cast to the adapter's dtype and back, the scaling multiply and the residual add."""


class Op(NamedTuple):
    """Forward work of one operation kind in one micro-batch (summed over the blocks holding it). A named tuple:
    a plan makes a micro-batch's ops for every new micro-batch it meets, and a tuple is made ~4x faster than a
    frozen dataclass (which sets its 17 fields one call at a time)."""

    kind: str
    """matmul | attention | stream | dequant | dispatch"""
    layer: str
    """attention | mlp | experts | router | lm_head | norms_other | mamba | lora"""
    flops: float
    bytes: float
    kernels: float
    rows: float
    """GEMM rows M (tokens per matmul; per expert for routed experts)."""
    backward: float
    """Backward work as a multiple of the forward work."""
    recompute: bool = True
    """Recomputed under full gradient checkpointing (everything inside a block up to its last saved tensor)."""
    grouped: bool = False
    """One grouped/batched GEMM over all experts (grouped_mm, batched_mm): its own efficiency class."""
    n: int = 0
    """GEMM output columns N of one matmul (0: not a GEMM)."""
    k: int = 0
    """GEMM depth K of one matmul."""
    groups: int = 1
    """GEMMs of this shape launched together (a grouped expert GEMM's experts)."""
    seq: float = 0.0
    """Attention: the sequence length its kernel sees."""
    fp8: bool = False
    """Runs in FP8 (mix.fp8 on a base-weight GEMM)."""
    fusible: bool = False
    """Elementwise work torch.compile fuses (norms, residuals, activations, the loss's softmax)."""
    head: bool = False
    """Outside the blocks (LM head and loss): on the last pipeline stage only."""


class Split(NamedTuple):
    """The degrees of parallelism a micro-batch's ops read: layout.layout's, which copies them from the mix. Its
    links need the cluster and no op reads them (cached_ops keys on no cluster field); a plan makes the ops of every
    new micro-batch, and layout(scn) was a sixth of that."""

    tp: int
    """Tensor parallel: splits every matmul and the heads."""
    pp: int
    """Pipeline stages: split the blocks."""
    cp: int
    """Context parallel: splits the tokens."""
    ep: int
    """Expert parallel: splits the experts."""
    sequence_parallel: bool
    """The norms' hidden state split over the tensor-parallel ranks too."""


def split_of(mix) -> Split:
    """The mix's degrees of parallelism, as layout(scn) has them (tests/estimate/test_compute.py checks it)."""
    return Split(mix.tensor_parallel, mix.pipeline_parallel, mix.context_parallel, mix.expert_parallel,
                 mix.sequence_parallel)


_new = tuple.__new__
"""_new(Op, (every field, in Op's order)) makes an Op without NamedTuple's __new__ call and its keyword defaults:
a tenth of micro_batch_ops' time, which the search's bounds call thousands of times."""


def _expected_experts_hit(tokens: float, k: int, experts: int) -> float:
    """Expected number of experts that receive at least one of tokens x k routed slots."""
    if experts <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - 1.0 / experts) ** (tokens * k))


def _expert_op(scn: Scenario, lin, n: int, tokens: float, bwd: float, c: float, lay: Split) -> list[Op]:
    mix = scn.mix
    top_k = scn.top_k
    local = max(lin.count // lay.ep, 1)            # experts this GPU holds
    slots = tokens * top_k                          # balanced routing: as many slots arrive as leave
    hit = _expected_experts_hit(slots / top_k * lay.ep, top_k, lin.count) * local / lin.count
    w = lin.in_features * lin.out_features / lay.tp
    flops = 2.0 * slots * w
    grouped = mix.experts_backend in ("grouped_mm", "batched_mm")
    if mix.experts_backend == "batched_mm":
        w_bytes = c * w * slots                     # each routed token gathers its expert's weight
        kernels, rows, groups = 1.0, max(slots, 1.0), 1
    else:
        w_bytes = c * w * hit
        kernels = hit if mix.experts_backend in ("eager", "modules") else 1.0
        rows, groups = slots / max(hit, 1.0), (max(int(round(hit)), 1) if grouped else 1)
    byts = w_bytes + c * slots * (lin.in_features + lin.out_features) / lay.tp
    ops = [_new(Op, ("matmul", "experts", flops * n, byts * n, kernels * n, rows, bwd, True, grouped,
                     max(lin.out_features // lay.tp, 1), lin.in_features, groups, 0.0, False, False, False))]
    if mix.method == "qlora" and not mix.fused_experts:  # bitsandbytes quantizes per-expert modules only
        ops.append(_new(Op, ("dequant", "experts", 0.0, (kbit_bytes_per_weight(scn) + 2.0) * w * hit * n, hit * n,
                             1, 1.0, True, False, 0, 0, 1, 0.0, False, False, False)))
    if mix.experts_backend in ("eager", "modules") and lin.role == "down":
        ops.append(_new(Op, ("dispatch", "experts", 0.0, 0.0, hit * n, 1, 1.0, True, False, 0, 0, 1, 0.0, False,
                             False, False)))
    return ops


def _lora_ops(scn: Scenario, lin, n: int, tokens: float, c: float, used: float, lay: Split) -> list[Op]:
    """The adapter's A (in -> r) and B (r -> out) GEMMs, both trained (x2 in backward); experts get one each."""
    mix = scn.mix
    rank = mix.lora_rank
    t = tokens * (scn.top_k if lin.group == "experts" else 1)
    per = used if mix.experts_backend in ("eager", "modules") else 1.0
    extra = PEFT_ADAPTER_KERNELS if mix.precision in ("bf16-mixed", "fp16-mixed") else PEFT_ADAPTER_KERNELS - 1
    a_ops = _new(Op, ("matmul", "lora", 2.0 * t * rank * lin.in_features / lay.tp * n,
                      c * t * (lin.in_features / lay.tp + rank) * n, (1 + extra / 2) * n * per, t, 2.0, True, False,
                      rank, max(lin.in_features // lay.tp, 1), 1, 0.0, False, False, False))
    b_ops = _new(Op, ("matmul", "lora", 2.0 * t * rank * lin.out_features / lay.tp * n,
                      c * t * (rank + lin.out_features / lay.tp) * n, (1 + extra / 2) * n * per, t, 2.0, True, False,
                      max(lin.out_features // lay.tp, 1), rank, 1, 0.0, False, False, False))
    return [a_ops, b_ops]


_LAYER_OF = {"attention": "attention", "mlp": "mlp", "experts": "experts", "router": "router", "mamba": "mamba",
             "shared_expert": "experts"}
"""Op.layer of a linear's group (any other group: router)."""


def _linear_ops(scn: Scenario, layer, lin, n: int, tokens: float, c: float, lay: Split, lora: frozenset) -> list[Op]:
    mix, group, adapted = scn.mix, lin.group, id(lin) in lora
    full = mix.method == "full"
    # frozen weights need input gradients only; PEFT's LoRA on a fused expert stack trains W + B @ A, whose
    # weight gradient the grouped GEMM computes in full
    merged = group == "experts" and adapted and mix.fused_experts
    bwd = 2.0 if (full or merged) else 1.0
    lt = _LAYER_OF.get(group, "router")
    if group == "experts":
        ops = _expert_op(scn, lin, n, tokens, bwd, c, lay)
        used = _expected_experts_hit(tokens * lay.ep, scn.top_k, lin.count) / lay.ep
    else:
        w = lin.in_features * lin.out_features / lay.tp
        byts = c * (w + tokens * (lin.in_features + lin.out_features) / lay.tp)
        # torch's checkpoint stops recomputing at the block's last saved tensor: the dense down projection's
        # input, unless a LoRA adapter on it saves later ones (then lora_B is the skipped op)
        rec = not (lin.role == "down" and layer.ffn == "dense" and (full or not adapted))
        fp8 = mix.fp8 and group != "router"
        ops = [_new(Op, ("matmul", lt, 2.0 * tokens * w * n, byts * n, n, tokens, bwd, rec, False,
                         max(lin.out_features // lay.tp, 1), lin.in_features, 1, 0.0, fp8, False, False))]
        if fp8:  # cast input and weight to FP8 (read bf16, write fp8) in forward, the output gradient in backward;
            # elementwise work a fusing stack folds into the producer (Transformer Engine's LayerNormLinear and
            # fused activations emit FP8, Inductor fuses torchao's casts), so compile's factors apply
            cast = 3.0 * (tokens * lin.in_features / lay.tp + w)
            ops.append(_new(Op, ("stream", "norms_other", 0.0, cast * n, 2 * n, tokens, 1.0, True, False, 0, 0, 1,
                                 0.0, False, True, False)))
        if mix.method == "qlora" and group != "router":
            ops.append(_new(Op, ("dequant", lt, 0.0, (kbit_bytes_per_weight(scn) + 2.0) * w * n, n, 1, 1.0, True,
                                 False, 0, 0, 1, 0.0, False, False, False)))
        used = 1.0
    if merged:
        # PEFT merges W + B @ A for the whole stack whatever the token count; the experts module reads the
        # parametrized weight twice per forward (two merges, one of them in the graph: backward dA + dB = one
        # merge's FLOPs twice). Inside the experts module, where the profiler's hooks see it.
        merge = 2.0 * mix.lora_rank * lin.in_features * lin.out_features * lin.count / lay.tp / lay.ep
        ops.append(_new(Op, ("matmul", "experts", 2 * merge * n, 2 * c * 2 * lin.params / lay.tp / lay.ep * n,
                             2 * 2 * n, lin.out_features, 1.0, True, False, lin.in_features, mix.lora_rank, 1, 0.0,
                             False, False, False)))
    elif adapted:
        ops += _lora_ops(scn, lin, n, tokens, c, used, lay)
    return ops


def _attention_op(scn: Scenario, n: int, batch: int, seq: float, c: float, lay: Split) -> Op:
    a, mix = scn.model.arch, scn.mix
    qk = (a.qk_nope_head_dim + a.qk_rope_head_dim) if a.attention == "mla" else a.head_dim
    vd = a.v_head_dim if a.attention == "mla" else a.head_dim
    heads = a.num_heads / lay.tp
    fused = mix.attention != "eager"
    causal = 0.5 if fused else 1.0  # fused kernels skip masked blocks
    tokens = batch * seq / lay.cp
    # ring context parallelism: each GPU's queries against every key, in chunks of seq / cp
    flops = 2.0 * batch * seq * seq * heads * (qk + vd) * causal / lay.cp
    byts = c * tokens * heads * (qk * 2 + vd * 2)
    kernels = 1.0
    if not fused:
        byts += (4 + 2 + 4) * 2 * batch * heads * seq * seq / lay.cp  # scores written, softmaxed, read
        kernels = 6.0
    kernel_seq = seq / lay.cp if mix.context_parallel_impl == "ring" else seq
    return _new(Op, ("attention", "attention", flops * n, byts * n, kernels * n, tokens, 2.5 if fused else 2.0, True,
                     False, 0, qk, 1, kernel_seq, False, False, False))


EAGER_NORM_BYTES = 28.0
"""Bytes per element an eager RMSNorm moves beyond its compute-dtype input and output (4 c, added by the caller):
Hugging Face's and torchtune's upcast the input to fp32 (write 4), square it (read 4, write 4), take the mean (read
4), scale (read 4, write 4) and cast back (read 4): 28 bytes in five kernels, then the weight multiply."""
EAGER_KERNELS, FUSED_KERNELS = 18, 6
"""Elementwise kernels per block: eager (two norms of five, residual adds, RoPE's multiply / rotate / add on q and
k, the gated activation) and fused (a norm with its residual add twice, one RoPE kernel, one activation)."""


def _elementwise_op(scn: Scenario, layer, n: float, tokens: float, c: float, lay: Split) -> Op:
    """A block's norms, residual adds, RoPE and gated activation. Eager PyTorch (Hugging Face, torchtune
    uncompiled): per element of the hidden state and norm 28 + 4c for the RMSNorm and 3c for its residual add,
    10c per rotated element of q and k (multiply by cos, negate and concatenate the halves, multiply by sin, add),
    5c per element of the gated activation (SiLU, then the product with up). Fused kernels (Transformer Engine,
    Megatron, llm-foundry's MPT, Triton norms; `mix.fused_elementwise`): each norm reads the input and the
    residual and writes both (4c), RoPE reads and writes q and k once (2c), the activation reads two and writes
    one (3c). torch.compile fuses the eager kernels (`compile_stream_bytes`)."""
    a, mix = scn.model.arch, scn.mix
    gated = any(lin.role in ("gate", "gate_up") for lin in layer.linears) or layer.ffn == "moe"
    inter = {"dense": a.intermediate_size, "moe": a.moe_intermediate_size * max(scn.top_k, 1)}.get(layer.ffn, 0)
    inter /= lay.tp
    hidden = a.hidden_size / (lay.tp if lay.sequence_parallel else 1)
    norms = 2 if layer.mixer == "attention" else 1   # BlackMamba's blocks are a mixer or an MoE, one norm each
    rotated = (a.num_heads + a.num_kv_heads) * a.head_dim / lay.tp if layer.mixer == "attention" else 0.0
    if mix.fused_elementwise:
        per_token = norms * 4 * c * hidden + 2 * c * rotated + 3 * c * inter
        return _new(Op, ("stream", "norms_other", 0.0, per_token * tokens * n, FUSED_KERNELS * n, tokens, 2.0, True,
                         False, 0, 0, 1, 0.0, False, False, False))
    per_token = (norms * (EAGER_NORM_BYTES + 7 * c)) * hidden + 10 * c * rotated + (5 if gated else 2) * c * inter
    return _new(Op, ("stream", "norms_other", 0.0, per_token * tokens * n, EAGER_KERNELS * n, tokens, 2.0, True,
                     False, 0, 0, 1, 0.0, False, True, False))


_OPS_CACHE: dict[tuple, tuple[Op, ...]] = {}
_OPS_CACHE_SIZE = 4096
NOT_COMPUTE = {"zero_stage": 0, "fsdp": None, "offload": "none", "optimizer": "adamw"}
"""Mix fields that neither the ops of a micro-batch nor their pass times read (sharding, optimizer offload, the
optimizer: they change memory, collectives and the optimizer step only; plan/space.py declares the same dimensions
affects_compute=False). The ops and pass-time caches key on the mix with these set to one value (compute_mix), so
a sweep over them computes each micro-batch's work once; tests/estimate/test_compute.py checks they change
nothing there."""
_COMPUTE_MIXES = KeyMemo(lambda mix: fast_replace(mix, **NOT_COMPUTE), _OPS_CACHE_SIZE)


def compute_mix(mix):
    """The mix with the NOT_COMPUTE fields at one value: the part of it a micro-batch's work depends on."""
    return _COMPUTE_MIXES[mix]


def cached_ops(scn: Scenario, batch: int, seq: float) -> tuple[Op, ...]:
    """micro_batch_ops, shared by scenarios that differ only in GPU and GPU count (what a plan sweeps) or in the
    NOT_COMPUTE mix fields: the ops depend on the model, the rest of the mix (layout included) and the batch shape
    alone."""
    key = (scn.model, compute_mix(scn.mix), batch, seq)
    ops = _OPS_CACHE.get(key)
    if ops is None:
        if len(_OPS_CACHE) >= _OPS_CACHE_SIZE:
            _OPS_CACHE.clear()
        ops = _OPS_CACHE[key] = tuple(micro_batch_ops(scn, batch, seq))
    return ops


def micro_batch_ops(scn: Scenario, batch: int, seq: float) -> list[Op]:
    """The forward ops of one micro-batch of `batch` sequences padded to `seq` tokens, on one GPU."""
    m, mix = scn.model, scn.mix
    a = m.arch
    lay = split_of(mix)
    c = 4.0 if mix.precision == "fp32" else 2.0
    tokens = batch * seq / lay.cp
    lora = m.lora_target_ids(mix.lora_targets) if mix.trains_lora else frozenset()
    ops: list[Op] = []
    split = 1.0 / lay.pp  # this GPU's share of the blocks
    for layer, count in m.layer_groups:
        n = count * split
        for lin in layer.linears:
            ops += _linear_ops(scn, layer, lin, n, tokens, c, lay, lora)
        if layer.mixer == "attention":
            ops.append(_attention_op(scn, n, batch, seq, c, lay))
        elif layer.mixer == "mamba":
            di, ds = a.mamba_d_inner, a.mamba_d_state
            ops.append(_new(Op, ("stream", "mamba", 9.0 * tokens * di * ds * n, c * tokens * di * 8 * n, 6 * n, tokens,
                                 2.0, True, False, 0, 0, 1, 0.0, False, False, False)))
        ops.append(_elementwise_op(scn, layer, n, tokens, c, lay))
    # LM head and loss (not inside a checkpointed block; on the last pipeline stage; vocabulary split by TP)
    v, h = a.vocab_size / lay.tp, a.hidden_size
    ops.append(_new(Op, ("matmul", "lm_head", 2.0 * tokens * h * v, c * (h * v + tokens * (h + v)), 1, tokens,
                         2.0 if mix.method == "full" else 1.0, False, False, int(v), h, 1, 0.0, False, False, True)))
    per_logit, back, kernels = LOSS_TRAFFIC.get(mix.loss, LOSS_TRAFFIC["standard"])
    ops.append(_new(Op, ("stream", "lm_head", 0.0, tokens * v * per_logit(c), kernels, tokens, back, False, False, 0, 0,
                         1, 0.0, False, True, True)))
    return ops


def model_flops(scn: Scenario, tokens: float, seq: float) -> float:
    """Model FLOPs of one training pass over `tokens` (for MFU): 6 x active params x tokens when weights train,
    4x for frozen ones (no weight gradients), plus causal attention; recompute is not useful work."""
    m = scn.model
    # the embedding lookup is not a matmul, but a tied LM head is the same matrix used as one
    a = m.arch
    head_matmul = a.vocab_size * a.hidden_size if m.lm_head_params == 0 else 0
    active = m.active_params(scn.top_k or None) - m.embedding_params + head_matmul
    factor = 6.0 if scn.mix.method == "full" else 4.0
    attn = 0.0
    if a.num_heads:
        n_att = sum(n for layer, n in m.layer_groups if layer.mixer == "attention")
        attn = 2.0 * tokens * seq * a.num_heads * a.head_dim * n_att * 3.0  # fwd 2*s*d*heads (causal half of 4), bwd 2x
    return factor * active * tokens + attn


def recomputed(op: Op, mix) -> float:
    """Share of an op's forward that activation checkpointing runs again in backward: full checkpointing reruns
    a block up to its last saved tensor (every N-th block with checkpoint_every N); Megatron's selective
    checkpointing reruns the attention core; torchtitan's per-op policy the elementwise ops between matmuls."""
    if not mix.gradient_checkpointing or op.head:
        return 0.0
    if mix.checkpointing == "selective":
        return 1.0 if op.kind == "attention" else 0.0
    if mix.checkpointing == "per-op":
        return 1.0 if op.fusible else 0.0
    return 1.0 / mix.checkpoint_every if op.recompute else 0.0


def step_flops(scn: Scenario, batch: int, seq: float) -> dict[str, float]:
    """FLOPs one micro-batch executes on one GPU: forward, backward and recompute (what a FLOP counter reports)."""
    fwd = bwd = rec = 0.0
    for op in micro_batch_ops(scn, batch, seq):
        fwd += op.flops
        bwd += op.flops * op.backward
        rec += op.flops * recomputed(op, scn.mix)
    return {"forward": fwd, "backward": bwd, "recompute": rec, "total": fwd + bwd + rec}
