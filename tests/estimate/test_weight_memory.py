"""The frozen base by method and what forward keeps beside it (estimate/weight_memory.py)."""
from __future__ import annotations

import dataclasses

import pytest

import ftscope
from ftscope.estimate.weight_memory import (NF4_BYTES, NF4_DATA_BYTES, NF4_STATE_BYTES, NF4_STATE_BYTES_PLAIN,
                                            forward_transients, frozen_weight_bytes, gathered_bytes_per_weight,
                                            gathered_unit_bytes, gathered_weight_bytes,
                                            kbit_bytes_per_weight, kbit_state_bytes, quantized_params)


def scn(model="llama-3.2-1b", mix=None, gpus=1):
    return ftscope.load_scenario({"model": model, "hardware": {"gpu": "a100-80gb", "gpus_per_node": gpus},
                                  "mix": {"attention": "flash", **(mix or {})},
                                  "workload": {"micro_batch_size": 1, "seq_len": 512}})


def test_frozen_base_by_method():
    lora, qlora, full = (scn(mix={"method": m}) for m in ("lora", "qlora", "full"))
    total = lora.model.total_params
    assert frozen_weight_bytes(full) == 0
    assert frozen_weight_bytes(lora) == 2.0 * total
    quantized = qlora.model.quantizable_params()
    assert NF4_BYTES * total < frozen_weight_bytes(qlora) < 2.0 * total
    assert frozen_weight_bytes(qlora) >= quantized * NF4_BYTES + (total - quantized) * 2.0


def test_sharded_weights_gather_two_whole_units_in_forward():
    """FSDP gathers the current block and prefetches the next, each as a whole unit in bf16; ZeRO-2 gathers none."""
    z2 = scn("llama-2-7b", mix={"method": "full", "zero_stage": 2}, gpus=4)
    f3 = scn("llama-2-7b", mix={"method": "full", "fsdp": "full_shard"}, gpus=4)
    (t2, b2), (t3, b3) = forward_transients(z2), forward_transients(f3)
    assert t3 - t2 == pytest.approx(2 * f3.model.largest_layer_params() * 2.0) and b3 == b2


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_shard_grad_op_keeps_every_gathered_weight_through_backward(method):
    """FSDP shard_grad_op leaves each unit unsharded from its forward until its backward: the whole model's
    gathered weights (a LoRA's frozen bf16 base, a QLoRA's 4-bit data) are held at the end of forward."""
    z2 = scn("llama-2-7b", mix={"method": method, "zero_stage": 2}, gpus=4)
    op = scn("llama-2-7b", mix={"method": method, "fsdp": "shard_grad_op"}, gpus=4)
    assert forward_transients(op)[0] - forward_transients(z2)[0] == pytest.approx(gathered_weight_bytes(op))
    assert gathered_weight_bytes(op) > (2.0 if method != "qlora" else 0.5) * 6.4e9


