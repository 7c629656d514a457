"""Work per micro-batch (estimate/compute.py) against closed-form FLOP counts."""
from __future__ import annotations

import pytest

import ftscope
from ftscope.estimate.compute import micro_batch_ops, model_flops, step_flops


def scn(model="llama-2-7b", mix=None, b=2, seq=128):
    d = {"model": model, "hardware": {"gpu": "a100-80gb"}, "mix": {"attention": "flash", **(mix or {})},
         "workload": {"micro_batch_size": b, "seq_len": seq}}
    return ftscope.load_scenario(d)


def matmul_params(model) -> int:
    """Weights a token multiplies through: all block matrices (and norms) plus the LM head, which for tied
    embeddings is the embedding matrix itself."""
    m = model
    head = m.lm_head_params if m.lm_head_params else m.arch.vocab_size * m.arch.hidden_size
    return m.total_params - m.embedding_params - m.lm_head_params + head


@pytest.mark.parametrize("model", ["llama-2-7b", "llama-2-13b", "mistral-7b"])
def test_full_finetune_is_6_params_tokens(model):
    b, seq = 2, 128
    s = scn(model, {"method": "full"}, b, seq)
    m = s.model
    assert m.lm_head_params > 0  # untied: total - embedding = every matrix a token passes through
    expected = 6 * (m.total_params - m.embedding_params) * b * seq
    got = step_flops(s, b, seq)["total"]
    assert got == pytest.approx(expected, rel=0.02)
    assert got >= expected * 0.999  # attention only adds


@pytest.mark.parametrize("model", ["llama-3.2-1b", "qwen2.5-7b"])
def test_full_finetune_tied_or_untied_counts_the_lm_head_matmul(model):
    b, seq = 2, 128
    s = scn(model, {"method": "full"}, b, seq)
    got = step_flops(s, b, seq)["total"]
    assert got == pytest.approx(6 * matmul_params(s.model) * b * seq, rel=0.02)


@pytest.mark.parametrize("model", ["llama-2-7b", "llama-3.2-1b"])
def test_lora_is_about_4_params_tokens(model):
    # frozen base: forward 2x + input gradients 1x = 3 x 2 FLOPs per weight per token (no weight gradients),
    # plus small trained adapters
    b, seq = 2, 128
    s = scn(model, {"method": "lora"}, b, seq)
    got = step_flops(s, b, seq)["total"]
    assert got == pytest.approx(4 * matmul_params(s.model) * b * seq, rel=0.03)
    full = step_flops(scn(model, {"method": "full"}, b, seq), b, seq)["total"]
    assert got / full == pytest.approx(4 / 6, rel=0.03)


def test_backward_twice_forward_for_full_once_for_frozen():
    f = step_flops(scn(mix={"method": "full"}), 2, 128)
    assert f["backward"] / f["forward"] == pytest.approx(2.0, rel=0.02)
    q = step_flops(scn(mix={"method": "qlora", "lora_targets": "attention"}), 2, 128)
    assert q["backward"] / q["forward"] == pytest.approx(1.0, rel=0.03)


def test_gradient_checkpointing_recomputes_the_blocks_up_to_their_last_saved_tensor():
    b, seq = 2, 128
    plain = step_flops(scn(mix={"method": "full"}, b=b, seq=seq), b, seq)
    gc = step_flops(scn(mix={"method": "full", "gradient_checkpointing": True}, b=b, seq=seq), b, seq)
    assert plain["recompute"] == 0
    a = scn().model.arch
    head_fwd = 2 * b * seq * a.hidden_size * a.vocab_size  # LM head is outside the blocks
    # torch's checkpoint stops once the down projection's input (the last saved tensor) is back: its matmul is
    # not rerun (the fake-tensor trace of HF Llama shows exactly this)
    down_fwd = 2 * b * seq * a.intermediate_size * a.hidden_size * a.num_layers
    assert gc["recompute"] == pytest.approx(gc["forward"] - head_fwd - down_fwd, rel=1e-9)
    assert gc["forward"] == pytest.approx(plain["forward"], rel=1e-12)
    assert gc["total"] == pytest.approx(plain["total"] + gc["recompute"], rel=1e-12)
    # a LoRA adapter on down_proj saves tensors after the base matmul, so the base matmul is recomputed
    lora = step_flops(scn(mix={"method": "lora", "gradient_checkpointing": True}, b=b, seq=seq), b, seq)
    lora_fwd_blocks = lora["forward"] - head_fwd
    assert lora["recompute"] == pytest.approx(lora_fwd_blocks, rel=1e-9)


