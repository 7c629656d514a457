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
                                 dict(zero_stage=1, offload="optimizer")])
def test_deepspeed_accepts_the_json(tmp_path, mix):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    scn = _scn(**mix)
    paths = emit(scn, 4, tmp_path)
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
    compile((tmp_path / "train_args.py").read_text(), "train_args.py", "exec")


def test_emit_recommendation_writes_the_winner_and_the_best_zero_candidate(tmp_path):
    from dataclasses import replace

    from ftscope.plan.emit import emit_recommendation
    from ftscope.plan.recommend import best_deepspeed, recommend

    rec = recommend(_scn())
    assert rec.best is not None
    written = emit_recommendation(rec, tmp_path)
    ds = best_deepspeed(rec)
    top = {p.relative_to(tmp_path) for p in written if p.parent == tmp_path}
    assert {"accelerate.yaml", "train_args.py"} <= {str(p) for p in top}
    assert any(p.parent == tmp_path / "deepspeed" for p in written) == (ds is not None and ds is not rec.best)
    assert emit_recommendation(replace(rec, best=None), tmp_path / "none") == []
