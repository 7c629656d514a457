"""TRL: the documented QLoRA command line, an SFTConfig JSON written by TRL itself, a `trl sft --config` YAML."""
import pytest

from ftscope.errors import FtscopeError
from ftscope.spec.frameworks import read_config, scenario_mapping
from ftscope.spec.frameworks.trl import parse_command


def test_parse_command_flags_values_and_launcher():
    args = parse_command("accelerate launch --num_processes 8 trl/scripts/sft.py \\\n --use_peft --lora_r 32 "
                         "--lora_target_modules q_proj v_proj --max_length=2048 # a comment\n")
    assert args["use_peft"] is True and args["lora_r"] == 32 and args["max_length"] == 2048
    assert args["lora_target_modules"] == ["q_proj", "v_proj"]
    assert args["_launcher"] == {"num_processes": 8} and args["_script"] == "trl/scripts/sft.py"


def test_documented_qlora_command(example):
    cfg = read_config(example("trl-sft-llama-2-7b-qlora.sh"))
    assert cfg.format == "trl" and cfg.scenario["framework"] == "trl-sft"
    mix, wl = cfg.scenario["mix"], cfg.scenario["workload"]
    assert (mix["method"], mix["lora_rank"], mix["lora_dropout"]) == ("qlora", 32, 0.05)
    assert mix["lora_targets"] == ["q_proj", "v_proj"]  # PEFT's default for llama
    assert mix["gradient_checkpointing"] is True and mix["precision"] == "bf16-mixed"  # SFTConfig's defaults
    assert wl["seq_len"] == 1024 and wl["micro_batch_size"] == 1 and wl["gradient_accumulation"] == 16
    assert mix["nested_quant"] is False  # ModelConfig's use_bnb_nested_quant default: fp32 absmax scales
    listed = " ".join(cfg.unmapped)
    assert "dtype=float32" in listed and "use_bnb_nested_quant" not in listed


def test_use_bnb_nested_quant_maps_to_nested_quant(example, write_config):
    command = example("trl-sft-llama-2-7b-qlora.sh").read_text()
    nested = read_config(write_config("n.sh", command.replace("--load_in_4bit", "--load_in_4bit --use_bnb_nested_quant True")))
    assert nested.scenario["mix"]["nested_quant"] is True
    assert read_config(write_config("o.sh", command.replace("--load_in_4bit", "--load_in_4bit --use_bnb_nested_quant=false"))
                       ).scenario["mix"]["nested_quant"] is False
    with pytest.raises(FtscopeError, match="use_bnb_nested_quant: must be true or false"):
        read_config(write_config("b.sh", command.replace("--load_in_4bit", "--load_in_4bit --use_bnb_nested_quant maybe")))


def test_sftconfig_json_names_no_model(example):
    cfg = read_config(example("trl-sftconfig.json"))
    assert cfg.scenario["framework"] == "trl-sft" and cfg.scenario["workload"]["padding"] == "packed"
    assert cfg.unmapped == []  # every other key of the full dump is known to leave memory and time alone
    with pytest.raises(FtscopeError, match="names no model"):
        scenario_mapping(cfg)
    assert scenario_mapping(cfg, ["model=llama-3.1-8b"])["model"] == "llama-3.1-8b"


def test_trainer_arguments_without_sft_keys_are_the_plain_trainer(write_config):
    cfg = read_config(write_config("args.json", {"output_dir": "o", "per_device_train_batch_size": 2, "bf16": True}))
    assert cfg.scenario["framework"] == "hf-trainer" and cfg.scenario["mix"]["gradient_checkpointing"] is False


def test_cli_yaml_and_refusals(example, write_config):
    assert read_config(example("trl-cli-example-config.yaml")).scenario["model"] == "Qwen/Qwen2.5-0.5B"
    with pytest.raises(FtscopeError, match="use_peft"):
        read_config(write_config("c.sh", "trl sft --model_name_or_path llama-2-7b --load_in_4bit"))
    with pytest.raises(FtscopeError, match="lora_target_modules"):
        read_config(write_config("c.sh", "trl sft --model_name_or_path mixtral-8x7b-nope --use_peft"))