def test_flops_linear_in_batch_and_superlinear_in_seq():
    s = scn(mix={"method": "full"})
    f1 = step_flops(s, 1, 1024)["total"]
    f2 = step_flops(s, 2, 1024)["total"]
    assert f2 == pytest.approx(2 * f1, rel=1e-9)
    f_long = step_flops(s, 1, 2048)["total"]
    assert f_long > 2 * f1  # causal attention grows with s^2


def test_top8_does_more_expert_work_than_top2():
    def expert_flops(k):
        s = scn("mixtral-8x7b", {"method": "qlora", "experts_top_k": k, "experts_backend": "modules"}, 1, 256)
        return sum(op.flops for op in micro_batch_ops(s, 1, 256) if op.layer == "experts"), step_flops(s, 1, 256)
    e2, f2 = expert_flops(2)
    e8, f8 = expert_flops(8)
    assert e8 == pytest.approx(4 * e2, rel=1e-9)
    assert f8["total"] > 2 * f2["total"]


def test_mixtral_forward_matches_active_params():
    # 2 FLOPs per active weight per token (top-2 of 8 experts), plus attention
    b, seq = 1, 128
    # per-expert modules (transformers 4.x): only the routed tokens' matmuls
    s = scn("mixtral-8x7b", {"method": "qlora", "experts_top_k": 2, "experts_backend": "modules"}, b, seq)
    m = s.model
    active = m.active_params(2) - m.embedding_params
    assert step_flops(s, b, seq)["forward"] == pytest.approx(2 * active * b * seq, rel=0.02)


def test_fused_expert_lora_adds_the_merge_matmuls_whatever_the_tokens():
    # PEFT on transformers 5's fused experts computes W + B @ A for every expert stack, twice per forward (the
    # experts module reads the parametrized weight twice), instead of per-token adapter matmuls; and the merged
    # weight's gradient makes the expert GEMMs' backward twice their forward (fake-tensor trace of Mixtral)
    a = scn("mixtral-8x7b", {"method": "lora"}, 1, 128).model.arch
    h, i, layers, r = a.hidden_size, a.moe_intermediate_size, len(a.moe_layers), 16
    merge = 2 * r * h * i * a.num_experts * 3 * layers
    for seq in (128, 512):
        fused = step_flops(scn("mixtral-8x7b", {"method": "lora", "experts_backend": "grouped_mm"}, 1, seq), 1, seq)
        modules = step_flops(scn("mixtral-8x7b", {"method": "lora", "experts_backend": "modules"}, 1, seq), 1, seq)
        per_token_adapters = 2 * seq * a.top_k * r * 3 * (h + i) * layers  # what the modules path runs instead
        assert fused["forward"] - modules["forward"] + per_token_adapters == pytest.approx(2 * merge, rel=1e-9)
        expert_gemms = 2 * seq * a.top_k * 3 * h * i * layers
        extra_bwd = fused["backward"] - modules["backward"] + 2 * per_token_adapters
        assert extra_bwd == pytest.approx(expert_gemms + 2 * merge, rel=1e-9)


def test_eager_attention_computes_the_masked_half():
    def att(mode):
        s = scn(mix={"attention": mode}, b=1, seq=4096)
        return sum(op.flops for op in micro_batch_ops(s, 1, 4096) if op.kind == "attention")
    assert att("eager") == pytest.approx(2 * att("flash"), rel=1e-9)
    assert att("sdpa") == att("flash")


