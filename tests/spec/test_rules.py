"""Rules on combinations: each refused combination says why; what frameworks run is accepted."""
from __future__ import annotations

import re

import pytest

from ftscope import FtscopeError
from ftscope.spec.hardware import gpu_from_catalog
from ftscope.spec.mix import Mix
from ftscope.spec.resolve import load_model
from ftscope.spec.rules import GPU_RULES, MIX_RULES, MODEL_RULES, check_mix, gpu_problem, model_problem, problem


@pytest.mark.parametrize("mix, reason", [
    (Mix(fsdp="full_shard", zero_stage=3), "both fsdp and zero_stage"),
    (Mix(offload="optimizer"), "needs DeepSpeed ZeRO"),
    (Mix(offload="optimizer+params", zero_stage=2), "needs zero_stage: 3 or fsdp: full_shard"),
    (Mix(offload="optimizer+params", fsdp="shard_grad_op"), "needs zero_stage: 3 or fsdp: full_shard"),
    (Mix(method="qlora", offload="optimizer+params", zero_stage=3), "QLoRA with parameter offload"),
    (Mix(method="qlora", precision="fp32"), "QLoRA computes in bf16 or fp16"),
    (Mix(optimizer="adamw_8bit", offload="optimizer", zero_stage=2), "adamw_8bit is a GPU-only"),
    (Mix(optimizer="paged_adamw_8bit", offload="optimizer", zero_stage=1), "paged_adamw_8bit is a GPU-only"),
])
def test_impossible_combination_says_why(mix, reason):
    with pytest.raises(FtscopeError, match=reason) as info:
        check_mix(mix)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("mix", [
    Mix(method="qlora", zero_stage=3),  # works with bnb_4bit_quant_storage (a warning, not an error)
    Mix(offload="optimizer", zero_stage=1),
    Mix(offload="optimizer", fsdp="shard_grad_op"),
    Mix(offload="optimizer+params", zero_stage=3),
    Mix(offload="optimizer+params", fsdp="full_shard", method="full"),
    Mix(method="qlora", optimizer="paged_adamw_8bit", precision="fp16-mixed"),
    Mix(method="full", optimizer="sgd", precision="fp32", attention="eager"),
])
def test_combinations_frameworks_run_are_accepted(mix):
    check_mix(mix)


@pytest.mark.parametrize("model, mix, reason", [
    ("llama-2-7b", Mix(experts_top_k=2), "experts_top_k is for MoE models"),
    ("mixtral-8x7b", Mix(experts_top_k=9), r"experts_top_k \(9\) exceeds the model's 8 experts"),
    ("mixtral-8x7b", Mix(precision="fp16-mixed"), "grouped_mm runs in bf16 only"),
])
def test_model_rules_say_why(model, mix, reason):
    assert re.search(reason, model_problem(mix, load_model(model)) or "")


def test_gpu_rules_name_the_gpu_and_the_fix():
    t4, mixtral = gpu_from_catalog("t4"), load_model("mixtral-8x7b")
    assert "use attention: sdpa" in gpu_problem(Mix(attention="flash"), mixtral, t4)
    assert "no bf16 support" in gpu_problem(Mix(attention="sdpa"), mixtral, t4)
    assert gpu_problem(Mix(attention="sdpa", precision="fp16-mixed", experts_backend="batched_mm"), mixtral, t4) is None
    # problem() checks every kind, mix rules first
    assert "both fsdp" in problem(Mix(fsdp="full_shard", zero_stage=3, attention="flash"), mixtral, t4)


def test_every_rule_passes_the_default_mix():
    model, gpu = load_model("llama-2-7b"), gpu_from_catalog("a100-80gb")
    assert all(rule(Mix()) is None for rule in MIX_RULES)
    assert all(rule(Mix(), model) is None for rule in MODEL_RULES)
    assert all(rule(Mix(), model, gpu) is None for rule in GPU_RULES)


def test_gpu_rules_read_only_the_gpu_fields_of_the_mix():
    """recommend decides gpu_problem once per distinct GPU_FIELDS value: every other Mix field, changed alone,
    leaves the answer on every catalog GPU as it was, for mixes some GPUs refuse."""
    from dataclasses import fields

    from ftscope import catalog
    from ftscope.spec.rules import GPU_FIELDS
    from ftscope.spec.scenario import fast_replace
    others = dict(method="qlora", lora_rank=64, lora_targets="attention", gradient_checkpointing=True, zero_stage=3,
                  fsdp="full_shard", offload="optimizer+params", optimizer="adamw_8bit", experts_top_k=1,
                  loss="chunked", fused_elementwise=True, lora_dropout=0.1, checkpointing="selective",
                  checkpoint_every=2, tensor_parallel=4, sequence_parallel=True, tp_comm_overlap=True,
                  pipeline_parallel=4, pipeline_schedule="interleaved", virtual_stages=2, context_parallel=2,
                  context_parallel_impl="all_to_all", expert_parallel=8, compile=True, optimizer_in_backward=True,
                  activation_offload=True, nested_quant=False)
    assert set(others) | set(GPU_FIELDS) == {f.name for f in fields(Mix)}
    gpus = [gpu_from_catalog(k) for k in catalog.gpu_table()]
    model = load_model("olmoe-1b-7b")
    refused = 0
    for base in (Mix(attention="flash"), Mix(attention="flash3"), Mix(fp8=True), Mix(precision="bf16"),
                 Mix(experts_backend="grouped_mm", precision="fp16-mixed"), Mix(attention="eager")):
        for gpu in gpus:
            want = gpu_problem(base, model, gpu)
            refused += want is not None
            for name, value in others.items():
                assert gpu_problem(fast_replace(base, **{name: value}), model, gpu) == want, (base, name, gpu.key)
    assert refused > 5