@pytest.mark.parametrize("model,method", [("llama-2-7b", "full"), ("llama-2-70b", "qlora"), ("llama-2-70b", "lora")])
def test_zero3_keeps_what_its_trace_reuses_within_the_reuse_distance(model, method):
    """DeepSpeed keeps a block gathered after its forward when its next use (its backward) comes within 1e9 elements:
    the head and the blocks after it. Llama-2-7B bf16 blocks (202M elements, head 131M) keep 5; Llama-2-70B NF4
    blocks stored in bf16 (214M elements of 4-bit data, head 262M) keep 4; a 70B bf16 block (856M) keeps only itself, fewer than
    the two units in flight."""
    from ftscope.estimate.weight_memory import ZERO3_MAX_REUSE_DISTANCE, zero3_reuse_kept

    z3 = scn(model, mix={"method": method, "zero_stage": 3}, gpus=8)
    m, per = z3.model, NF4_DATA_BYTES if method == "qlora" else 2.0
    layer, head = m.largest_layer_params(), m.lm_head_params + m.final_norm_params
    unit = gathered_unit_bytes(z3)
    adapters = m.lora_params(z3.mix.lora_rank, z3.mix.lora_targets) / m.num_layers if z3.mix.trains_lora else 0
    # a dense block: its norms and its LoRA adapters are all it gathers in bf16
    assert unit == pytest.approx(layer * per + 2 * adapters, rel=1e-4)
    elements = unit / 2.0
    kept = next(j for j in range(m.num_layers + 1) if j * elements + head >= ZERO3_MAX_REUSE_DISTANCE)
    assert kept == {"llama-2-7b": 5, "llama-2-70b": 4 if method == "qlora" else 1}[model]
    assert zero3_reuse_kept(z3, unit) == pytest.approx(kept * unit + head * 2.0)
    fsdp = scn(model, mix={"method": method, "fsdp": "full_shard"}, gpus=8)
    extra = forward_transients(z3)[0] - forward_transients(fsdp)[0]
    assert extra == pytest.approx(max(0.0, zero3_reuse_kept(z3, unit) - 2 * unit), rel=1e-9, abs=1.0)


def test_a_qlora_blocks_gather_holds_its_unquantized_expert_stacks_in_bf16():
    """transformers 5's fused 3-D expert stacks are no nn.Linear: bitsandbytes leaves them bf16, and ZeRO-3 / FSDP
    gather them so; per-expert modules are quantized and gathered as 4-bit data. Two such blocks are held."""
    fused = scn("mixtral-8x7b", mix={"method": "qlora", "fsdp": "full_shard"}, gpus=8)
    modules = scn("mixtral-8x7b", mix={"method": "qlora", "fsdp": "full_shard", "experts_backend": "modules"}, gpus=8)
    layer, _ = fused.model.layer_groups[0]
    experts = sum(lin.params for lin in layer.linears if lin.group == "experts")
    assert experts > 0.9 * layer.params
    # the adapters, in bf16 either way; a fused gate_up stack shares one A
    adapters = [s.model.lora_params(s.mix.lora_rank, s.mix.lora_targets, fused_experts=s.mix.fused_experts) /
                s.model.num_layers * 2.0 for s in (fused, modules)]
    assert gathered_unit_bytes(modules) == pytest.approx(layer.params * NF4_DATA_BYTES + adapters[1], rel=0.01)
    assert gathered_unit_bytes(fused) - gathered_unit_bytes(modules) == pytest.approx(
        experts * 1.5 + adapters[0] - adapters[1], rel=1e-9)
    for s in (fused, modules):  # the gathers are what FSDP holds beyond ZeRO-2
        z2 = scn("mixtral-8x7b", mix={"method": "qlora", "zero_stage": 2, "experts_backend": s.mix.experts_backend},
                 gpus=8)
        assert forward_transients(s)[0] - forward_transients(z2)[0] == pytest.approx(2 * gathered_unit_bytes(s))


def test_qlora_dequantizes_one_weight_at_a_time():
    s = scn("llama-2-7b", mix={"method": "qlora"})
    largest = max(lin.params for lin, _ in s.model.linears())
    assert forward_transients(s)[1] == pytest.approx(largest * s.recipe.dequant_bytes_per_weight)


