"""Framework recipes: bundled files load into typed recipes, scenarios pick them by `framework:`, defaults apply."""
import pytest

import ftscope
from ftscope.errors import FtscopeError
from ftscope.spec.recipe import DEFAULT_FRAMEWORK, framework_names, load_recipe, recipe_from_dict

FRAMEWORKS = ("hf-trainer", "peft-kbit", "trl-sft", "axolotl", "llama-factory", "llama-factory-2024", "unsloth",
              "torchtune", "litgpt", "torchtitan", "fsdp-qlora", "torchtune-0.1", "llama-factory-0.4", "trl-sft-0.4",
              "peft-sft-2024")


def _scn(**top):
    raw = {"model": "llama-3.1-8b", "mix": {"method": "qlora"}, "workload": {"micro_batch_size": 1, "seq_len": 512}}
    raw.update(top)
    return ftscope.load_scenario(raw)


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_every_recipe_names_its_version_and_sources(name):
    rec = load_recipe(name)
    assert rec.name == name and rec.version
    assert rec.sources, f"{name} cites no source lines"
    for src in rec.sources:
        assert "/" in src.repo and src.ref and src.path and src.fact


def test_bundled_recipes_are_the_issue_list():
    assert set(FRAMEWORKS) <= set(framework_names())


def test_default_framework_is_hf_trainer_and_changes_nothing():
    plain = _scn()
    named = _scn(framework="hf-trainer")
    assert plain.recipe.name == DEFAULT_FRAMEWORK
    assert plain.mix == named.mix
    assert ftscope.estimate(plain).memory.peak_bytes == ftscope.estimate(named).memory.peak_bytes


def test_recipe_defaults_fill_mix_keys_the_scenario_leaves_out():
    scn = _scn(framework="trl-sft")
    assert scn.mix.gradient_checkpointing is True and scn.mix.loss == "fused_linear"
    own = _scn(framework="trl-sft", mix={"method": "qlora", "loss": "standard", "gradient_checkpointing": False})
    assert own.mix.loss == "standard" and own.mix.gradient_checkpointing is False


@pytest.mark.parametrize("name,nested", [("trl-sft", False), ("hf-trainer", True), ("peft-kbit", True),
                                         ("axolotl", True), ("llama-factory", True), ("llama-factory-2024", True),
                                         ("llama-factory-0.4", True), ("peft-sft-2024", True), ("fsdp-qlora", True),
                                         ("unsloth", True), ("torchtune", True), ("torchtune-0.1", True)])
def test_nested_quant_default_is_each_frameworks_own(name, nested):
    """TRL's ModelConfig leaves bitsandbytes' absmax in fp32 (use_bnb_nested_quant False); the loaders of Axolotl,
    LLaMA-Factory, Unsloth and fsdp_qlora, PEFT's example scripts and torchao's NF4 quantize them again; the generic
    Trainer keeps ftscope's nested default. A recipe that sets it cites the lines."""
    assert _scn(framework=name).mix.nested_quant is nested
    rec = load_recipe(name)
    if "nested_quant" in rec.mix_defaults:
        assert any("nested_quant" in s.fact for s in rec.sources), name
    if not rec.nested_quant_fixed:  # torchao's NF4 has no switch (test below)
        assert _scn(framework=name, mix={"method": "qlora", "nested_quant": not nested}).mix.nested_quant is (not nested)


def test_scenario_round_trip_keeps_the_framework():
    scn = _scn(framework="torchtune")
    again = ftscope.load_scenario(scn.to_dict())
    assert again.recipe.name == "torchtune" and again.mix == scn.mix


def test_unknown_framework_is_one_line_error():
    with pytest.raises(FtscopeError, match="unknown framework 'trl'.*did you mean"):
        _scn(framework="trl")


def test_malformed_recipe_rejected():
    base = {"name": "x", "title": "x", "version": "1"}
    with pytest.raises(FtscopeError, match="checkpoint_impl"):
        recipe_from_dict({**base, "checkpoint_impl": "sometimes"})
    with pytest.raises(FtscopeError, match="unknown keys"):
        recipe_from_dict({**base, "kbit_upcast": True})
    with pytest.raises(FtscopeError, match="kbit_fp32_params"):
        recipe_from_dict({**base, "kbit_fp32_params": ["heads"]})
    for bad in (-0.1, 3.0, "high"):
        with pytest.raises(FtscopeError, match="allocator_fragmentation_checkpointed"):
            recipe_from_dict({**base, "allocator_fragmentation_checkpointed": bad})
    assert recipe_from_dict({**base, "allocator_fragmentation_checkpointed": 0.3}).allocator_fragmentation_checkpointed == 0.3


def test_lora_dropout_range_checked():
    with pytest.raises(FtscopeError, match="lora_dropout"):
        _scn(mix={"method": "lora", "lora_dropout": 1.5})


@pytest.mark.parametrize("name", ["torchtune", "torchtune-0.1"])
def test_torchao_nf4_frameworks_refuse_qlora_without_nested_quantization(name):
    assert _scn(framework=name).mix.nested_quant is True
    with pytest.raises(FtscopeError, match="always quantizes its scales"):
        _scn(framework=name, mix={"method": "qlora", "nested_quant": False})
    # LoRA ignores the setting, and bitsandbytes frameworks run either way
    assert _scn(framework=name, mix={"method": "lora", "nested_quant": False}).mix.method == "lora"
    assert _scn(framework="axolotl", mix={"method": "qlora", "nested_quant": False}).mix.nested_quant is False