def test_dequant_ops_only_for_qlora():
    def dq(method):
        s = scn(mix={"method": method}, b=1, seq=256)
        return [op for op in micro_batch_ops(s, 1, 256) if op.kind == "dequant"]
    assert dq("lora") == [] and dq("full") == []
    ops = dq("qlora")
    s = scn(mix={"method": "qlora"})
    quantized = sum(lin.params * n for lin, n in s.model.linears() if lin.group != "router")
    # every quantized weight is read in 4-bit and written in bf16 once per pass
    assert sum(op.bytes for op in ops) >= 2 * quantized


def test_backward_multipliers_follow_what_is_trained():
    full = micro_batch_ops(scn(mix={"method": "full"}), 1, 128)
    lora = micro_batch_ops(scn(mix={"method": "lora"}), 1, 128)
    assert all(op.backward == 2.0 for op in full if op.kind == "matmul")
    base = [op for op in lora if op.kind == "matmul" and op.layer in ("attention", "mlp", "lm_head")]
    assert base and all(op.backward == 1.0 for op in base)
    adapters = [op for op in lora if op.layer == "lora"]
    assert adapters and all(op.backward == 2.0 for op in adapters)


def test_model_flops_for_mfu():
    b, seq = 2, 128
    full = scn(mix={"method": "full"})
    lora = scn(mix={"method": "lora"})
    n = full.model.total_params - full.model.embedding_params
    assert model_flops(full, b * seq, seq) == pytest.approx(6 * n * b * seq, rel=0.02)
    assert model_flops(lora, b * seq, seq) == pytest.approx(4 * n * b * seq, rel=0.02)


def test_mfu_does_not_depend_on_weight_tying(tmp_path):
    import copy
    import json
    from ftscope import catalog
    cfg = copy.deepcopy(catalog.model_config("llama-3.2-1b"))
    assert cfg["tie_word_embeddings"] is True
    cfg["tie_word_embeddings"] = False
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))

    def lora(model):
        return ftscope.load_scenario({"model": model, "mix": {"method": "lora", "attention": "flash"},
                                      "workload": {"micro_batch_size": 4, "seq_len": 512}})
    tied, untied = lora("llama-3.2-1b"), lora(str(path))
    # same computation: identical executed FLOPs and step time (the LM head is frozen either way)
    assert step_flops(tied, 4, 512)["total"] == pytest.approx(step_flops(untied, 4, 512)["total"], rel=1e-12)
    et, eu = ftscope.estimate(tied), ftscope.estimate(untied)
    assert et.time.step_s == pytest.approx(eu.time.step_s, rel=1e-12)
    assert model_flops(tied, 2048, 512) == pytest.approx(model_flops(untied, 2048, 512), rel=1e-9)
    assert et.time.mfu == pytest.approx(eu.time.mfu, rel=1e-9)


def test_fused_cross_entropy_reads_the_logits_once_per_pass():
    """flash-attn's cross-entropy kernel moves the compute-dtype logits (read in forward; read + gradient written in
    backward) where the standard loss upcasts and log-softmaxes them in fp32 by separate kernels."""
    b, seq = 2, 128
    loss_op = {}
    for loss in ("standard", "fused"):
        s = scn("llama-3.2-1b", {"method": "full", "loss": loss}, b, seq)
        [loss_op[loss]] = [op for op in micro_batch_ops(s, b, seq) if op.kind == "stream" and op.layer == "lm_head"]
    v = s.model.arch.vocab_size
    assert loss_op["fused"].bytes == pytest.approx(2.0 * b * seq * v)
    assert loss_op["fused"].bytes * loss_op["fused"].backward == pytest.approx(2 * 2.0 * b * seq * v)
    fused = loss_op["fused"].bytes * (1 + loss_op["fused"].backward)
    standard = loss_op["standard"].bytes * (1 + loss_op["standard"].backward)
    assert fused < standard / 5


