"""emit: the configs recommend writes are accepted by the real DeepSpeed and accelerate parsers."""
from __future__ import annotations

import json

import pytest

import ftscope
from ftscope.plan.emit import accelerate_config, deepspeed_config, emit


def _scn(**mix):
    return ftscope.load_scenario({"model": "llama-2-7b", "hardware": {"gpu": "a100-80gb", "gpus_per_node": 8},
                                  "mix": {"method": "lora", **mix},
                                  "workload": {"micro_batch_size": 4, "seq_len": 2048, "gradient_accumulation": 2}})


@pytest.mark.parametrize("mix", [dict(zero_stage=2), dict(zero_stage=3), dict(zero_stage=3, offload="optimizer+params"),
                                 dict(zero_stage=1, offload="optimizer"), dict()])
def test_deepspeed_accepts_the_json(tmp_path, mix):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    scn = _scn(**mix)
    paths = emit(scn, 4, tmp_path, engine="deepspeed")  # no ZeRO stage: stage 0 under DeepSpeed
    ds = tmp_path / "ds_config.json"
    assert ds in paths
    cfg = DeepSpeedConfig(str(ds))
    assert cfg.zero_optimization_stage == scn.mix.zero_stage
    assert cfg.train_micro_batch_size_per_gpu == 4 and cfg.gradient_accumulation_steps == 2
    assert (json.loads(ds.read_text())["zero_optimization"].get("offload_param") is not None) == (scn.mix.offload == "optimizer+params")


@pytest.mark.parametrize("mix,kind", [(dict(zero_stage=2), "DEEPSPEED"), (dict(fsdp="full_shard"), "FSDP"), (dict(), "MULTI_GPU")])
def test_accelerate_accepts_the_yaml(tmp_path, mix, kind):
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file

    emit(_scn(**mix), 4, tmp_path)
    cfg = load_config_from_file(str(tmp_path / "accelerate.yaml"))
    assert str(cfg.distributed_type).endswith(kind)
    assert cfg.num_processes == 8


def test_no_deepspeed_json_without_zero():
    assert deepspeed_config(_scn(fsdp="full_shard"), 4) is None
    assert deepspeed_config(_scn(), 4) is None
    assert accelerate_config(_scn(fsdp="full_shard"), None)["fsdp_config"]["fsdp_reshard_after_forward"] is True


def test_training_snippet_is_valid_python(tmp_path):
    emit(_scn(method="qlora", zero_stage=3), 4, tmp_path)
    text = (tmp_path / "train_args.py").read_text()
    compile(text, "train_args.py", "exec")
    assert "bnb_4bit_use_double_quant=True" in text


def test_training_snippet_writes_the_scenarios_nested_quant(tmp_path):
    emit(_scn(method="qlora", nested_quant=False), 4, tmp_path)
    assert "bnb_4bit_use_double_quant=False" in (tmp_path / "train_args.py").read_text()


def _labelled(folder, files):
    """Every file says what it holds: a # header in YAML and Python, README.txt naming the JSON ones; none names
    the folder's absolute path (the folder can be moved or zipped)."""
    for p in files:
        text = p.read_text()
        assert str(folder) not in text and str(folder.resolve()) not in text, p
        if p.suffix in (".yaml", ".yml", ".py"):
            head = text.split("\n# Paths in these files")[0]
            assert head.startswith("# Written by ftscope") and all(f"\n# {k}: " in head for k in ("mix", "engine", "run", "why")), p
    for json_file in (p for p in files if p.suffix == ".json"):
        assert f"  {json_file.name}: " in (json_file.parent / "README.txt").read_text()


def test_emit_recommendation_labels_the_winner_and_the_deepspeed_alternative(tmp_path):
    """The DeepSpeed folder holds a different configuration than the winner: each file says so and how it differs."""
    from dataclasses import replace

    from ftscope.plan.emit import emit_recommendation
    from ftscope.plan.recommend import SearchSpace, recommend

    every = []
    rec = recommend(_scn(), gpus=["a100-80gb:8"], on_row=every.append, space=SearchSpace(
        methods=("lora", "qlora"), sharding=((0, "full_shard"), (3, None)), offload=("none",), attention=("sdpa",),
        optimizer=("adamw",)))
    at8 = [c for c in every if c.feasible and c.scenario.cluster.world_size == 8]
    fsdp = next(c for c in at8 if c.scenario.mix.fsdp and c.scenario.mix.method == "lora")
    zero = next(c for c in at8 if c.scenario.mix.zero_stage == 3 and c.scenario.mix.method == "qlora"
                and c.scenario.mix.gradient_checkpointing == fsdp.scenario.mix.gradient_checkpointing)
    rec = replace(rec, best=fsdp, best_deepspeed=zero)  # the case: QLoRA + ZeRO behind an FSDP LoRA winner
    written = emit_recommendation(rec, tmp_path)
    _labelled(tmp_path, written)
    assert {str(p.relative_to(tmp_path)) for p in written} >= {
        "accelerate.yaml", "train_args.py", "README.txt", "deepspeed/ds_config.json", "deepspeed/accelerate.yaml",
        "deepspeed/README.txt"}
    top = (tmp_path / "README.txt").read_text()
    assert "engine: FSDP full_shard" in top and "why: the winner by time" in top and "deepspeed/: the best DeepSpeed" in top
    alt = (tmp_path / "deepspeed" / "accelerate.yaml").read_text()
    assert "# engine: DeepSpeed ZeRO-3" in alt and f"# mix: {zero.scenario.mix.label()}" in alt
    assert (f"# why: best DeepSpeed alternative: {zero.scenario.mix.label()}, differs from the winner "
            f"({fsdp.scenario.mix.label()} on 8x a100-80gb) in method (QLoRA instead of LoRA), sharding (ZeRO-3 "
            "instead of FSDP full_shard);") in alt
    assert "deepspeed_config_file: ds_config.json" in alt  # relative to the folder, not an absolute path
    assert emit_recommendation(replace(rec, best=None), tmp_path / "none") == []


@pytest.mark.parametrize("engine,kind", [("deepspeed", "DEEPSPEED"), ("fsdp", "FSDP")])
def test_an_engine_restricted_search_emits_only_that_engine(tmp_path, engine, kind):
    """--engine deepspeed runs even an unsharded winner under DeepSpeed (ZeRO-0); no alternative folder either way."""
    from ftscope.plan.emit import emit_recommendation
    from ftscope.plan.recommend import SearchSpace, recommend

    scn = ftscope.load_scenario({"model": "llama-3.2-1b", "hardware": {"gpu": "a100-80gb"}, "mix": {"method": "lora"},
                                 "workload": {"micro_batch_size": 2, "seq_len": 1024}})
    rec = recommend(scn, space=SearchSpace(methods=("lora",), attention=("sdpa",)), engine=engine)
    written = emit_recommendation(rec, tmp_path)
    _labelled(tmp_path, written)
    assert not (tmp_path / "deepspeed").exists()
    acc = (tmp_path / "accelerate.yaml").read_text()
    assert f"distributed_type: {kind}" in acc and f"(--engine {engine})" in acc
    if engine == "deepspeed":
        assert rec.best.scenario.mix.zero_stage == 0  # one GPU, a 1B LoRA: nothing to shard, the simplest mix wins
        ds = json.loads((tmp_path / "ds_config.json").read_text())
        assert ds["zero_optimization"]["stage"] == 0 and "# engine: DeepSpeed ZeRO-0" in acc
