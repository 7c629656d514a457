"""Shared reading: no key dropped silently, optimizer / attention / precision names, DeepSpeed and FSDP settings."""
from pathlib import Path

import pytest

from ftscope.errors import FtscopeError
from ftscope.spec.frameworks.base import (FrameworkConfig, Keys, attention, deepspeed, fsdp, is_set, key_table,
                                          optimizer, precision)


def _cfg(tmp_path=Path(".")):
    return FrameworkConfig(format="trl", path=tmp_path / "c.yaml", original={})


def test_keys_list_what_was_not_read_and_skip_what_does_not_matter():
    cfg = _cfg()
    keys = Keys({"learning_rate": 1e-4, "torch_compile": True, "brand_new": "x", "off": False, "read_me": 4},
                key_table("hf-training-args"), cfg)
    keys.get("read_me")
    out = keys.unmapped()
    assert out == ["torch_compile=true (torch.compile: changes step time and activation memory; not modelled)",
                   "brand_new=x (not read by ftscope)"]


def test_unsupported_key_is_an_error_naming_it():
    with pytest.raises(FtscopeError, match="parallelism_config"):
        Keys({"parallelism_config": {"tp_size": 2}}, key_table("hf-training-args"), _cfg())


def test_names():
    cfg = _cfg()
    assert optimizer("adamw_torch_fused", "optim", cfg) == "adamw" and optimizer("paged_adamw_8bit", "optim", cfg) == "paged_adamw_8bit"
    assert optimizer("paged_adamw_32bit", "optim", cfg) == "adamw" and cfg.unmapped  # approximated, and said so
    with pytest.raises(FtscopeError, match="lion"):
        optimizer("lion_32bit", "optim", cfg)
    assert attention("kernels-community/flash-attn2", "a", cfg) == "flash" and attention("auto", "a", cfg) == "sdpa"
    assert precision(True, False) == "bf16-mixed" and precision("auto", False) == "bf16-mixed"
    assert precision(False, True) == "fp16-mixed" and precision(None, None) == "fp32"
    assert not is_set("none") and not is_set([]) and is_set(0.05)


@pytest.mark.parametrize("name,stage,offload", [("ds_z3_offload_config.json", 3, "optimizer+params"),
                                                ("deepspeed_configs/zero2.json", 2, "none"), ("ds_z0_config.json", 0, "none")])
def test_deepspeed_from_names(name, stage, offload):
    cfg = _cfg()
    cfg.scenario = {}
    deepspeed(name, "deepspeed", cfg)
    assert cfg.scenario["mix"] == {"zero_stage": stage, "offload": offload}


def test_fsdp_strings_and_options():
    cfg = _cfg()
    fsdp(["full_shard", "auto_wrap", "offload"], None, "fsdp", cfg)
    assert cfg.scenario["mix"] == {"fsdp": "full_shard", "offload": "optimizer+params"}
    cfg = _cfg()
    fsdp("full_shard", {"reshard_after_forward": False}, "fsdp", cfg)
    assert cfg.scenario["mix"]["fsdp"] == "shard_grad_op"