def test_eager_elementwise_traffic_counts_the_fp32_norms_rope_and_gated_activation():
    """An eager Llama block: two RMSNorms with fp32 upcast (28 + 4c each) and residual adds (3c each) per hidden
    element, 10c per rotated element of q and k, 5c per gated-activation element; fused kernels move far less."""
    b, seq = 2, 128
    by = {}
    for fused in (False, True):
        s = scn("llama-3.1-8b", {"method": "full", "fused_elementwise": fused}, b, seq)
        by[fused] = [op for op in micro_batch_ops(s, b, seq) if op.layer == "norms_other" and op.kind == "stream"]
    a, layers = s.model.arch, s.model.num_layers
    rotated = (a.num_heads + a.num_kv_heads) * a.head_dim
    eager = (2 * (28 + 7 * 2) * a.hidden_size + 10 * 2 * rotated + 5 * 2 * a.intermediate_size) * b * seq * layers
    fused = (2 * 4 * 2 * a.hidden_size + 2 * 2 * rotated + 3 * 2 * a.intermediate_size) * b * seq * layers
    assert sum(op.bytes for op in by[False]) == pytest.approx(eager)
    assert sum(op.bytes for op in by[True]) == pytest.approx(fused)
    assert all(op.fusible for op in by[False]) and not any(op.fusible for op in by[True])


@pytest.mark.parametrize("model, mix", [
    ("llama-2-7b", {"method": "full"}),
    ("llama-2-7b", {"method": "lora", "gradient_checkpointing": True, "attention": "eager"}),
    ("mixtral-8x7b", {"method": "qlora", "experts_backend": "modules", "gradient_checkpointing": True}),
    ("mixtral-8x7b", {"method": "lora", "experts_backend": "grouped_mm", "tensor_parallel": 2,
                      "sequence_parallel": True, "expert_parallel": 2}),
])
def test_the_fields_the_compute_caches_leave_out_change_no_op_and_no_pass_time(model, mix):
    """NOT_COMPUTE: sharding, optimizer offload and the optimizer change neither the ops nor their pass times (the
    uncached functions), so the caches that key on compute_mix may share them."""
    from ftscope.estimate.compute import NOT_COMPUTE, compute_mix
    from ftscope.estimate.efficiency import load_calibration
    from ftscope.estimate.time import pass_times

    base = ftscope.load_scenario({"model": model, "hardware": {"gpu": "a100-80gb", "gpus_per_node": 4},
                                  "mix": {"attention": "flash", **mix},
                                  "workload": {"micro_batch_size": 4, "seq_len": 512}})
    eff = load_calibration().for_gpu("a100-80gb")[0]
    reference = (micro_batch_ops(base, 4, 512.0), pass_times(micro_batch_ops(base, 4, 512.0), base, eff))
    variants = [{"zero_stage": z} for z in (1, 2, 3)] + [{"fsdp": f} for f in ("full_shard", "shard_grad_op")] + [
        {"offload": "optimizer+params", "optimizer": "adamw_8bit"}]
    for change in variants:
        other = base.with_(**change)
        assert compute_mix(other.mix) == compute_mix(base.mix) and set(change) <= set(NOT_COMPUTE)
        ops = micro_batch_ops(other, 4, 512.0)
        assert (ops, pass_times(ops, other, eff)) == reference, change


def test_qlora_dequantization_reads_the_scenarios_quantization_state():
    """Each 4-bit matmul's dequantization reads the packed weight and its state and writes bf16: 0.516 + 2 B per
    weight nested, 0.5625 + 2 B with fp32 absmax."""
    def dequant_bytes(nested):
        return sum(op.bytes for op in micro_batch_ops(scn(mix={"method": "qlora", "nested_quant": nested}), 2, 128)
                   if op.kind == "dequant")
    nested, plain = dequant_bytes(True), dequant_bytes(False)
    assert plain / nested == pytest.approx((0.5625 + 2.0) / (0.515869 + 2.0), rel=1e-5)


