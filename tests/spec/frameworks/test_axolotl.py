"""Axolotl configs: the real QLoRA example maps key by key, with Axolotl's defaults; what cannot be said is an error."""
import pytest

from ftscope.errors import FtscopeError
from ftscope.spec.frameworks import read_config


def test_real_qlora_example_maps_every_memory_key(example):
    cfg = read_config(example("axolotl-llama-3-qlora.yml"))
    assert cfg.format == "axolotl" and cfg.scenario["framework"] == "axolotl"
    assert cfg.scenario["model"] == "llama-3.1-8b"  # NousResearch/Meta-Llama-3-8B has Llama 3.1 8B's blocks
    assert cfg.scenario["mix"] == {"method": "qlora", "lora_rank": 32, "lora_dropout": 0.05, "lora_targets": "all-linear",
                                   "optimizer": "adamw", "precision": "bf16-mixed", "gradient_checkpointing": True,
                                   "attention": "flash"}
    assert cfg.scenario["workload"] == {"seq_len": 4096, "micro_batch_size": 2, "gradient_accumulation": 4,
                                        "padding": "packed", "epochs": 4.0}
    listed = " ".join(cfg.unmapped)
    assert "paged_adamw_32bit" in listed and "datasets" in listed
    assert any("NousResearch/Meta-Llama-3-8B" in n for n in cfg.notes)


def test_bnb_config_kwargs_double_quant_maps_to_nested_quant(example, write_config):
    import yaml
    data = yaml.safe_load(example("axolotl-llama-3-qlora.yml").read_text())
    off = read_config(write_config("a.yml", {**data, "bnb_config_kwargs": {"bnb_4bit_use_double_quant": False,
                                                                          "bnb_4bit_quant_type": "nf4"}}))
    assert off.scenario["mix"]["nested_quant"] is False
    assert not any("bnb_config_kwargs" in u for u in off.unmapped)
    other = read_config(write_config("b.yml", {**data, "bnb_config_kwargs": {"blocksize": 128}}))
    assert "nested_quant" not in other.scenario["mix"]  # the loader's own True stands (the recipe's default)
    assert any(u.startswith("bnb_config_kwargs.blocksize=128") for u in other.unmapped)
    with pytest.raises(FtscopeError, match="bnb_4bit_use_double_quant: must be true or false"):
        read_config(write_config("c.yml", {**data, "bnb_config_kwargs": {"bnb_4bit_use_double_quant": "yes"}}))


def test_fsdp_example_reads_sharding_and_offload(example):
    mix = read_config(example("axolotl-llama-3-qlora-fsdp-70b.yaml")).scenario["mix"]
    assert mix["fsdp"] == "full_shard" and mix["offload"] == "optimizer+params"


def test_int8_example_is_an_error_naming_its_key(example):
    with pytest.raises(FtscopeError, match="lora_modules_to_save"):
        read_config(example("axolotl-llama-3-lora-8b-int8.yml"))


def test_schema_defaults_and_unknown_keys(write_config):
    cfg = read_config(write_config("a.yml", {"base_model": "meta-llama/Llama-2-7b-hf", "adapter": "lora",
                                             "some_new_feature": 3, "wandb_project": "x"}))
    assert cfg.scenario["workload"]["seq_len"] == 512 and cfg.scenario["workload"]["micro_batch_size"] == 1
    assert cfg.scenario["mix"]["gradient_checkpointing"] is False and cfg.scenario["mix"]["lora_dropout"] == 0.0
    assert any(u.startswith("some_new_feature=3") for u in cfg.unmapped)
    assert not any("wandb" in u for u in cfg.unmapped)


@pytest.mark.parametrize("extra,key", [({"load_in_8bit": True}, "load_in_8bit"), ({"rl": "dpo"}, "rl"),
                                       ({"optimizer": "adafactor"}, "optimizer"), ({"adapter": "ia3"}, "adapter"),
                                       ({"tensor_parallel_size": 2}, "tensor_parallel_size")])
def test_what_ftscope_cannot_express_is_an_error(write_config, extra, key):
    with pytest.raises(FtscopeError, match=key):
        read_config(write_config("a.yml", {"base_model": "llama-2-7b", "adapter": "lora", **extra}))


def test_a_parallel_degree_of_one_is_no_parallelism(write_config):
    assert read_config(write_config("a.yml", {"base_model": "llama-2-7b", "tensor_parallel_size": 1})) is not None
