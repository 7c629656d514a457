"""The weight matrices each block holds, the way each family's transformers implementation builds them.

`build` turns a normalized `Arch` into a `ModelSpec`: attention (GQA, fused QKV, MLA), dense MLP (gated, plain,
fused gate+up), MoE (router, routed experts, shared experts, biases), Mamba mixers, norms and embeddings.
"""
from __future__ import annotations

from .architecture import Arch
from .model import Layer, Linear, ModelSpec


def _attention_linears(a: Arch) -> tuple[list[Linear], int]:
    """Attention weight matrices and the extra (qk-norm, sink) parameters of one block."""
    h, d = a.hidden_size, a.head_dim
    q_out, kv_out = a.num_heads * d, a.num_kv_heads * d
    qkv_bias = a.fact("qkv_bias", False) or a.fact("attention_bias", False)
    o_bias = a.fact("o_bias", False) or a.fact("attention_bias", False)
    o_name = a.fact("o_name", "o_proj")
    extra = 0
    if a.attention == "fused_qkv":
        # Falcon and Phi-3: one matrix for queries, keys and values (rw-style Falcon: 3 x hidden, the same number)
        out = (a.num_heads + 2 * a.num_kv_heads) * d
        lins = [Linear("qkv", (a.fact("qkv_name", "query_key_value"), "qkv"), h, out, qkv_bias),
                Linear("o", (o_name, "o_proj"), a.num_heads * d, h, o_bias)]
    elif a.attention == "mla":
        qk_head = a.qk_nope_head_dim + a.qk_rope_head_dim
        lins = []
        if a.q_lora_rank:
            lins += [Linear("mla_q_a", ("q_a_proj",), h, a.q_lora_rank, qkv_bias),
                     Linear("mla_q_b", ("q_b_proj",), a.q_lora_rank, a.num_heads * qk_head)]
            extra += a.q_lora_rank
        else:
            lins.append(Linear("q", ("q_proj",), h, a.num_heads * qk_head))
        lins += [Linear("mla_kv_a", ("kv_a_proj_with_mqa",), h, a.kv_lora_rank + a.qk_rope_head_dim, qkv_bias),
                 Linear("mla_kv_b", ("kv_b_proj",), a.kv_lora_rank, a.num_heads * (a.qk_nope_head_dim + a.v_head_dim)),
                 Linear("o", ("o_proj",), a.num_heads * a.v_head_dim, h, o_bias)]
        extra += a.kv_lora_rank
    else:
        lins = [Linear("q", ("q_proj",), h, q_out, qkv_bias), Linear("k", ("k_proj",), h, kv_out, qkv_bias),
                Linear("v", ("v_proj",), h, kv_out, qkv_bias), Linear("o", (o_name, "output_proj"), q_out, h, o_bias)]
    qk_norm = a.fact("qk_norm")
    if a.model_type == "phi" and a.fact("qk_layernorm"):
        extra += 4 * d  # q_layernorm and k_layernorm: LayerNorm(head_dim), weight and bias
    if qk_norm == "head":
        extra += 2 * d
    elif qk_norm == "full":
        extra += q_out + kv_out
    if a.fact("sinks"):
        extra += a.num_heads  # gpt-oss: one learned sink logit per head
    return lins, extra


def _mlp_linears(a: Arch, inter: int, group: str, names: dict[str, tuple[str, ...]] | None = None,
                 count: int = 1, used: float = 1.0) -> list[Linear]:
    h = a.hidden_size
    bias = (a.fact("mlp_bias", False) and group == "mlp") or (a.fact("expert_bias", False) and group == "experts")
    if a.fact("mlp", "gated") == "plain" and group == "mlp":
        up_name, down_name = a.fact("mlp_names", ("fc1", "fc2"))
        return [Linear("up", (up_name,), h, inter, bias, group=group),
                Linear("down", (down_name,), inter, h, bias, group=group)]
    if a.fact("mlp") == "fused_gated" and group == "mlp":  # Phi-3: gate and up in one gate_up_proj
        return [Linear("gate_up", ("gate_up_proj",), h, 2 * inter, bias, group=group),
                Linear("down", ("down_proj",), inter, h, bias, group=group)]
    # torchtune names the SwiGLU matrices w1 (gate), w3 (up), w2 (down)
    names = names or {"gate": ("gate_proj", "w1"), "up": ("up_proj", "w3"), "down": ("down_proj", "w2")}
    return [Linear("gate", names["gate"], h, inter, bias, count, used, group),
            Linear("up", names["up"], h, inter, bias, count, used, group),
            Linear("down", names["down"], inter, h, bias, count, used, group)]


