"""Activation memory: the tensors autograd saves for backward, per token, per block.

Counted from what the HF implementations save (checked against fake-tensor traces, see `ftscope trace`):
- an RMSNorm/LayerNorm upcasts to fp32 and saves that copy (4 bytes x hidden);
- a linear layer saves its input only when its weight (or a LoRA adapter on it) needs a gradient;
- SiLU-gated MLPs save gate, act(gate), up and (if `down` is trained) their product;
- sdpa/flash save q, k, v, the output and a log-sum-exp; eager also keeps the fp32 softmax and its bf16 copy
  (6 bytes per head x s x s), and its backward holds 6 more (the fp32 upcast gradient and softmax's fp32
  input gradient) while the bf16 copy is already freed;
- routed experts save their per-token tensors once per selected expert (top-k);
- the loss upcasts logits to fp32: log_softmax saves B x T x V fp32; a chunked loss keeps the bf16 logits and
  every chunk's log-softmax, and upcasts one chunk at a time;
- under non-reentrant checkpointing, a 4-bit matmul that keeps its input as a ctx attribute (bitsandbytes <=
  0.43.1, recipe `kbit_matmul_keeps_input`) holds every such input that needs grad until the backward ends.

Which linears read which tensor is listed once, in `block_inputs`; the saved inputs and the held 4-bit inputs
are both counted from that list.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..spec.mix import Mix
from ..spec.model import Layer, Linear, ModelSpec
from ..spec.recipe import Recipe, load_recipe
from ..spec.scenario import fast_replace
from .shared import KeyMemo

LOSS_CHUNKS = 8
"""Chunks of a chunked cross-entropy (torchtune's CEWithChunkedOutputLoss default)."""


@dataclass(frozen=True)
class ActivationCoefficients:
    """Bytes that scale with tokens (T = B x s) and with B x s^2, for the whole model on one GPU."""

    saved_per_token: float
    """Saved for backward by all blocks, per token (no checkpointing)."""
    saved_per_token_quadratic: float
    """Saved per token per token of context (eager attention scores), summed over blocks."""
    layer_per_token: float
    """The largest single block's saved bytes per token (recomputed one at a time under checkpointing)."""
    layer_per_token_quadratic: float
    layer_ffn_per_token: float
    """The FFN/MoE part of that block's bytes: already freed when its attention's backward runs."""
    forward_transient_per_token: float
    """Extra bytes per token while the last block's forward runs: batched_mm under AMP gathers fp32 expert
    weights for every routed token before casting them (the bf16 copies are what is saved)."""
    checkpoint_per_token: float
    """Under gradient checkpointing: the block inputs kept for every block, per token (and the 4-bit linears'
    inputs a recipe's k-bit matmul keeps, `kbit_inputs_per_token`)."""
    head_per_token: float
    """Final norm and LM-head input saved per token."""
    logits_saved_per_token: float
    """fp32 log-softmax output kept for backward."""
    logits_forward_extra_per_token: float
    """bf16 logits and their fp32 upcast, alive while the loss is computed."""
    logits_backward_extra_per_token: float
    """Gradient buffers of the loss at the start of backward."""
    logits_held_per_token: float = 0.0
    """Output logits the training loop keeps until its backward ends (a recipe fact)."""
    loss_tile_per_token: float = 0.0
    """A fused LM head's logits tile buffer, per token up to `loss_tile_tokens` tokens (then fixed)."""
    loss_tile_tokens: float = 0.0
    kbit_inputs_per_token: float = 0.0
    """Of checkpoint_per_token: the 4-bit linears' inputs that the k-bit matmul keeps as ctx attributes, which
    non-reentrant checkpointing cannot free (`kbit_held_inputs_per_token`)."""
    checkpoint_layer_per_token: float = 0.0
    """Of checkpoint_per_token: one block's share (what activation offloading keeps on the GPU per block)."""


@dataclass(frozen=True)
class LinearInput:
    """One activation tensor that linears of a block read (q, k and v read the same normed input)."""

    key: str
    """attn_in, mla_kv_b, o, ffn_in, mlp_down, experts_in, experts_down, shared_down, mamba_in, mamba_x, mamba_out."""
    linears: tuple[Linear, ...]
    copies: int = 1
    """Tensors of this width per token: top-k for routed experts (each routed copy is a tensor of its own)."""
    fed_by: tuple[str, ...] = ()
    """Keys of this block's inputs whose linears compute this tensor (besides the block's own input)."""

    @property
    def width(self) -> int:
        """Features per token (the linears that share an input have the same in_features)."""
        return self.linears[0].in_features


def _trained(lin: Linear, mix: Mix, lora: frozenset[int]) -> bool:
    return mix.method == "full" or id(lin) in lora


def fp32_stream(mix: Mix, recipe: Recipe) -> bool:
    """The residual stream runs in fp32 under autocast: full AMP's fp32 parameters, or QLoRA whose k-bit
    preparation left the embeddings (and norms) in fp32."""
    mixed = mix.precision in ("bf16-mixed", "fp16-mixed")
    full_mixed = mix.method == "full" and mixed and mix.shard_stage == 0
    kbit = mix.method == "qlora" and mixed and recipe.kbit_fp32("embeddings")
    return full_mixed or kbit


@lru_cache(maxsize=4096)
def block_inputs(layer: Layer, model: ModelSpec, top_k: int) -> tuple[LinearInput, ...]:
    """The distinct input tensors of a block's linears, in forward order, each with the inputs it is computed
    from. MLA's q_b and Mamba's dt_proj read rank-wide tensors that are not counted."""

    def sel(group: str, *roles: str) -> tuple[Linear, ...]:
        return tuple(lin for lin in layer.linears if lin.group == group and lin.role in roles)

    if layer.mixer == "mamba":
        groups = [LinearInput("mamba_in", sel("mamba", "in")),
                  LinearInput("mamba_x", sel("mamba", "x"), fed_by=("mamba_in",)),
                  LinearInput("mamba_out", sel("mamba", "out"), fed_by=("mamba_in", "mamba_x"))]
        return tuple(g for g in groups if g.linears)
    groups, ffn_fed = [], ()
    if layer.mixer == "attention":
        groups += [LinearInput("attn_in", sel("attention", "q", "k", "v", "qkv", "mla_q_a", "mla_kv_a")),
                   LinearInput("mla_kv_b", sel("attention", "mla_kv_b"), fed_by=("attn_in",)),
                   LinearInput("o", sel("attention", "o"), fed_by=("attn_in", "mla_kv_b"))]
        ffn_fed = () if model.arch.fact("parallel") else ("attn_in", "mla_kv_b", "o")
    if layer.ffn == "dense":
        groups += [LinearInput("ffn_in", sel("mlp", "gate", "up", "gate_up"), fed_by=ffn_fed),
                   LinearInput("mlp_down", sel("mlp", "down"), fed_by=("ffn_in",))]
    elif layer.ffn == "moe":
        # the router, a shared expert and its gate read the normed hidden states; each routed expert reads its
        # own indexed copy of them (transformers 4's per-expert loop) and its down projection that expert's product
        groups += [LinearInput("ffn_in", sel("router", "router", "shared_gate") + sel("shared_expert", "gate", "up"),
                               fed_by=ffn_fed),
                   LinearInput("experts_in", sel("experts", "gate", "up"), copies=top_k, fed_by=ffn_fed),
                   LinearInput("experts_down", sel("experts", "down"), copies=top_k, fed_by=("experts_in",)),
                   LinearInput("shared_down", sel("shared_expert", "down"), fed_by=("ffn_in",))]
    return tuple(g for g in groups if g.linears)


def _block_bytes(layer: Layer, model: ModelSpec, mix: Mix, lora: frozenset[int], top_k: int,
                 recipe: Recipe) -> tuple[float, float, float]:
    """(bytes per token, bytes per token per context token, the FFN's part of the first) that one block saves."""
    a = model.arch
    h = a.hidden_size
    c = 4 if mix.precision == "fp32" else 2                      # matmul activation dtype
    full_mixed = fp32_stream(mix, recipe)
    r = 4 if (mix.precision == "fp32" or full_mixed) else 2       # residual stream dtype (fp32 params under AMP)
    norm = 4 * h + (r * h if mix.method == "full" else 0)        # fp32 stats copy (+ normalized input if weight trains)
    rank = mix.lora_rank if mix.trains_lora else 0
    inputs = {g.key: g for g in block_inputs(layer, model, top_k)}
    total = 0.0
    quad = 0.0
    ffn = 0.0

    # Autocast casts an activation anew for every op that needs it in the low dtype (it caches only weights), so
    # when the input is not already in that dtype each linear saves its own copy: the fp32 residual stream of
    # full AMP, and PEFT's fp32 adapters (it casts x to the adapter's dtype, autocast casts it back per lora_A).
    mixed = mix.precision in ("bf16-mixed", "fp16-mixed")
    fp32_adapters = mix.trains_lora and recipe.adapter_dtype(mix.method) == "fp32"
    per_linear = mixed and (full_mixed or fp32_adapters)
    # LoRA dropout > 0: each adapter drops out its own copy of the input (saved by lora_A) and keeps the mask
    dropout = mix.trains_lora and mix.lora_dropout > 0

    def inp(key: str) -> float:
        if key not in inputs:
            return 0.0
        lins, width = inputs[key].linears, inputs[key].width
        if per_linear:
            saved = sum(c * width for lin in lins if (full_mixed and _trained(lin, mix, lora)) or id(lin) in lora)
        elif dropout:
            saved = sum((c + 1) * width for lin in lins if id(lin) in lora)
            saved += c * width if any(_trained(lin, mix, lora) and id(lin) not in lora for lin in lins) else 0.0
        else:
            saved = c * width if any(_trained(lin, mix, lora) for lin in lins) else 0.0
        if per_linear and dropout:
            saved += sum(width for lin in lins if id(lin) in lora)  # the dropout mask (bool)
        return saved + sum(c * rank for lin in lins if id(lin) in lora)  # lora_A output

    if layer.mixer == "attention":
        heads, kv, d = a.num_heads, a.num_kv_heads, a.head_dim
        total += norm
        if a.attention == "mla":
            qk = a.qk_nope_head_dim + a.qk_rope_head_dim
            total += inp("attn_in") + c * a.kv_lora_rank + 4 * a.kv_lora_rank
            total += inp("mla_kv_b")
            q_w, k_w, v_w, o_w = heads * qk, heads * qk, heads * a.v_head_dim, heads * a.v_head_dim
        else:
            total += inp("attn_in")
            q_w, k_w, v_w, o_w = heads * d, kv * d, kv * d, heads * d
            if a.fact("qk_norm"):
                total += 4 * (q_w + k_w)
        if mix.attention == "eager":
            # GQA keys/values are repeated to all heads before the matmuls, and those copies are saved
            total += c * (q_w + heads * d * 2) + c * o_w
            quad += 6 * heads  # fp32 softmax output + its bf16 copy, per query x key
        else:
            total += c * (q_w + k_w + v_w) + c * o_w + 4 * heads
        total += inp("o")
        if not a.fact("parallel"):
            total += norm * (a.fact("norms_per_layer", 2) // 2)
        ffn = _ffn_bytes(layer, model, mix, lora, top_k, c, inp, recipe)
        total += ffn
    elif layer.mixer == "mamba":
        di = a.mamba_d_inner
        total += norm + inp("mamba_in") + c * 2 * di + c * di + inp("mamba_x") + c * di * 3 + inp("mamba_out")
    else:  # BlackMamba's standalone MoE block
        ffn = _ffn_bytes(layer, model, mix, lora, top_k, c, inp, recipe)
        total += norm + ffn
    return total, quad, ffn


def _ffn_bytes(layer: Layer, model: ModelSpec, mix: Mix, lora: frozenset[int], top_k: int, c: int, inp,
               recipe: Recipe) -> float:
    a = model.arch
    h = a.hidden_size
    roles = {lin.role for lin in layer.linears}
    if layer.ffn == "dense":
        inter = a.intermediate_size
        if "gate" in roles or "gate_up" in roles:  # Phi-3's fused gate_up output holds the same 2 x inter
            return inp("ffn_in") + 3 * c * inter + inp("mlp_down")
        # plain MLP: fc1 output kept by the activation; transformers' phi computes its tanh-approximated GELU
        # elementwise (NewGELUActivation), saving ~3 more intermediates, where a fused F.gelu saves only its input
        extra = 3 * c * inter if a.model_type == "phi" and not recipe.fused_gelu else 0
        return inp("ffn_in") + c * inter + extra + inp("mlp_down")
    experts = [lin for lin in layer.linears if lin.group == "experts"]
    inter = a.moe_intermediate_size
    e_trained = any(_trained(lin, mix, lora) for lin in experts)
    rank = mix.lora_rank if mix.trains_lora else 0
    router = c * h + 4 * a.num_experts * 2  # router input (if the router trains it is this same tensor) + fp32 softmax/logits
    per_expert_token = (c * h if e_trained else 0) + 2 * c * inter + c * inter + (c * inter if e_trained else 0) + c * h
    if mix.trains_lora:
        per_expert_token += sum(c * rank for lin in experts if id(lin) in lora)
    if mix.experts_backend in ("eager", "modules"):
        per_expert_token += c * h  # the per-expert loop's index_add_ saves its source (each expert's output)
    if mix.experts_backend == "batched_mm":
        # batched_mm gathers each routed token's expert weights into a batch of matrices; autograd keeps them
        per_expert_token += sum(c * lin.in_features * lin.out_features for lin in experts)
    if a.fact("mixer") == "mamba" and "gate" not in roles:
        per_expert_token = (c * h if e_trained else 0) + 2 * c * inter + (c * inter if e_trained else 0) + c * h
    total = router + top_k * per_expert_token
    if a.shared_expert_intermediate_size:
        s = a.shared_expert_intermediate_size
        total += 3 * c * s + c * s + c * h
    return total


def _loss_bytes(mix: Mix, recipe: Recipe, c: int, v: int, h: int) -> tuple[float, float, float, float]:
    """(saved, extra at the end of forward, extra at the start of backward, held through backward) per token."""
    if mix.loss == "chunked":
        # the LM head and cross-entropy per chunk of tokens, run eagerly (torchtune's CEWithChunkedOutputLoss, checked
        # against a trace of torchtune 0.6.1; compiled, only the logits stay): every chunk's logits (compute dtype) and the log-softmax its
        # cross-entropy saves for backward (fp32 when each chunk is upcast first; the compute dtype in LitGPT) are
        # kept for all tokens; the fp32 upcast and the loss gradients exist for one chunk at a time
        chunk = 1.0 / (recipe.loss_chunks or LOSS_CHUNKS)
        log_softmax = 4.0 if recipe.loss_fp32 else float(c)
        upcast = 4.0 if recipe.loss_fp32 else 0.0
        grads = 4.0 + c  # a chunk's fp32 log-softmax input gradient and its compute-dtype cast
        if recipe.compile or getattr(mix, "compile", False):  # mix.compile: issue #16's scenario key
            # a compiled cross-entropy (torchtune's compile_loss) saves the chunk's logits and per-row statistics,
            # never materializes the fp32 upcast, and its backward writes only the logits' gradient
            log_softmax, upcast, grads = 0.0, 0.0, float(c)
        return (c + log_softmax) * v, upcast * v * chunk, grads * v * chunk, 0.0
    if mix.loss == "fused":
        # flash-attn's cross-entropy kernel: saves the compute-dtype logits and a per-token log-sum-exp for backward,
        # which writes the logits' gradient in the compute dtype; no fp32 copy at any point
        return float(c) * v, 0.0, float(c) * v, 0.0
    if mix.loss == "fused_linear":
        # logits are never materialized: per-token fp32 statistics are kept, the hidden-state gradient is fp32;
        # the logits tile buffer is added by the caller (it stops growing at the tile's token count)
        return 4.0 * 4, 0.0, 4.0 * h, 0.0
    # the fp32 log-softmax output is saved; beside it while the loss runs: the logits as the model returns them
    # (bf16, then their fp32 upcast; or fp32 straight from forward) and, when the loss shifts the logits rather
    # than the labels, a contiguous copy of the shifted fp32 logits
    returned = 4.0 if recipe.loss_upcast_in_forward else float(c)
    upcast = 0.0 if recipe.loss_upcast_in_forward else 4.0
    forward = returned + upcast + (4.0 if recipe.loss_shift_copy else 0.0)
    return 4.0 * v, forward * v, 8.0 * v, (returned * v if recipe.loss_logits_held else 0.0)


def _kbit(lin: Linear, mix: Mix) -> bool:
    """QLoRA: bitsandbytes replaces every nn.Linear but the LM head. transformers 4's per-expert modules and
    routers are nn.Linear; transformers 5's fused expert stacks and router weights are not."""
    return mix.method == "qlora" and (lin.group not in ("experts", "router") or not mix.fused_experts)


def _held_widths(layer: Layer, model: ModelSpec, mix: Mix, lora: frozenset[int], top_k: int, upstream: bool) -> int:
    """Features per token of a block's 4-bit linears' inputs that need grad: computed from an adapter, in this
    block (`fed_by`) or before it (`upstream`)."""
    groups = block_inputs(layer, model, top_k)
    by_key = {g.key: g for g in groups}
    needs_grad: dict[str, bool] = {}
    held = 0
    for g in groups:
        feeders = [by_key[k] for k in g.fed_by if k in by_key]
        needs_grad[g.key] = upstream or any(needs_grad[f.key] or any(_trained(lin, mix, lora) for lin in f.linears)
                                            for f in feeders)
        if needs_grad[g.key] and any(_kbit(lin, mix) for lin in g.linears):
            held += g.width * g.copies
    return held


def kbit_held_inputs_per_token(model: ModelSpec, mix: Mix, top_k: int, recipe: Recipe) -> float:
    """Bytes per token that a k-bit matmul keeping its input (recipe `kbit_matmul_keeps_input`: bitsandbytes <=
    0.43.1) holds under non-reentrant checkpointing, from each block's forward to the end of the backward: every
    distinct input of a 4-bit linear that needs grad. The first block's input (the frozen embeddings' output)
    needs none, so there only inputs computed from that block's adapters count; once a block has adapters, every
    input after it needs grad. Blocks are taken group by group (exact for contiguous layouts)."""
    if not (mix.method == "qlora" and mix.gradient_checkpointing and recipe.kbit_matmul_keeps_input
            and recipe.checkpoint_impl == "non_reentrant"):
        return 0.0
    lora = model.lora_target_ids(mix.lora_targets)
    c = 4 if mix.precision == "fp32" else 2  # bitsandbytes casts its input to the compute dtype
    held, upstream = 0, False
    for layer, n in model.layer_groups:
        trained = any(_trained(lin, mix, lora) for lin in layer.linears)
        held += _held_widths(layer, model, mix, lora, top_k, upstream)
        held += (n - 1) * _held_widths(layer, model, mix, lora, top_k, upstream or trained)
        upstream = upstream or trained
    return float(c * held)


@lru_cache(maxsize=8192)
def activation_coefficients(model: ModelSpec, mix: Mix, top_k: int, recipe: Recipe | None = None) -> ActivationCoefficients:
    """Per-token (and per token x context) saved bytes for this model and mix, on one GPU, as the framework
    recipe runs it (default: transformers + PEFT)."""
    recipe = recipe or load_recipe()
    lora = model.lora_target_ids(mix.lora_targets) if mix.trains_lora else frozenset()
    saved = quad = 0.0
    worst = worst_q = worst_ffn = 0.0
    for layer, n in model.layer_groups:
        b, q, f = _block_bytes(layer, model, mix, lora, top_k, recipe)
        saved += b * n
        quad += q * n
        if b > worst:
            worst, worst_q, worst_ffn = b, q, f
    a = model.arch
    h, v = a.hidden_size, a.vocab_size
    full_mixed = fp32_stream(mix, recipe)
    r = 4 if (mix.precision == "fp32" or full_mixed) else 2
    c = 4 if mix.precision == "fp32" else 2
    head = 4 * h + (c * h if mix.method == "full" else 0)
    fwd_transient = 0.0
    if model.is_moe and mix.experts_backend == "batched_mm" and full_mixed:
        per_layer = max(sum(lin.in_features * lin.out_features for lin in layer.linears if lin.group == "experts")
                        for layer, _ in model.layer_groups)
        fwd_transient = 4.0 * per_layer * top_k
    logits = _loss_bytes(mix, recipe, c, v, h)
    kbit_held = kbit_held_inputs_per_token(model, mix, top_k, recipe)
    return ActivationCoefficients(
        saved_per_token=saved, saved_per_token_quadratic=quad, layer_per_token=worst, layer_per_token_quadratic=worst_q,
        layer_ffn_per_token=worst_ffn, forward_transient_per_token=fwd_transient,
        checkpoint_per_token=r * h * model.num_layers + kbit_held, head_per_token=head,
        checkpoint_layer_per_token=r * h + kbit_held / max(model.num_layers, 1),
        logits_saved_per_token=logits[0], logits_forward_extra_per_token=logits[1],
        logits_backward_extra_per_token=logits[2], logits_held_per_token=logits[3],
        loss_tile_per_token=float(c * min(v, recipe.loss_tile_vocab)) if mix.loss == "fused_linear" else 0.0,
        loss_tile_tokens=float(recipe.loss_tile_tokens), kbit_inputs_per_token=kbit_held,
    )


ACTIVATION_FREE = dict(offload="none", optimizer="adamw", tensor_parallel=1, sequence_parallel=False,
                       tp_comm_overlap=False, pipeline_parallel=1, pipeline_schedule="1f1b", virtual_stages=1,
                       context_parallel=1, context_parallel_impl="ring", expert_parallel=1)
"""Mix fields activation_coefficients does not read, at one value (the layout scales its coefficients afterwards,
memory_layout.activation_policy): mixes that differ only here share one (tests/estimate/test_memory.py)."""
_ACTIVATION_MIXES = KeyMemo(lambda mix: fast_replace(mix, **ACTIVATION_FREE))


def activation_mix(mix):
    """The mix with the ACTIVATION_FREE fields at their one value: activation_coefficients' cache key, so that the
    mixes a search lists over sharding-free fields, offload, optimizer and layouts build the coefficients once."""
    return _ACTIVATION_MIXES[mix]
