"""torchtune recipe configs: builders, LoRA modules, chunked loss, pure bf16, compile, activation offloading and the
optimizer step fused into backward."""
import pytest

from ftscope.errors import FtscopeError
from ftscope.spec.frameworks import read_config, scenario_mapping


def test_real_qlora_config(example):
    cfg = read_config(example("torchtune-llama3_1-8B-qlora-single-device.yaml"))
    assert cfg.format == "torchtune" and cfg.scenario["model"] == "llama-3.1-8b"
    mix = cfg.scenario["mix"]
    assert mix == {"method": "qlora", "lora_targets": ["q_proj", "v_proj", "output_proj", "w1", "w2", "w3"],
                   "lora_rank": 8, "lora_dropout": 0.0, "optimizer": "adamw", "loss": "chunked", "precision": "bf16",
                   "gradient_checkpointing": True}
    assert any("max_seq_len is null" in u for u in cfg.unmapped)
    with pytest.raises(FtscopeError, match="workload.seq_len"):  # torchtune trains on untruncated samples
        scenario_mapping(cfg)
    assert scenario_mapping(cfg, ["workload.seq_len=2048"])["workload"]["seq_len"] == 2048


def test_optimizer_in_backward_maps_to_its_mix_key(example):
    cfg = read_config(example("torchtune-llama3_1-8B-full-single-device.yaml"))
    mix = cfg.scenario["mix"]
    assert mix["method"] == "full" and mix["optimizer_in_backward"] is True
    assert not any(u.startswith("optimizer_in_bwd") for u in cfg.unmapped)


def test_packed_dataset_list_fsdp_and_compile(write_config):
    cfg = read_config(write_config("tt.yaml", {
        "model": {"_component_": "torchtune.models.llama3_2.lora_llama3_2_1b", "lora_attn_modules": ["q_proj"],
                  "apply_lora_to_output": True},
        "tokenizer": {"max_seq_len": 4096}, "dataset": [{"_component_": "x.alpaca", "packed": True}],
        "optimizer": {"_component_": "bitsandbytes.optim.PagedAdamW8bit"}, "compile": True,
        "fsdp_cpu_offload": True, "batch_size": 4}))
    sc = cfg.scenario
    assert sc["model"] == "llama-3.2-1b" and sc["workload"]["padding"] == "packed" and sc["workload"]["seq_len"] == 4096
    assert sc["mix"]["optimizer"] == "paged_adamw_8bit" and "offload" not in sc["mix"]  # one device: no FSDP
    mix = scenario_mapping(cfg, ["hardware.gpus_per_node=4"])["mix"]  # the distributed recipe shards
    assert (mix["fsdp"], mix["offload"]) == ("full_shard", "optimizer+params")
    assert sc["mix"]["compile"] is True and "activation_offload" not in sc["mix"]
    listed = " ".join(cfg.unmapped)
    assert "compile" not in listed and "apply_lora_to_output" in listed
    offload = read_config(write_config("tt2.yaml", {"model": {"_component_": "torchtune.models.llama3_2.llama3_2_1b"},
                                                     "enable_activation_offloading": True, "compile": False}))
    assert offload.scenario["mix"]["activation_offload"] is True and "compile" not in offload.scenario["mix"]