@pytest.mark.parametrize("mix", [{}, {"tensor_parallel": 2, "sequence_parallel": True},
                                 {"pipeline_parallel": 2}, {"context_parallel": 2},
                                 {"expert_parallel": 2, "tensor_parallel": 2}])
def test_the_ops_read_the_layouts_degrees_from_the_mix_alone(mix):
    """micro_batch_ops reads split_of(mix), not layout(scn): its degrees are layout's on every cluster (the links,
    which need the cluster, are no op's concern, and cached_ops keys on no cluster field)."""
    from ftscope.estimate.compute import split_of
    from ftscope.estimate.layout import layout
    s = ftscope.load_scenario({"model": "mixtral-8x7b", "hardware": {"gpu": "a100-80gb", "gpus_per_node": 4},
                               "mix": mix, "workload": {"micro_batch_size": 2, "seq_len": 128,
                                                        "gradient_accumulation": 4}})
    for gpus, nodes in ((4, 1), (8, 2), (4, 4)):
        lay = layout(s.with_(gpus_per_node=gpus, nodes=nodes))
        assert tuple(split_of(s.mix)) == (lay.tp, lay.pp, lay.cp, lay.ep, lay.sequence_parallel)


# The one-step micro_batch_ops before it was split into _parts (per model and mix) and _build (per batch shape),
# verbatim but for the names: the reference the split is compared with (==, types and reprs too).
from ftscope.estimate.compute import (  # noqa: E402
    EAGER_KERNELS, EAGER_NORM_BYTES, FUSED_KERNELS, LOSS_TRAFFIC, PEFT_ADAPTER_KERNELS, _LAYER_OF, Op, Split,
    _expected_experts_hit, _new, kbit_bytes_per_weight, split_of)
from ftscope.spec.scenario import Scenario  # noqa: E402


def _ref_expert_op(scn: Scenario, lin, n: int, tokens: float, bwd: float, c: float, lay: Split) -> list[Op]:
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


def _ref_lora_ops(scn: Scenario, lin, n: int, tokens: float, c: float, used: float, lay: Split) -> list[Op]:
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


def _ref_linear_ops(scn: Scenario, layer, lin, n: int, tokens: float, c: float, lay: Split,
                    lora: frozenset) -> list[Op]:
    mix, group, adapted = scn.mix, lin.group, id(lin) in lora
    full = mix.method == "full"
    # frozen weights need input gradients only; PEFT's LoRA on a fused expert stack trains W + B @ A, whose
    # weight gradient the grouped GEMM computes in full
    merged = group == "experts" and adapted and mix.fused_experts
    bwd = 2.0 if (full or merged) else 1.0
    lt = _LAYER_OF.get(group, "router")
    if group == "experts":
        ops = _ref_expert_op(scn, lin, n, tokens, bwd, c, lay)
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
        ops += _ref_lora_ops(scn, lin, n, tokens, c, used, lay)
    return ops


def _ref_attention_op(scn: Scenario, n: int, batch: int, seq: float, c: float, lay: Split) -> Op:
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


def _ref_elementwise_op(scn: Scenario, layer, n: float, tokens: float, c: float, lay: Split) -> Op:
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


