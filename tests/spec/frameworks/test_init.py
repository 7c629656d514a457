"""Detecting a framework config, loading it as a checked scenario with overrides, and leaving scenarios alone."""
import pytest

import ftscope
from ftscope.errors import FtscopeError
from ftscope.spec.frameworks import detect, load, read_config


@pytest.mark.parametrize("data,fmt", [
    ({"base_model": "x"}, "axolotl"), ({"model": {"_component_": "torchtune.models.llama2.llama2_7b"}}, "torchtune"),
    ({"model_name_or_path": "x", "stage": "sft"}, "llama-factory"), ({"model_name_or_path": "x"}, "trl"),
    ({"output_dir": "o", "per_device_train_batch_size": 1}, "trl"), ("python sft.py --lora_r 8", "trl"),
    ({"model": "llama-2-7b"}, None), ({"model": {"model_type": "llama"}}, None), ("just text", None)])
def test_detect(data, fmt):
    assert detect(data) == fmt


def test_scenario_files_are_not_framework_configs(scenario_dict, write_config):
    assert read_config(write_config("s.yaml", scenario_dict)) is None


def test_load_applies_overrides_and_checks(example):
    scn, cfg = load(example("axolotl-llama-3-qlora.yml"), ["hardware.gpu=h100-80gb", "mix.lora_rank=8"])
    assert cfg.format == "axolotl" and scn.recipe.name == "axolotl"
    assert scn.cluster.gpu.key == "h100-80gb" and scn.mix.lora_rank == 8 and scn.mix.attention == "flash"
    assert not any("hardware.gpu" in n for n in cfg.notes)
    # the library's load_scenario reads framework configs too
    assert ftscope.load_scenario(example("axolotl-llama-3-qlora.yml")).mix == load(example("axolotl-llama-3-qlora.yml"))[0].mix


def test_mapped_values_still_pass_the_scenario_checks(write_config):
    with pytest.raises(FtscopeError, match="lora_rank"):
        load(write_config("a.yml", {"base_model": "llama-2-7b", "adapter": "lora", "lora_r": 0}))
