"""Mix: each field's type is what it allows (checked by `schema.validate`), shard stage, label, choices."""
from __future__ import annotations

import pytest

from ftscope import FtscopeError
from ftscope.spec.mix import Mix, mix_help
from ftscope.spec.rules import check_mix
from ftscope.spec.schema import choices, validate


def test_default_mix_is_valid():
    assert check_mix(Mix()) == Mix()


@pytest.mark.parametrize("field, value", [
    ("method", "prefix"), ("attention", "xformers"), ("offload", "nvme"), ("precision", "fp8"),
    ("optimizer", "adafactor"), ("fsdp", "hybrid_shard"), ("experts_backend", "triton"), ("loss", "fused_ce"),
])
def test_value_outside_its_choices_lists_the_choices(field, value):
    with pytest.raises(FtscopeError, match=rf"mix.{field} must be one of .*got '{value}'"):
        check_mix(Mix(**{field: value}))


@pytest.mark.parametrize("stage", [-1, 4, 5, 1.5, True, "2"])
def test_zero_stage_must_be_0_to_3(stage):
    with pytest.raises(FtscopeError, match="zero_stage must be one of 0, 1, 2, 3"):
        check_mix(Mix(zero_stage=stage))


@pytest.mark.parametrize("rank", [0, -8, 4097, 8.5, True, "16", None])
def test_lora_rank_must_be_an_integer_from_1_to_4096(rank):
    with pytest.raises(FtscopeError, match="lora_rank must be an integer from 1 to 4,096"):
        check_mix(Mix(method="lora", lora_rank=rank))


@pytest.mark.parametrize("top_k", [0, -1, 1.5, True])
def test_experts_top_k_must_be_a_positive_integer(top_k):
    with pytest.raises(FtscopeError, match="experts_top_k must be an integer from 1"):
        check_mix(Mix(experts_top_k=top_k))


@pytest.mark.parametrize("targets", ["", (), ("q_proj", 3), 7, {"q": 1}])
def test_lora_targets_must_be_a_name_or_a_list_of_names(targets):
    with pytest.raises(FtscopeError, match=r"mix.lora_targets(\[1\])? must be (all-linear, attention, mlp or a list|a string)"):
        check_mix(Mix(lora_targets=targets))


def test_integral_floats_are_integers_and_yaml_off_spellings_mean_off():
    mix = validate(Mix, {"zero_stage": 2.0, "lora_rank": 8.0, "offload": None, "fsdp": "no"})
    assert mix.zero_stage == 2 and isinstance(mix.zero_stage, int) and mix.lora_rank == 8
    assert mix.offload == "none" and mix.fsdp is None
    assert validate(Mix, {"zero_stage": None, "offload": False, "fsdp": False}) == Mix()


def test_gradient_checkpointing_refuses_yaml_truthy_strings():
    for value in ("yes", "true", 1, "on"):
        with pytest.raises(FtscopeError, match="gradient_checkpointing must be true or false"):
            validate(Mix, {"gradient_checkpointing": value}, "mix")


def test_nested_quant_is_a_strict_flag_on_by_default():
    assert Mix().nested_quant is True and validate(Mix, {"nested_quant": False}, "mix").nested_quant is False
    for value in ("no", 0, "false", None):
        with pytest.raises(FtscopeError, match="mix.nested_quant must be true or false"):
            validate(Mix, {"nested_quant": value}, "mix")


def test_unknown_key_suggests_the_nearest():
    with pytest.raises(FtscopeError, match=r"unknown key 'mix.zero_stag' \(did you mean: zero_stage"):
        validate(Mix, {"zero_stag": 1}, "mix")


def test_choices_come_from_the_field_types():
    assert choices(Mix, "method") == ("full", "lora", "qlora")
    assert choices(Mix, "zero_stage") == (0, 1, 2, 3)
    assert choices(Mix, "fsdp") == ("full_shard", "shard_grad_op")
    assert choices(Mix, "lora_rank") == ()
    help_text = mix_help()
    assert "mix.attention: eager | sdpa | flash" in help_text and "mix.lora_rank" not in help_text


@pytest.mark.parametrize("mix, stage", [(Mix(), 0), (Mix(zero_stage=2), 2), (Mix(fsdp="full_shard"), 3),
                                        (Mix(fsdp="shard_grad_op"), 2)])
def test_shard_stage_maps_fsdp_onto_zero_stages(mix, stage):
    assert mix.shard_stage == stage


def test_trains_lora_for_lora_and_qlora_only():
    assert Mix(method="lora").trains_lora and Mix(method="qlora").trains_lora
    assert not Mix(method="full").trains_lora


def test_label_names_every_non_default_choice():
    label = Mix(method="qlora", lora_rank=64, gradient_checkpointing=True, attention="flash", zero_stage=3,
                offload="optimizer+params", optimizer="sgd", precision="bf16", experts_top_k=1,
                loss="chunked").label()
    for part in ("qlora r64", "+gc", "flash", "zero3", "offload-optimizer+params", "sgd", "bf16", "top1",
                 "chunked-loss"):
        assert part in label
    assert Mix(method="full", fsdp="full_shard").label() == "full sdpa fsdp-full_shard"


@pytest.mark.parametrize("mix, message", [
    (Mix(tensor_parallel=0), "mix.tensor_parallel must be an integer from 1 to 1,024"),
    (Mix(pipeline_parallel=2.5), "mix.pipeline_parallel must be an integer"),
    (Mix(context_parallel=True), "mix.context_parallel must be an integer"),
    (Mix(checkpointing="some"), "mix.checkpointing must be one of"),
    (Mix(pipeline_schedule="zb"), "mix.pipeline_schedule must be one of"),
    (Mix(fp8="yes"), "mix.fp8 must be true or false"),
    (Mix(checkpointing="selective"), "needs gradient_checkpointing: true"),
    (Mix(gradient_checkpointing=True, checkpointing="selective", checkpoint_every=2), "checkpoint_every applies"),
    (Mix(sequence_parallel=True), "needs tensor_parallel > 1"),
    (Mix(pipeline_parallel=2, virtual_stages=2), "needs pipeline_schedule: interleaved"),
    (Mix(pipeline_parallel=2, zero_stage=3), "refuse ZeRO-2/3"),
    (Mix(fp8=True, precision="fp32"), "precision fp32 is not one"),
    (Mix(fp8=True, method="qlora"), "NF4 base is dequantized to bf16"),
])
def test_layout_keys_and_their_combinations(mix, message):
    with pytest.raises(FtscopeError, match=message):
        check_mix(mix)


def test_layout_keys_that_combine_are_accepted_and_labelled():
    m = Mix(method="full", tensor_parallel=4, sequence_parallel=True, pipeline_parallel=2, pipeline_schedule="interleaved",
            virtual_stages=4, zero_stage=1, fp8=True, compile=True, gradient_checkpointing=True, checkpointing="selective")
    check_mix(m)
    assert m.model_parallel == 8
    assert {"tp4", "pp2", "fp8", "compile", "selective-ckpt"} <= set(m.label().split())


def test_qlora_parameter_offload_only_under_fsdp():
    check_mix(Mix(method="qlora", fsdp="full_shard", offload="optimizer+params"))
    with pytest.raises(FtscopeError, match="needs fsdp: full_shard"):
        check_mix(Mix(method="qlora", zero_stage=3, offload="optimizer+params"))