def test_bitsandbytes_quant_state_is_whole_on_every_rank_and_torchao_shards_it():
    """bitsandbytes keeps each Linear4bit's quant_state (1/64 + 4/16384 B per weight) as a plain attribute on every
    rank's GPU: a QLoRA under FSDP / ZeRO-3 keeps it whole, and gathers the 4-bit data alone; torchao's NF4Tensor
    (torchtune) splits its scalers with the data."""
    bnb = scn("llama-2-70b", mix={"method": "qlora", "fsdp": "full_shard"}, gpus=2)
    quantized = bnb.model.quantizable_params()
    assert NF4_DATA_BYTES + NF4_STATE_BYTES == NF4_BYTES
    assert kbit_state_bytes(bnb) == pytest.approx(quantized * NF4_STATE_BYTES)
    assert 1.0 < kbit_state_bytes(bnb) / 2**30 < 1.05          # Llama-2-70B: 68.5B weights, about 1 GiB
    assert gathered_bytes_per_weight(bnb) == NF4_DATA_BYTES
    ao = ftscope.load_scenario({"model": "llama-2-70b", "framework": "torchtune",
                                "hardware": {"gpu": "a100-80gb", "gpus_per_node": 2},
                                "mix": {"method": "qlora", "fsdp": "full_shard"},
                                "workload": {"micro_batch_size": 1, "seq_len": 512}})
    assert ao.recipe.kbit_state_sharded and kbit_state_bytes(ao) == 0.0 and gathered_bytes_per_weight(ao) == NF4_BYTES
    for method in ("lora", "full"):
        s = scn(mix={"method": method})
        assert kbit_state_bytes(s) == 0.0 and gathered_bytes_per_weight(s) == 2.0


def test_nested_quant_off_keeps_an_fp32_absmax_per_64_weights():
    """bitsandbytes without nested quantization: 0.5 + 4/64 = 0.5625 B per 4-bit weight, against 0.5 + 1/64 +
    4/16384 = 0.516 nested; the frozen base and the quant state every rank keeps differ by that times the quantized
    weights (Llama-2-13B: 12.7B of them, 0.55 GiB)."""
    assert NF4_BYTES == pytest.approx(0.515869, abs=1e-6) and NF4_DATA_BYTES + NF4_STATE_BYTES_PLAIN == 0.5625
    nested, plain = (scn("llama-2-13b", mix={"method": "qlora", "nested_quant": n}) for n in (True, False))
    assert (kbit_bytes_per_weight(nested), kbit_bytes_per_weight(plain)) == (NF4_BYTES, 0.5625)
    quantized = quantized_params(plain)
    extra = quantized * (NF4_STATE_BYTES_PLAIN - NF4_STATE_BYTES)
    assert frozen_weight_bytes(plain) - frozen_weight_bytes(nested) == pytest.approx(extra)
    assert kbit_state_bytes(plain) - kbit_state_bytes(nested) == pytest.approx(extra)
    assert extra / 2**30 == pytest.approx(0.551, abs=0.001)
    for method in ("lora", "full"):  # a 16-bit base has no quantization state to nest
        assert frozen_weight_bytes(scn(mix={"method": method, "nested_quant": False})) == \
            frozen_weight_bytes(scn(mix={"method": method}))


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_lora_adapters_are_gathered_with_their_blocks(method):
    """ZeRO-3 / FSDP partition the adapters with the block that holds them: a gather carries them, in bf16."""
    z3 = scn("llama-2-70b", mix={"method": method, "zero_stage": 3, "lora_rank": 64, "lora_targets": "all-linear"},
             gpus=8)
    plain = scn("llama-2-70b", mix={"method": "full" if method == "lora" else method, "zero_stage": 3}, gpus=8)
    m = z3.model
    adapters = m.lora_params(64, "all-linear")
    assert adapters == 64 * 80 * (2 * (8192 + 8192) + 2 * (8192 + 1024) + 3 * (8192 + 28672))
    base = m.total_params * 2.0 if method == "lora" else gathered_weight_bytes(
        dataclasses.replace(z3, mix=dataclasses.replace(z3.mix, lora_rank=0)))
    assert gathered_weight_bytes(z3) == pytest.approx(base + 2.0 * adapters, rel=1e-9)
    assert gathered_unit_bytes(z3) - gathered_unit_bytes(plain if method == "lora" else dataclasses.replace(
        z3, mix=dataclasses.replace(z3.mix, lora_rank=0))) == pytest.approx(2.0 * adapters / 80, rel=1e-9)
