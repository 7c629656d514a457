"""A run's own settings (TrainingArguments, a PEFT LoraConfig, the weights' dtypes) as an ftscope scenario."""
from __future__ import annotations

import types

import pytest

import ftscope
from ftscope.errors import FtscopeError
from ftscope.integrations.run_config import RunConfig, lora_settings, precision, run_scenario, scenario_mapping

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def _run(tiny_config, args, **changes) -> RunConfig:
    base = dict(model_config=tiny_config, model_name="tiny-llama", training_args=args.to_dict() if hasattr(args, "to_dict") else args,
                trainable_dtype="float32", frozen_dtype="bfloat16")
    return RunConfig(**{**base, **changes})


def test_training_arguments_and_a_lora_config_become_the_mix(tiny_config, tiny_model, tmp_path):
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4,
                                          gradient_accumulation_steps=8, activation_checkpointing=True, bf16=True,
                                          optim="adamw_bnb_8bit", report_to="none")
    lora = peft.LoraConfig(r=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.1)
    run = _run(tiny_config, args, lora=lora_settings(lora), gradient_checkpointing=True, attention="sdpa")
    mapping, notes = scenario_mapping(run, batch=4, seq_len=512, micro_batches=8)
    assert mapping["framework"] == "hf-trainer"
    assert {k: mapping["mix"][k] for k in ("method", "lora_rank", "lora_targets", "lora_dropout", "gradient_checkpointing",
                                             "precision", "optimizer", "attention")} == {
        "method": "lora", "lora_rank": 8, "lora_targets": ["k_proj", "o_proj", "q_proj", "v_proj"], "lora_dropout": 0.1,
        "gradient_checkpointing": True, "precision": "bf16-mixed", "optimizer": "adamw_8bit", "attention": "sdpa"}
    wl = mapping["workload"]
    assert (wl["micro_batch_size"], wl["seq_len"], wl["padding"], wl["gradient_accumulation"]) == (4, 512, "max_length", 8)
    assert any("no CUDA device" in n for n in notes)
    scn = run_scenario(run, batch=4, seq_len=512, micro_batches=8)
    assert scn.model.name == "tiny-llama (as built)" and scn.model.num_layers == 2
    built = peft.get_peft_model(tiny_model, lora)  # the adapters PEFT builds are the ones estimated
    trainable = sum(p.numel() for p in built.parameters() if p.requires_grad)
    assert ftscope.estimate(scn, strict=False).model_memory.trainable_params == trainable


def test_a_4bit_base_is_qlora_and_the_gpu_and_world_are_the_runs(tiny_config):
    args = {"per_device_train_batch_size": 1, "bf16": True}
    run = _run(tiny_config, args, lora={"r": 16, "targets": "all-linear"}, quantization="4bit", gpu="h100-80gb",
               world_size=16, gpus_per_node=8)
    mapping, _ = scenario_mapping(run, 1, 2048, 1)
    assert mapping["mix"]["method"] == "qlora"
    assert mapping["hardware"] == {"gpu": "h100-80gb", "gpus_per_node": 8, "nodes": 2}
    assert "nested_quant" not in mapping["mix"]  # no BitsAndBytesConfig in the config: the recipe's default


@pytest.mark.parametrize("double_quant", [True, False])
def test_the_models_bitsandbytes_config_says_whether_quantization_is_nested(tiny_config, double_quant):
    bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_use_double_quant=double_quant).to_dict()
    run = _run({**tiny_config, "quantization_config": bnb}, {"bf16": True}, lora={"r": 16, "targets": "all-linear"},
               quantization="4bit")
    mapping, _ = scenario_mapping(run, 1, 512, 1)
    assert mapping["mix"]["nested_quant"] is double_quant


def test_deepspeed_and_fsdp_settings_shard_the_run(tiny_config):
    zero3 = _run(tiny_config, {"deepspeed": {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}},
                 world_size=2, gpus_per_node=2)
    mix = scenario_mapping(zero3, 1, 128, 1)[0]["mix"]
    assert (mix["zero_stage"], mix["offload"], mix["method"]) == (3, "optimizer", "full")
    fsdp = _run(tiny_config, {"fsdp": ["shard_grad_op", "auto_wrap"]}, world_size=2, gpus_per_node=2)
    assert scenario_mapping(fsdp, 1, 128, 1)[0]["mix"]["fsdp"] == "shard_grad_op"


@pytest.mark.parametrize("trainable, frozen, flags, want", [
    ("float32", None, {}, "fp32"), ("float32", None, {"bf16": True}, "bf16-mixed"), ("float32", None, {"fp16": True}, "fp16-mixed"),
    ("bfloat16", None, {"bf16": True}, "bf16"), ("bfloat16", None, {}, "bf16"),
    ("float32", "bfloat16", {"bf16": True}, "bf16-mixed"), ("float32", "bfloat16", {}, "bf16-mixed"),
])
def test_precision_follows_the_weights_dtypes_then_the_autocast_flags(tiny_config, trainable, frozen, flags, want):
    mix_precision, notes = precision(_run(tiny_config, flags, trainable_dtype=trainable, frozen_dtype=frozen))
    assert mix_precision == want
    assert bool(notes) == (want == "bf16-mixed" and not flags)  # bf16 base + fp32 adapters without autocast: said


def test_what_ftscope_cannot_express_is_one_line(tiny_config):
    with pytest.raises(FtscopeError, match="DoRA adapters are not modelled"):
        scenario_mapping(_run(tiny_config, {}, lora={"r": 8, "targets": "all-linear", "use_dora": True}), 1, 64, 1)
    with pytest.raises(FtscopeError, match="8-bit"):
        scenario_mapping(_run(tiny_config, {}, quantization="8bit"), 1, 64, 1)
    with pytest.raises(FtscopeError, match="PEFT method IA3 is not modelled"):
        lora_settings(peft.IA3Config(target_modules=["q_proj"]))
    with pytest.raises(FtscopeError, match="pass the model PEFT wrapped"):
        lora_settings(types.SimpleNamespace(peft_type="LORA", target_modules=r".*\.q_proj", r=8, lora_dropout=0.0))
    assert lora_settings(peft.LoraConfig(r=2, target_modules=r".*q_proj"), ["model.layers.0.self_attn.q_proj"])["targets"] == ["q_proj"]