def _expert_names(a: Arch) -> dict[str, tuple[str, ...]]:
    # transformers 5 fuses experts into gate_up_proj / down_proj 3-D parameters; older names still select them.
    g, u, d = a.fact("expert_names", ("gate_proj", "up_proj", "down_proj"))
    return {"gate": (g, "gate_up_proj", "experts"), "up": (u, "gate_up_proj", "experts"),
            "down": (d, "down_proj", "experts")}


def _moe_linears(a: Arch) -> list[Linear]:
    h, e = a.hidden_size, a.num_experts
    lins = [Linear("router", ("gate", "router"), h, e, bool(a.fact("router_bias")), group="router")]
    if a.fact("mixer") == "mamba":
        lins += [Linear("up", ("fc1", "experts"), h, 2 * a.moe_intermediate_size if a.fact("glu") else a.moe_intermediate_size,
                        count=e, used_per_token=a.top_k, group="experts"),
                 Linear("down", ("fc2", "experts"), a.moe_intermediate_size, h, count=e, used_per_token=a.top_k,
                        group="experts")]
        return lins
    lins += _mlp_linears(a, a.moe_intermediate_size, "experts", _expert_names(a), e, a.top_k)
    if a.shared_expert_intermediate_size:
        lins += _mlp_linears(a, a.shared_expert_intermediate_size, "shared_expert",
                             {"gate": ("gate_proj",), "up": ("up_proj",), "down": ("down_proj",)})
        if a.model_type == "qwen2_moe":
            lins.append(Linear("shared_gate", ("shared_expert_gate",), h, 1, group="router"))
    return lins


def _mamba_linears(a: Arch) -> tuple[list[Linear], int]:
    h, di, n, r = a.hidden_size, a.mamba_d_inner, a.mamba_d_state, a.mamba_dt_rank
    lins = [Linear("in", ("in_proj",), h, 2 * di, group="mamba"),
            Linear("x", ("x_proj",), di, r + 2 * n, group="mamba"),
            Linear("dt", ("dt_proj",), r, di, True, group="mamba"),
            Linear("out", ("out_proj",), di, h, group="mamba")]
    other = di * a.mamba_d_conv + di + di * n + di  # conv1d weight + bias, A_log, D
    return lins, other


def _vision_linears(a: Arch) -> tuple[tuple[Linear, int], ...]:
    """A vision tower's and projector's Linears (PEFT's all-linear and module names reach them); not run on
    text-only batches."""
    return tuple((Linear(f"vision_{name}", (name,), i, o, bias, group="vision"), n)
                 for name, i, o, bias, n in a.vision_matrices)


def _norms_per_layer(a: Arch) -> int:
    if a.model_type != "falcon":
        return a.fact("norms_per_layer", 2)
    if a.fact("new_decoder_architecture"):
        return 1 if a.fact("num_ln_in_parallel_attn") == 1 else 2
    return 1 if a.fact("parallel_attn") else 2  # rw-style: one norm when attention and MLP run in parallel


def build(arch: Arch, name: str, source: str = "") -> ModelSpec:
    """The ModelSpec of a normalized architecture."""
    a = arch
    h = a.hidden_size
    norm_params = (2 if a.fact("norm") == "layernorm" else 1) * h
    norms_per_layer = _norms_per_layer(a)
    groups: dict[Layer, int] = {}
    moe = set(a.moe_layers)
    for i, kind in enumerate(a.mixer_pattern):
        if kind == "mamba":
            lins, other = _mamba_linears(a)
            layer = Layer("mamba", "none", tuple(lins), other + norm_params)
        elif kind == "moe":  # BlackMamba's MoE block: a norm and the routed experts
            layer = Layer("moe", "moe", tuple(_moe_linears(a)), norm_params)
        else:
            lins, extra = _attention_linears(a)
            ffn = "moe" if i in moe else "dense"
            lins += _moe_linears(a) if ffn == "moe" else _mlp_linears(a, a.intermediate_size, "mlp")
            layer = Layer("attention", ffn, tuple(lins), extra + norms_per_layer * norm_params)
        groups[layer] = groups.get(layer, 0) + 1
    vocab = a.vocab_size
    lm_head = 0 if a.tie_embeddings else vocab * h
    if a.fact("lm_head_bias"):
        lm_head += vocab
    return ModelSpec(name=name, arch=a, layer_groups=tuple(groups.items()), embedding_params=vocab * h,
                     lm_head_params=lm_head, final_norm_params=norm_params, vision_params=a.vision_params,
                     vision_linears=_vision_linears(a), source=source)
