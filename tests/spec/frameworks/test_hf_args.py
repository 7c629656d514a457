"""TrainingArguments keys shared by TRL and LLaMA-Factory: batch, steps, checkpointing variant, Liger."""
from pathlib import Path

from ftscope.spec.frameworks.base import FrameworkConfig, Keys, key_table
from ftscope.spec.frameworks.hf_args import read_training_args


def _read(data, framework="hf-trainer", **defaults):
    cfg = FrameworkConfig(format="trl", path=Path("a.json"), original=data, scenario={"framework": framework})
    keys = Keys(data, key_table("hf-training-args"), cfg)
    read_training_args(keys, cfg, **{"checkpointing": False, "bf16": False, **defaults})
    return cfg


def test_trainer_defaults():
    sc = _read({}).scenario
    assert sc["workload"] == {"micro_batch_size": 8, "gradient_accumulation": 1, "epochs": 3.0}
    assert sc["mix"] == {"gradient_checkpointing": False, "precision": "fp32", "optimizer": "adamw"}


def test_max_steps_becomes_samples_and_liger_the_fused_loss():
    cfg = _read({"max_steps": 100, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4,
                 "use_liger_kernel": True, "fsdp": "shard_grad_op auto_wrap"})
    assert cfg.scenario["workload"]["num_samples"] == 800 and cfg.scenario["workload"]["epochs"] == 1.0
    assert cfg.scenario["mix"]["loss"] == "fused_linear" and cfg.scenario["mix"]["fsdp"] == "shard_grad_op"
    assert any("use_liger_kernel" in u for u in cfg.unmapped)


def test_a_checkpointing_variant_other_than_the_recipes_is_listed():
    cfg = _read({"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": True}}, "trl-sft")
    assert any("use_reentrant=True" in u for u in cfg.unmapped)
    assert not _read({"gradient_checkpointing_kwargs": {"use_reentrant": False}}, "trl-sft").unmapped
