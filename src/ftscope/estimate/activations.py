"""Activation memory: the tensors autograd saves for backward, per token, per block.

Counted from what the HF implementations save (checked against fake-tensor traces, see `ftscope trace`):
- an RMSNorm/LayerNorm upcasts to fp32 and saves that copy (4 bytes x hidden);
- a linear layer saves its input only when its weight (or a LoRA adapter on it) needs a gradient;
- SiLU-gated MLPs save gate, act(gate), up and (if `down` is trained) their product;
- sdpa/flash save q, k, v, the output and a log-sum-exp; eager also keeps the fp32 softmax and its bf16 copy
  (6 bytes per head x s x s), and its backward holds 6 more (the fp32 upcast gradient and softmax's fp32
  input gradient) while the bf16 copy is already freed;
- routed experts save their per-token tensors once per selected expert (top-k);
- the loss upcasts logits to fp32: log_softmax saves B x T x V fp32; a chunked (compiled) loss keeps the
  bf16 logits and upcasts one chunk at a time.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..spec.mix import Mix
from ..spec.model import Layer, Linear, ModelSpec
from ..spec.recipe import Recipe, load_recipe

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
    """Under gradient checkpointing: the block inputs kept for every block, per token."""
    head_per_token: float
    """Final norm and LM-head input saved per token."""
    logits_saved_per_token: float
    """fp32 log-softmax output kept for backward."""
    logits_forward_extra_per_token: float
    """bf16 logits and their fp32 upcast, alive while the loss is computed."""
    logits_backward_extra_per_token: float
    """Gradient buffers of the loss at the start of backward."""
    loss_tile_per_token: float = 0.0
    """A fused LM head's logits tile buffer, per token up to `loss_tile_tokens` tokens (then fixed)."""
    loss_tile_tokens: float = 0.0


def _trained(lin: Linear, mix: Mix, lora: frozenset[int]) -> bool:
    return mix.method == "full" or id(lin) in lora


def fp32_stream(mix: Mix, recipe: Recipe) -> bool:
    """The residual stream runs in fp32 under autocast: full AMP's fp32 parameters, or QLoRA whose k-bit
    preparation left the embeddings (and norms) in fp32."""
    mixed = mix.precision in ("bf16-mixed", "fp16-mixed")
    full_mixed = mix.method == "full" and mixed and mix.shard_stage == 0
    kbit = mix.method == "qlora" and mixed and recipe.kbit_fp32("embeddings")
    return full_mixed or kbit


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
    by_role = {lin.role: lin for lin in layer.linears}
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

    def inp(*roles: str, width: int) -> float:
        lins = [by_role[x] for x in roles if x in by_role]
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
            total += inp("q", "mla_q_a", "mla_kv_a", width=h) + c * a.kv_lora_rank + 4 * a.kv_lora_rank
            total += inp("mla_kv_b", width=a.kv_lora_rank)
            q_w, k_w, v_w, o_w = heads * qk, heads * qk, heads * a.v_head_dim, heads * a.v_head_dim
        else:
            total += inp("q", "k", "v", "qkv", width=h)
            q_w, k_w, v_w, o_w = heads * d, kv * d, kv * d, heads * d
            if a.fact("qk_norm"):
                total += 4 * (q_w + k_w)
        if mix.attention == "eager":
            # GQA keys/values are repeated to all heads before the matmuls, and those copies are saved
            total += c * (q_w + heads * d * 2) + c * o_w
            quad += 6 * heads  # fp32 softmax output + its bf16 copy, per query x key
        else:
            total += c * (q_w + k_w + v_w) + c * o_w + 4 * heads
        total += inp("o", width=o_w)
        if not a.fact("parallel"):
            total += norm * (a.fact("norms_per_layer", 2) // 2)
        ffn = _ffn_bytes(layer, model, mix, lora, top_k, c, inp)
        total += ffn
    elif layer.mixer == "mamba":
        di = a.mamba_d_inner
        total += norm + inp("in", width=h) + c * 2 * di + c * di + inp("x", width=di) + c * di * 3 + inp("out", width=di)
    else:  # BlackMamba's standalone MoE block
        ffn = _ffn_bytes(layer, model, mix, lora, top_k, c, inp)
        total += norm + ffn
    return total, quad, ffn


def _ffn_bytes(layer: Layer, model: ModelSpec, mix: Mix, lora: frozenset[int], top_k: int, c: int, inp) -> float:
    a = model.arch
    h = a.hidden_size
    roles = {lin.role for lin in layer.linears}
    if layer.ffn == "dense":
        inter = a.intermediate_size
        if "gate" in roles:
            return inp("gate", "up", width=h) + 3 * c * inter + inp("down", width=inter)
        # plain MLP: fc1 output kept by the activation; tanh-approximated GELU (phi) saves ~3 more intermediates
        extra = 3 * c * inter if a.model_type == "phi" else 0
        return inp("up", width=h) + c * inter + extra + inp("down", width=inter)
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


def _loss_bytes(mix: Mix, recipe: Recipe, c: int, v: int, h: int) -> tuple[float, float, float]:
    """(saved, extra at the end of forward, extra at the start of backward) per token for the loss."""
    if mix.loss == "chunked":
        # the LM head and cross-entropy per chunk (torchtune compiles its loss): the bf16 logits are kept, the fp32
        # upcast and the loss gradients exist for one chunk at a time. Not yet checked against a torchtune trace.
        chunk = 1.0 / (recipe.loss_chunks or LOSS_CHUNKS)
        return c * v, 4.0 * v * chunk, (4.0 + c) * v * chunk
    if mix.loss == "fused_linear":
        # logits are never materialized: per-token fp32 statistics are kept, the hidden-state gradient is fp32;
        # the logits tile buffer is added by the caller (it stops growing at the tile's token count)
        return 4.0 * 4, 0.0, 4.0 * h
    return 4.0 * v, (c + 4.0) * v, 8.0 * v


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
    return ActivationCoefficients(
        saved_per_token=saved, saved_per_token_quadratic=quad, layer_per_token=worst, layer_per_token_quadratic=worst_q,
        layer_ffn_per_token=worst_ffn, forward_transient_per_token=fwd_transient,
        checkpoint_per_token=r * h * model.num_layers, head_per_token=head,
        logits_saved_per_token=logits[0], logits_forward_extra_per_token=logits[1],
        logits_backward_extra_per_token=logits[2],
        loss_tile_per_token=float(c * min(v, recipe.loss_tile_vocab)) if mix.loss == "fused_linear" else 0.0,
        loss_tile_tokens=float(recipe.loss_tile_tokens),
    )