def _reference_ops(scn: Scenario, batch: int, seq: float) -> list[Op]:
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
            ops += _ref_linear_ops(scn, layer, lin, n, tokens, c, lay, lora)
        if layer.mixer == "attention":
            ops.append(_ref_attention_op(scn, n, batch, seq, c, lay))
        elif layer.mixer == "mamba":
            di, ds = a.mamba_d_inner, a.mamba_d_state
            ops.append(_new(Op, ("stream", "mamba", 9.0 * tokens * di * ds * n, c * tokens * di * 8 * n, 6 * n, tokens,
                                 2.0, True, False, 0, 0, 1, 0.0, False, False, False)))
        ops.append(_ref_elementwise_op(scn, layer, n, tokens, c, lay))
    # LM head and loss (not inside a checkpointed block; on the last pipeline stage; vocabulary split by TP)
    v, h = a.vocab_size / lay.tp, a.hidden_size
    ops.append(_new(Op, ("matmul", "lm_head", 2.0 * tokens * h * v, c * (h * v + tokens * (h + v)), 1, tokens,
                         2.0 if mix.method == "full" else 1.0, False, False, int(v), h, 1, 0.0, False, False, True)))
    per_logit, back, kernels = LOSS_TRAFFIC.get(mix.loss, LOSS_TRAFFIC["standard"])
    ops.append(_new(Op, ("stream", "lm_head", 0.0, tokens * v * per_logit(c), kernels, tokens, back, False, False, 0, 0,
                         1, 0.0, False, True, True)))
    return ops


SPLIT_MODELS = ["llama-2-7b", "mixtral-8x7b", "deepseek-v3", "blackmamba-2.8b", "llama-3.2-1b", "qwen3-30b-a3b"]
SPLIT_MIXES = [
    {"method": "full"}, {"method": "lora"}, {"method": "qlora"}, {"method": "lora", "experts_backend": "eager"},
    {"method": "lora", "experts_backend": "modules", "lora_targets": "all-linear"},
    {"method": "qlora", "experts_backend": "modules", "lora_targets": "all-linear"},
    {"method": "lora", "experts_backend": "batched_mm", "lora_targets": "all-linear"},
    {"method": "lora", "experts_backend": "grouped_mm", "lora_targets": "all-linear"},
    {"method": "lora", "experts_backend": "eager", "lora_targets": "all-linear", "fp8": True},
    {"method": "full", "fp8": True, "compile": True},
    {"method": "full", "attention": "eager", "precision": "fp32", "experts_backend": "eager"},
    {"method": "full", "tensor_parallel": 2, "sequence_parallel": True, "pipeline_parallel": 2,
     "context_parallel_impl": "ring"},
    {"method": "full", "context_parallel": 2, "context_parallel_impl": "all_to_all", "fused_elementwise": True},
    {"method": "full", "context_parallel": 2, "loss": "fused", "expert_parallel": 2},
    {"method": "qlora", "nested_quant": False, "precision": "fp16-mixed", "experts_backend": "eager"}]


@pytest.mark.parametrize("model", SPLIT_MODELS)
def test_the_split_ops_equal_the_one_step_ops(model):
    """micro_batch_ops (_parts once per model and mix, _build per batch shape) equals the one-step code it replaced
    (_reference_ops), op for op with ==, and with the same reprs (ints stay ints), on dense, MoE (every experts
    backend, fused-expert LoRA merges, QLoRA per-expert dequantization, the eager loop's syncs), MLA and Mamba
    models, every parallel degree, FP8, compile, eager and fused attention and elementwise, fp32 and fp16, and
    seeded random batch shapes."""
    import random
    rng = random.Random(model)
    compared = 0
    for mix in SPLIT_MIXES:
        try:
            s = ftscope.load_scenario({"model": model, "hardware": {"gpu": "h100-80gb", "gpus_per_node": 8}, "mix": mix,
                                       "workload": {"micro_batch_size": 1, "seq_len": 512, "gradient_accumulation": 4}})
        except ftscope.FtscopeError:  # a mix the model does not take
            continue
        for batch, seq in [(1, 512.0), (3, 700.5), (64, 4096.0), (2, 0.25), (7, 333)] + [
                (rng.randrange(1, 400), rng.uniform(1, 9000)) for _ in range(4)]:
            got, want = micro_batch_ops(s, batch, seq), _reference_ops(s, batch, seq)
            assert got == want and repr(got) == repr(want)
            compared += 1
    assert compared >= 80
