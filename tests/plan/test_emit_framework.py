"""Recommendations written in a framework's own format read back as the same scenario, over the user's config."""
from pathlib import Path

import pytest
import yaml

import ftscope
from ftscope.plan.emit import emit
from ftscope.plan.emit_framework import FILES, emit_framework
from ftscope.spec.frameworks import read_config, scenario_mapping

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "frameworks"
MIXES = [dict(method="qlora", lora_rank=32, gradient_checkpointing=True, attention="flash"),
         dict(method="lora", lora_targets=["q_proj", "v_proj"], zero_stage=3, optimizer="adamw_8bit"),
         dict(method="full", fsdp="full_shard", offload="optimizer+params", attention="eager"),
         dict(method="qlora", nested_quant=False, attention="sdpa")]


def _scn(mix, framework="hf-trainer"):
    return ftscope.load_scenario({"model": "llama-3.1-8b", "framework": framework,
                                  "hardware": {"gpu": "h100-80gb", "gpus_per_node": 4 if mix.get("zero_stage") or mix.get("fsdp") else 1},
                                  "mix": mix, "workload": {"micro_batch_size": 2, "seq_len": 2048, "padding": "packed",
                                                           "gradient_accumulation": 4, "epochs": 2}})


KEYS = ("method", "lora_rank", "gradient_checkpointing", "optimizer", "zero_stage", "fsdp", "offload", "nested_quant")


@pytest.mark.parametrize("fmt", ["axolotl", "llama-factory", "trl", "torchtune"])
@pytest.mark.parametrize("mix", MIXES)
def test_written_config_reads_back_as_the_scenario(tmp_path, fmt, mix):
    if fmt == "torchtune":
        mix = {**mix, "precision": "bf16", "zero_stage": 0, "fsdp": "full_shard" if mix.get("zero_stage") else mix.get("fsdp")}
    scn = _scn(mix)
    emit(scn, 2, tmp_path)  # the ds_config.json a DeepSpeed mix points at
    path = emit_framework(scn, 2, tmp_path, fmt)
    assert path.name == FILES[fmt] and path.read_text().startswith("# Written by ftscope")
    back = ftscope.load_scenario(scenario_mapping(read_config(path), ["hardware.gpu=h100-80gb",
                                                                      f"hardware.gpus_per_node={scn.cluster.gpus_per_node}"]))
    for key in KEYS:
        if (fmt == "torchtune" and key in ("zero_stage", "nested_quant")) or (key == "lora_rank" and not scn.mix.trains_lora):
            continue  # torchtune's torchao NF4 always double-quantizes (a note says so)
        if key == "nested_quant" and scn.mix.method != "qlora":
            continue  # a 16-bit base has no quantization state
        assert getattr(back.mix, key) == getattr(scn.mix, key), key
    if scn.mix.trains_lora:  # the same weights adapted, whatever they are called
        assert back.model.lora_params(1, back.mix.lora_targets) == scn.model.lora_params(1, scn.mix.lora_targets)
    if fmt != "torchtune":  # torchtune has no attention switch
        assert back.mix.attention == scn.mix.attention
    assert (back.workload.seq_len, back.workload.padding, back.workload.micro_batch_size,
            back.workload.gradient_accumulation, back.workload.epochs) == (2048, "packed", 2, 4, 2)


def test_the_users_own_keys_survive(tmp_path):
    cfg = read_config(EXAMPLES / "axolotl-llama-3-qlora.yml")
    path = emit_framework(_scn(MIXES[1]), 2, tmp_path, "axolotl", cfg.original)
    out = yaml.safe_load(path.read_text())
    assert out["base_model"] == "NousResearch/Meta-Llama-3-8B" and out["datasets"] == cfg.original["datasets"]
    assert out["deepspeed"] == "ds_config.json" and out["optimizer"] == "adamw_bnb_8bit"
    assert "flash_attention" not in out and out["adapter"] == "lora" and out["lora_target_modules"] == ["q_proj", "v_proj"]


def test_torchtune_needs_a_builder(tmp_path):
    scn = ftscope.load_scenario({"model": "mixtral-8x7b", "workload": {"micro_batch_size": 1, "seq_len": 512}})
    with pytest.raises(ftscope.FtscopeError, match="torchtune has no model builder"):
        emit_framework(scn, 1, tmp_path, "torchtune")


@pytest.mark.parametrize("fmt", ["axolotl", "trl", "torchtune"])
def test_emit_with_framework_labels_its_config_and_names_deepspeed_relatively(tmp_path, fmt):
    """--engine deepspeed on one GPU: the unsharded winner runs under DeepSpeed ZeRO-0, and the framework config says
    so, names the ds_config.json beside it by a relative path and reads back as the same mix."""
    from ftscope.plan.emit_framework import emit_with_framework
    from ftscope.plan.recommend import SearchSpace, recommend

    scn = _scn(dict(method="lora"))
    rec = recommend(scn, space=SearchSpace(methods=("lora",), attention=("sdpa",), offload=("none",)), engine="deepspeed")
    written = emit_with_framework(rec, tmp_path, fmt)
    path = tmp_path / FILES[fmt]
    assert path in written and not (tmp_path / "deepspeed").exists()
    assert all(str(tmp_path) not in p.read_text() for p in written)
    text = path.read_text()
    assert "# why: the winner by time" in text and "(--engine deepspeed)" in text and "\n# Launch: " in text
    assert f"  {FILES[fmt]}: a framework config" in (tmp_path / "README.txt").read_text()
    if fmt == "torchtune":
        assert "# Note: torchtune has no DeepSpeed" in text
    else:
        assert "# engine: DeepSpeed ZeRO-0" in text and yaml.safe_load(text)["deepspeed"] == "ds_config.json"
        back = ftscope.load_scenario(scenario_mapping(read_config(path), ["hardware.gpu=h100-80gb"]))
        assert (back.mix.zero_stage, back.mix.fsdp) == (0, None) == (rec.best.scenario.mix.zero_stage, rec.best.scenario.mix.fsdp)
