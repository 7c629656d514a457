"""What PEFT and k-bit preparation add: fp32 layers kept by the recipe, their autocast copies, merged expert stacks."""
import pytest

import ftscope
from ftscope.estimate.adapter_memory import kbit_autocast_copies, kbit_fp32_params, peft_merged_expert_bytes


def _scn(model: str, framework: str = "hf-trainer", **mix):
    return ftscope.load_scenario({"model": model, "framework": framework, "hardware": {"gpu": "a100-80gb"},
                                  "mix": {"method": "qlora", "lora_targets": "all-linear", **mix},
                                  "workload": {"micro_batch_size": 1, "seq_len": 512}})


def test_kbit_preparation_keeps_only_what_the_recipe_names_in_fp32():
    every = _scn("llama-3.2-1b", "peft-kbit")  # kbit_fp32_params: [all]
    m = every.model
    quantized = sum(lin.params for lin, _ in m.linears())
    assert kbit_fp32_params(every, quantized) == m.total_params - quantized
    assert kbit_fp32_params(_scn("llama-3.2-1b"), quantized) == 0  # the generic HF step keeps nothing in fp32
    lora = _scn("llama-3.2-1b", "peft-kbit").with_(method="lora")
    assert kbit_fp32_params(lora, quantized) == 0


def test_autocast_copies_the_fp32_head_and_what_lora_leaves_alone():
    s = _scn("llama-3.2-1b", "peft-kbit")
    head, stacks = kbit_autocast_copies(s)
    assert head == pytest.approx(2.0 * (s.model.lm_head_params or s.model.embedding_params)) and stacks == []
    assert kbit_autocast_copies(s.with_(method="lora")) == (0.0, [])  # nothing quantized, nothing left in fp32
    assert kbit_autocast_copies(_scn("llama-3.2-1b")) == (0.0, [])


def test_merged_expert_stacks_are_one_layer_under_checkpointing_and_every_layer_without():
    base = _scn("mixtral-8x7b", method="lora")  # transformers 5's default experts: fused 3-D stacks
    whole = peft_merged_expert_bytes(base.with_(gradient_checkpointing=False))
    one = peft_merged_expert_bytes(base.with_(gradient_checkpointing=True))
    assert one > 0 and whole == pytest.approx(one * base.model.num_layers)
    assert peft_merged_expert_bytes(_scn("llama-3.2-1b", method="lora")) == 0.0  # dense: no expert stacks
    assert peft_merged_expert_bytes(_scn("mixtral-8x7b", method="lora", experts_backend="modules")) == 0.0
