"""What a live model is: LoRA targets PEFT wrapped, its base's dtypes, checkpointing, the GPU in the catalog."""
from __future__ import annotations

import pytest

from ftscope.integrations.model_facts import base_model, catalog_gpu, find_hf_model, gpu_key, quantization, run_config, world

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")


def test_a_peft_model_reads_as_its_lora_its_dtypes_and_its_checkpointing(tiny_model):
    tiny_model.to(torch.bfloat16)
    model = peft.get_peft_model(tiny_model, peft.LoraConfig(r=4, target_modules=r".*\.(q_proj|down_proj)"))
    base_model(model).gradient_checkpointing_enable()
    run = run_config(model, {"bf16": True})
    assert run.lora["r"] == 4 and run.lora["targets"] == ["down_proj", "q_proj"]  # what the regex selected
    assert (run.trainable_dtype, run.frozen_dtype, run.quantization) == ("float32", "bfloat16", None)
    assert run.gradient_checkpointing and run.attention == "sdpa" and run.experts_implementation is None
    assert run.model_config["num_hidden_layers"] == 2 and not run.hand_frozen


def test_full_fine_tuning_with_frozen_layers_is_said(tiny_model):
    tiny_model.model.embed_tokens.weight.requires_grad_(False)
    run = run_config(tiny_model, {})
    assert run.lora is None and run.hand_frozen and not run.gradient_checkpointing


def test_the_hf_model_inside_a_training_module_is_found(tiny_model):
    wrapper = torch.nn.Module()
    wrapper.net = tiny_model
    assert find_hf_model(wrapper) is tiny_model and find_hf_model(torch.nn.Linear(2, 2)) is None
    assert quantization(tiny_model) is None


def test_the_world_and_the_device_come_from_the_run(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert world() == (16, 8)
    assert gpu_key("cpu") == (None, "")


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA H100 80GB HBM3", "h100-80gb"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("Tesla T4", "t4"), ("NVIDIA A10G", "a10g"), ("NVIDIA L40S", "l40s"),
])
def test_torchs_device_names_resolve_in_the_catalog(name, key):
    assert catalog_gpu(name) == (key, "")


def test_an_unknown_gpu_says_how_to_name_it():
    assert catalog_gpu("NVIDIA Quadro P400") == (None, "GPU 'NVIDIA Quadro P400' is not in ftscope's catalog: pass gpu= to the callback")
