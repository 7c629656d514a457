"""The frozen base by method and what forward keeps beside it (estimate/weight_memory.py)."""
from __future__ import annotations

import pytest

import ftscope
from ftscope.estimate.weight_memory import NF4_BYTES, forward_transients, frozen_weight_bytes


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
    """ZeRO-3 gathers the current block and prefetches the next, each as a whole unit in bf16; ZeRO-2 gathers none."""
    z2 = scn("llama-2-7b", mix={"method": "full", "zero_stage": 2}, gpus=4)
    z3 = scn("llama-2-7b", mix={"method": "full", "zero_stage": 3}, gpus=4)
    (t2, b2), (t3, b3) = forward_transients(z2, 4), forward_transients(z3, 4)
    assert t3 - t2 == pytest.approx(2 * z3.model.largest_layer_params() * 2.0) and b3 == b2


def test_qlora_dequantizes_one_weight_at_a_time():
    s = scn("llama-2-7b", mix={"method": "qlora"})
    largest = max(lin.params for lin, _ in s.model.linears())
    assert forward_transients(s, 1)[1] == pytest.approx(largest * s.recipe.dequant_bytes_per_weight)
