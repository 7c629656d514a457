"""LLaMA-Factory train YAMLs: the real QLoRA and ZeRO-3 examples, LLaMA-Factory's defaults, its refusals."""
import pytest

from ftscope.errors import FtscopeError
from ftscope.spec.frameworks import read_config


def test_real_qlora_example(example):
    cfg = read_config(example("llama-factory-llama3-qlora-sft.yaml"))
    assert cfg.format == "llama-factory" and cfg.scenario["model"] == "llama-3.1-8b"
    mix, wl = cfg.scenario["mix"], cfg.scenario["workload"]
    assert (mix["method"], mix["lora_rank"], mix["lora_targets"]) == ("qlora", 8, "all-linear")
    assert mix["gradient_checkpointing"] is True and mix["precision"] == "bf16-mixed" and mix["attention"] == "sdpa"
    assert mix["nested_quant"] is True  # double_quantization's default
    assert wl == {"micro_batch_size": 1, "gradient_accumulation": 8, "epochs": 3.0, "seq_len": 2048, "num_samples": 1000}
    assert any(u.startswith("dataset=") for u in cfg.unmapped)


def test_deepspeed_stage_from_the_file_name_when_the_file_is_elsewhere(example):
    cfg = read_config(example("llama-factory-llama3-lora-sft-ds3.yaml"))
    assert cfg.scenario["mix"]["zero_stage"] == 3 and cfg.scenario["mix"]["offload"] == "none"
    assert any("read from its name" in n for n in cfg.notes)


def test_deepspeed_file_beside_the_config_is_read(write_config, tmp_path):
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}')
    cfg = read_config(write_config("lf.yaml", {"model_name_or_path": "llama-2-7b", "stage": "sft", "deepspeed": "ds.json"}))
    assert (cfg.scenario["mix"]["zero_stage"], cfg.scenario["mix"]["offload"]) == (2, "optimizer")


def test_awq_checkpoint_is_an_error(example):
    with pytest.raises(FtscopeError, match="AWQ"):
        read_config(example("llama-factory-llama3-lora-sft-awq.yaml"))


@pytest.mark.parametrize("extra,key", [({"stage": "dpo"}, "stage"), ({"quantization_bit": 8}, "quantization_bit"),
                                       ({"finetuning_type": "freeze"}, "finetuning_type"), ({"use_galore": True}, "use_galore")])
def test_refusals(write_config, extra, key):
    with pytest.raises(FtscopeError, match=key):
        read_config(write_config("lf.yaml", {"model_name_or_path": "llama-2-7b", "stage": "sft", **extra}))


def test_pretraining_packs_by_default_and_pure_bf16(write_config):
    cfg = read_config(write_config("lf.yaml", {"model_name_or_path": "llama-2-7b", "stage": "pt", "pure_bf16": True,
                                               "disable_gradient_checkpointing": True, "use_reentrant_gc": False}))
    assert cfg.scenario["workload"]["padding"] == "packed" and cfg.scenario["mix"]["precision"] == "bf16"
    assert cfg.scenario["mix"]["gradient_checkpointing"] is False
    assert any("use_reentrant=False" in u for u in cfg.unmapped)  # the recipe models reentrant checkpointing


def test_double_quantization_maps_to_nested_quant(example, write_config):
    import yaml
    data = yaml.safe_load(example("llama-factory-llama3-qlora-sft.yaml").read_text())
    cfg = read_config(write_config("q.yaml", {**data, "double_quantization": False}))
    assert cfg.scenario["mix"]["nested_quant"] is False
    assert not any("double_quantization" in u for u in cfg.unmapped)
    with pytest.raises(FtscopeError, match="double_quantization: must be true or false"):
        read_config(write_config("b.yaml", {**data, "double_quantization": "no"}))
    lora = {k: v for k, v in data.items() if k not in ("quantization_bit", "quantization_method")}
    cfg = read_config(write_config("l.yaml", {**lora, "double_quantization": True}))  # no 4-bit base: nothing to set
    assert "nested_quant" not in cfg.scenario["mix"] and not any("double_quantization" in u for u in cfg.unmapped)
