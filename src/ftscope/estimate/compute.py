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


# micro_batch_ops in two steps: _parts, once per model and mix, takes each op's work as far as it does not depend on
# the batch shape, in the op order; _build finishes each op from the micro-batch's tokens. Each float is the same
# expression as before the split, evaluated in the same order (`a * b * t` keeps `a * b`; `t * a * b` keeps none):
# tests/estimate/test_compute.py compares the ops with a verbatim copy of the one-step code (==, types too).
_DENSE, _EXPERT, _LORA, _ATTENTION, _MAMBA, _ELEMENTWISE, _FIXED = range(7)


def _expert_part(scn: Scenario, lin, n: float, bwd: float, c: float, lay: Split) -> tuple:
    """A routed-expert linear's part: balanced routing (as many slots arrive as leave); the GEMM over the experts
    this GPU holds that the tokens hit; QLoRA's dequantization of the per-expert modules bitsandbytes quantizes; the
    eager expert loop's synchronization per expert (at the down projection)."""
    mix, backend = scn.mix, scn.mix.experts_backend
    w = lin.in_features * lin.out_features / lay.tp
    dq = (kbit_bytes_per_weight(scn) + 2.0) * w if mix.method == "qlora" and not mix.fused_experts else None
    return (_EXPERT, scn.top_k, lay.ep, lin.count, max(lin.count // lay.ep, 1), w,
            backend in ("grouped_mm", "batched_mm"), backend == "batched_mm", backend in ("eager", "modules"), c * w,
            lin.in_features + lin.out_features, lay.tp, n, bwd, max(lin.out_features // lay.tp, 1), lin.in_features, dq,
            backend in ("eager", "modules") and lin.role == "down")


def _lora_part(scn: Scenario, lin, n: float, lay: Split) -> tuple:
    """The adapter's A (in -> r) and B (r -> out) GEMMs, both trained (x2 in backward); experts get one each (per
    expert the tokens hit in the eager expert loop)."""
    mix = scn.mix
    extra = PEFT_ADAPTER_KERNELS if mix.precision in ("bf16-mixed", "fp16-mixed") else PEFT_ADAPTER_KERNELS - 1
    return (_LORA, scn.top_k if lin.group == "experts" else 1, mix.experts_backend in ("eager", "modules"),
            mix.lora_rank, lin.in_features, lin.out_features, lay.tp, n, (1 + extra / 2) * n,
            lin.in_features / lay.tp + mix.lora_rank, mix.lora_rank + lin.out_features / lay.tp,
            max(lin.in_features // lay.tp, 1), max(lin.out_features // lay.tp, 1))


_LAYER_OF = {"attention": "attention", "mlp": "mlp", "experts": "experts", "router": "router", "mamba": "mamba",
             "shared_expert": "experts"}
"""Op.layer of a linear's group (any other group: router)."""


def _linear_parts(scn: Scenario, layer, lin, n: float, c: float, lay: Split, lora: frozenset) -> list[tuple]:
    mix, group, adapted = scn.mix, lin.group, id(lin) in lora
    full = mix.method == "full"
    # frozen weights need input gradients only; PEFT's LoRA on a fused expert stack trains W + B @ A, whose
    # weight gradient the grouped GEMM computes in full
    merged = group == "experts" and adapted and mix.fused_experts
    bwd = 2.0 if (full or merged) else 1.0
    lt = _LAYER_OF.get(group, "router")
    if group == "experts":
        parts = [_expert_part(scn, lin, n, bwd, c, lay)]
    else:
        w = lin.in_features * lin.out_features / lay.tp
        # torch's checkpoint stops recomputing at the block's last saved tensor: the dense down projection's
        # input, unless a LoRA adapter on it saves later ones (then lora_B is the skipped op)
        rec = not (lin.role == "down" and layer.ffn == "dense" and (full or not adapted))
        fp8 = mix.fp8 and group != "router"
        # fp8: cast input and weight to FP8 (read bf16, write fp8) in forward, the output gradient in backward;
        # elementwise work a fusing stack folds into the producer (Transformer Engine's LayerNormLinear and fused
        # activations emit FP8, Inductor fuses torchao's casts), so compile's factors apply
        dq = (_new(Op, ("dequant", lt, 0.0, (kbit_bytes_per_weight(scn) + 2.0) * w * n, n, 1, 1.0, True, False, 0, 0, 1,
                        0.0, False, False, False)) if mix.method == "qlora" and group != "router" else None)
        parts = [(_DENSE, lt, w, lin.in_features + lin.out_features, lay.tp, n, bwd, rec,
                  max(lin.out_features // lay.tp, 1), lin.in_features, fp8, 2 * n, dq)]
    if merged:
        # PEFT merges W + B @ A for the whole stack whatever the token count; the experts module reads the
        # parametrized weight twice per forward (two merges, one of them in the graph: backward dA + dB = one
        # merge's FLOPs twice). Inside the experts module, where the profiler's hooks see it.
        merge = 2.0 * mix.lora_rank * lin.in_features * lin.out_features * lin.count / lay.tp / lay.ep
        parts.append((_FIXED, _new(Op, ("matmul", "experts", 2 * merge * n,
                                        2 * c * 2 * lin.params / lay.tp / lay.ep * n, 2 * 2 * n, lin.out_features, 1.0,
                                        True, False, lin.in_features, mix.lora_rank, 1, 0.0, False, False, False))))
    elif adapted:
        parts.append(_lora_part(scn, lin, n, lay))
    return parts


def _attention_part(scn: Scenario, n: float, lay: Split) -> tuple:
    """Fused kernels skip masked blocks (half the causal scores) in one kernel; eager attention writes, softmaxes and
    reads the scores in six. Ring context parallelism: each GPU's queries against every key, in chunks of seq / cp."""
    a, mix = scn.model.arch, scn.mix
    qk = (a.qk_nope_head_dim + a.qk_rope_head_dim) if a.attention == "mla" else a.head_dim
    vd = a.v_head_dim if a.attention == "mla" else a.head_dim
    fused = mix.attention != "eager"
    return (_ATTENTION, a.num_heads / lay.tp, qk + vd, 0.5 if fused else 1.0, lay.cp, qk * 2 + vd * 2, fused,
            (1.0 if fused else 6.0) * n, mix.context_parallel_impl == "ring", n, qk)


EAGER_NORM_BYTES = 28.0
"""Bytes per element an eager RMSNorm moves beyond its compute-dtype input and output (4 c, added by the caller):
Hugging Face's and torchtune's upcast the input to fp32 (write 4), square it (read 4, write 4), take the mean (read
4), scale (read 4, write 4) and cast back (read 4): 28 bytes in five kernels, then the weight multiply."""
EAGER_KERNELS, FUSED_KERNELS = 18, 6
"""Elementwise kernels per block: eager (two norms of five, residual adds, RoPE's multiply / rotate / add on q and
k, the gated activation) and fused (a norm with its residual add twice, one RoPE kernel, one activation)."""


def _elementwise_part(scn: Scenario, layer, n: float, c: float, lay: Split) -> tuple:
    """A block's norms, residual adds, RoPE and gated activation, per token. Eager PyTorch (Hugging Face, torchtune
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
        return (_ELEMENTWISE, per_token, n, FUSED_KERNELS * n, False)
    per_token = (norms * (EAGER_NORM_BYTES + 7 * c)) * hidden + 10 * c * rotated + (5 if gated else 2) * c * inter
    return (_ELEMENTWISE, per_token, n, EAGER_KERNELS * n, True)


def _parts(scn: Scenario) -> tuple:
    """(context-parallel degree, bytes per compute-dtype element, each op's part in order, the LM head's and the
    loss's) of the scenario's micro-batches: what micro_batch_ops reads of the model and mix."""
    m, mix = scn.model, scn.mix
    a = m.arch
    lay = split_of(mix)
    c = 4.0 if mix.precision == "fp32" else 2.0
    lora = m.lora_target_ids(mix.lora_targets) if mix.trains_lora else frozenset()
    parts: list[tuple] = []
    split = 1.0 / lay.pp  # this GPU's share of the blocks
    for layer, count in m.layer_groups:
        n = count * split
        for lin in layer.linears:
            parts += _linear_parts(scn, layer, lin, n, c, lay, lora)
        if layer.mixer == "attention":
            parts.append(_attention_part(scn, n, lay))
        elif layer.mixer == "mamba":
            parts.append((_MAMBA, a.mamba_d_inner, a.mamba_d_state, n, 6 * n))
        parts.append(_elementwise_part(scn, layer, n, c, lay))
    # LM head and loss (not inside a checkpointed block; on the last pipeline stage; vocabulary split by TP)
    v, h = a.vocab_size / lay.tp, a.hidden_size
    per_logit, back, kernels = LOSS_TRAFFIC.get(mix.loss, LOSS_TRAFFIC["standard"])
    head = (v, h, h * v, h + v, 2.0 if mix.method == "full" else 1.0, int(v), per_logit(c), kernels, back)
    return lay.cp, c, tuple(parts), head


def _build(parts: tuple, batch: int, seq: float) -> list[Op]:
    """micro_batch_ops from _parts: each op finished from the micro-batch's tokens."""
    cp, c, each, (v, h, hv, h_v, head_bwd, v_int, per_logit, loss_kernels, loss_back) = parts
    tokens = batch * seq / cp
    ops: list[Op] = []
    add = ops.append
    used = 1.0  # the experts the last routed linear's tokens hit (a LoRA adapter on it runs once per expert)
    for p in each:
        code = p[0]
        if code == _DENSE:
            _, lt, w, io, tp, n, bwd, rec, n_out, k_in, fp8, two_n, dq = p
            add(_new(Op, ("matmul", lt, 2.0 * tokens * w * n, c * (w + tokens * io / tp) * n, n, tokens, bwd, rec,
                          False, n_out, k_in, 1, 0.0, fp8, False, False)))
            if fp8:
                add(_new(Op, ("stream", "norms_other", 0.0, 3.0 * (tokens * k_in / tp + w) * n, two_n, tokens, 1.0,
                              True, False, 0, 0, 1, 0.0, False, True, False)))
            if dq is not None:
                add(dq)
            used = 1.0
        elif code == _EXPERT:
            _, top_k, ep, count, local, w, grouped, batched, looped, cw, io, tp, n, bwd, n_out, k_in, dq, sync = p
            slots = tokens * top_k
            hit = _expected_experts_hit(slots / top_k * ep, top_k, count) * local / count
            if batched:  # each routed token gathers its expert's weight
                w_bytes, kernels, rows, groups = cw * slots, 1.0, max(slots, 1.0), 1
            else:
                w_bytes = cw * hit
                kernels = hit if looped else 1.0
                rows, groups = slots / max(hit, 1.0), (max(int(round(hit)), 1) if grouped else 1)
            add(_new(Op, ("matmul", "experts", 2.0 * slots * w * n, (w_bytes + c * slots * io / tp) * n, kernels * n,
                          rows, bwd, True, grouped, n_out, k_in, groups, 0.0, False, False, False)))
            if dq is not None:  # bitsandbytes quantizes per-expert modules only
                add(_new(Op, ("dequant", "experts", 0.0, dq * hit * n, hit * n, 1, 1.0, True, False, 0, 0, 1, 0.0,
                              False, False, False)))
            if sync:
                add(_new(Op, ("dispatch", "experts", 0.0, 0.0, hit * n, 1, 1.0, True, False, 0, 0, 1, 0.0, False,
                              False, False)))
            used = _expected_experts_hit(tokens * ep, top_k, count) / ep
        elif code == _LORA:
            _, k, looped, rank, k_in, n_out, tp, n, kn, a_width, b_width, a_k, b_n = p
            t = tokens * k
            kernels = kn * (used if looped else 1.0)
            add(_new(Op, ("matmul", "lora", 2.0 * t * rank * k_in / tp * n, c * t * a_width * n, kernels, t, 2.0, True,
                          False, rank, a_k, 1, 0.0, False, False, False)))
            add(_new(Op, ("matmul", "lora", 2.0 * t * rank * n_out / tp * n, c * t * b_width * n, kernels, t, 2.0, True,
                          False, b_n, rank, 1, 0.0, False, False, False)))
        elif code == _ELEMENTWISE:
            _, per_token, n, kernels, fusible = p
            add(_new(Op, ("stream", "norms_other", 0.0, per_token * tokens * n, kernels, tokens, 2.0, True, False, 0,
                          0, 1, 0.0, False, fusible, False)))
        elif code == _ATTENTION:
            _, heads, qk_vd, causal, cp, width, fused, kernels, ring, n, qk = p
            byts = c * tokens * heads * width
            if not fused:  # scores written, softmaxed, read
                byts += (4 + 2 + 4) * 2 * batch * heads * seq * seq / cp
            add(_new(Op, ("attention", "attention", 2.0 * batch * seq * seq * heads * qk_vd * causal / cp * n,
                          byts * n, kernels, tokens, 2.5 if fused else 2.0, True, False, 0, qk, 1,
                          seq / cp if ring else seq, False, False, False)))
        elif code == _MAMBA:
            _, di, ds, n, kernels = p
            add(_new(Op, ("stream", "mamba", 9.0 * tokens * di * ds * n, c * tokens * di * 8 * n, kernels, tokens, 2.0,
                          True, False, 0, 0, 1, 0.0, False, False, False)))
        else:  # _FIXED: the same op whatever the tokens
            add(p[1])
    add(_new(Op, ("matmul", "lm_head", 2.0 * tokens * h * v, c * (hv + tokens * h_v), 1, tokens, head_bwd, False, False,
                  v_int, h, 1, 0.0, False, False, True)))
    add(_new(Op, ("stream", "lm_head", 0.0, tokens * v * per_logit, loss_kernels, tokens, loss_back, False, False, 0, 0,
                  1, 0.0, False, True, True)))
    return ops


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
    """The forward ops of one micro-batch of `batch` sequences padded to `seq` tokens, on one GPU (_parts of the
    model and mix, made once per pair, finished from the batch shape)."""
    key = (scn.model, scn.mix)
    parts = _PARTS.get(key)
    if parts is None:
        if len(_PARTS) >= _OPS_CACHE_SIZE:
            _PARTS.clear()
        parts = _PARTS[key] = _parts(scn)
    return _build(parts, batch, seq)


_PARTS: dict[tuple, tuple] = {}
"""_parts by (model, mix): a plan makes the ops of every new micro-batch of its sweep's model and mix."""


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
