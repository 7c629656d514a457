"""A local checkpoint: the folder check's one-line errors and the Auto class a config loads with."""
from __future__ import annotations

import json

import pytest

from ftscope import FtscopeError, catalog
from ftscope.measure.runtime.checkpoint import auto_model_class, check_weights
from ftscope.measure.runtime.configs import shrink_config


def _folder(tmp_path, cfg: dict, weights: bool = True, config_text: str | None = None):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(config_text if config_text is not None else json.dumps(cfg))
    if weights:
        (folder / "model.safetensors").write_bytes(b"")
    return folder


def test_a_matching_folder_is_returned(tmp_path):
    cfg = catalog.model_config("llama-3.2-1b")
    folder = _folder(tmp_path, cfg)
    assert check_weights(folder, cfg, None, "cpu") == folder


@pytest.mark.parametrize("case, message", [
    ("no weights", r"no \*\.safetensors"), ("no config", "has no config.json"),
    ("malformed config", "is not valid JSON"), ("other model", "different model than the scenario's \\(hidden_size"),
])
def test_bad_folders_are_one_line_errors(tmp_path, case, message):
    cfg = catalog.model_config("llama-3.2-1b")
    theirs = {**cfg, "hidden_size": cfg["hidden_size"] * 2} if case == "other model" else cfg
    folder = _folder(tmp_path, theirs, weights=case != "no weights",
                     config_text="{not json" if case == "malformed config" else None)
    if case == "no config":
        (folder / "config.json").unlink()
    with pytest.raises(FtscopeError, match=message) as err:
        check_weights(folder, cfg, None, "cpu")
    assert "\n" not in str(err.value)


def test_weights_need_a_real_device_and_full_size(tmp_path):
    cfg = catalog.model_config("llama-3.2-1b")
    folder = _folder(tmp_path, cfg)
    with pytest.raises(FtscopeError, match="trace needs no weights"):
        check_weights(folder, cfg, None, "meta")
    with pytest.raises(FtscopeError, match="cannot be combined"):
        check_weights(folder, cfg, {"layers": 1}, "cpu")
    with pytest.raises(FtscopeError, match="is not a folder"):
        check_weights(tmp_path / "absent", cfg, None, "cpu")


transformers = pytest.importorskip("transformers")


def test_a_causal_lm_config_loads_as_one():
    hf_cfg = transformers.AutoConfig.for_model(**shrink_config(catalog.model_config("llama-3.2-1b"), layers=1, hidden=64))
    assert auto_model_class(transformers, hf_cfg, {}) is transformers.AutoModelForCausalLM


def test_mistral_3_loads_as_image_text_to_text_with_its_text_configs_tie():
    """AutoModelForCausalLM refuses Mistral3Config; the wrapper's own default would tie the head the checkpoint holds."""
    cfg = catalog.model_config("mistral-small-3.1-24b")
    assert "tie_word_embeddings" not in cfg
    hf_cfg = transformers.AutoConfig.for_model(**cfg)
    auto = auto_model_class(transformers, hf_cfg, cfg)
    assert auto is transformers.AutoModelForImageTextToText
    assert hf_cfg.tie_word_embeddings is hf_cfg.get_text_config().tie_word_embeddings is False
