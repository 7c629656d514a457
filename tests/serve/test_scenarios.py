"""The page's scenario: URL pairs parsed as CLI overrides, the models a web request may load, the YAML file."""
from __future__ import annotations

import pytest
import yaml

from ftscope.errors import FtscopeError
from ftscope.serve.scenarios import check_model_ref, from_query, resolve, scenario_yaml
from ftscope.serve.uploads import Uploads
from ftscope.spec.scenario import load_scenario


def test_query_pairs_are_typed_like_cli_overrides():
    raw = from_query([("model", "llama-3.2-1b"), ("hardware.gpus_per_node", "4"), ("mix.gradient_checkpointing", "true"),
                      ("mix.lora_targets", "[q_proj, v_proj]"), ("workload.micro_batch_size", "max"),
                      ("workload.epochs", "2.5"), ("workload.seq_len", "1024"), ("_view", "plan"), ("_errors", "inline")])
    assert raw == {"model": "llama-3.2-1b", "hardware": {"gpus_per_node": 4},
                   "mix": {"gradient_checkpointing": True, "lora_targets": ["q_proj", "v_proj"]},
                   "workload": {"micro_batch_size": "max", "epochs": 2.5, "seq_len": 1024}}
    assert load_scenario(raw).mix.lora_targets == ("q_proj", "v_proj")


@pytest.mark.parametrize("ref", ["/etc/passwd", "./examples/tiny-mixtral", "~/model", "x/config.json", "src",
                                 "a\\b", "", None, "examples/tiny-mixtral"])
def test_paths_on_the_server_are_refused(tmp_path, monkeypatch, ref):
    from .conftest import ROOT

    monkeypatch.chdir(ROOT)  # "examples/tiny-mixtral" exists here: still a path, not an HF id
    with pytest.raises(FtscopeError, match="paths on the server are for the CLI"):
        check_model_ref(ref, Uploads(tmp_path))


def test_presets_and_hf_ids_pass_through(tmp_path):
    up = Uploads(tmp_path)
    assert check_model_ref("mixtral-8x7b", up) == "mixtral-8x7b"
    assert check_model_ref("mistralai/Mixtral-8x7B-v0.1", up) == "mistralai/Mixtral-8x7B-v0.1"  # a preset alias
    assert check_model_ref("acme/not-cached", up) == "acme/not-cached"  # load_model says it is not in the cache
    with pytest.raises(FtscopeError, match="unknown model 'acme/not-cached'"):
        resolve({"model": "acme/not-cached", "workload": {"seq_len": 64}}, up)


def test_the_yaml_file_is_the_scenario():
    raw = {"model": "llama-3.2-1b", "mix": {"method": "qlora"}, "workload": {"seq_len": 512}}
    text = scenario_yaml(raw)
    assert text.startswith("# ftscope scenario") and yaml.safe_load(text) == raw
    uploaded = yaml.safe_load(scenario_yaml({**raw, "model": "upload:0123456789abcdef"}))
    assert uploaded["model"] == "config.json"
