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
