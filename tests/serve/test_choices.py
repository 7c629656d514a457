"""Each control offers exactly the values the CLI's checks accept, read from the same tuples (or Literal types)."""
from __future__ import annotations

from typing import Literal, Optional

import pytest

from ftscope import catalog
from ftscope.errors import FtscopeError
from ftscope.spec.mix import Mix
from ftscope.spec.schema import choices
from ftscope.spec.scenario import load_scenario
from ftscope.serve.choices import allowed, cached_models, mix_choices, page_choices

BASE = {"model": "mixtral-8x7b", "hardware": {"gpu": "h100-80gb"}, "workload": {"micro_batch_size": 1, "seq_len": 256}}


def test_allowed_reads_tuples_and_literals():
    assert allowed(("a", "b")) == ["a", "b"]
    assert allowed(Literal["x", "y"]) == ["x", "y"]
    assert allowed(Optional[Literal["full_shard", "shard_grad_op"]]) == ["full_shard", "shard_grad_op", None]
    with pytest.raises(TypeError):
        allowed(42)


def test_mix_choices_are_the_mix_field_types():
    c = mix_choices()
    assert c["method"] == list(choices(Mix, "method")) == ["full", "lora", "qlora"]
    assert c["optimizer"] == list(choices(Mix, "optimizer")) and c["zero_stage"] == [0, 1, 2, 3]
    assert c["fsdp"] == [None, "full_shard", "shard_grad_op"]
    assert c["experts_backend"] == list(choices(Mix, "experts_backend"))


@pytest.mark.parametrize("key", sorted(mix_choices()))
def test_every_offered_value_passes_the_cli_check(key):
    for value in mix_choices()[key]:
        try:
            load_scenario({**BASE, "mix": {key: value}})
        except FtscopeError as exc:  # a combination may be refused; the value itself never
            assert f"mix.{key} must be" not in str(exc), (key, value, str(exc))


def test_gpus_and_models_are_the_catalog():
    data = page_choices()
    assert [g["key"] for g in data["gpus"]] == list(catalog.gpu_table())
    assert [m["name"] for m in data["models"]] == list(catalog.model_index())
    assert {m["name"]: m["moe"] for m in data["models"]}["mixtral-8x7b"] is True
    assert data["workload"]["padding"] == ["dynamic", "max_length", "packed"]


def test_cached_models_lists_hf_ids_that_load(tmp_path, monkeypatch):
    from ftscope.serve.app import create_app  # noqa: F401  (the serve extra is installed)
    from .conftest import ROOT

    snap = tmp_path / "hub" / "models--acme--tiny-moe" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text((ROOT / "examples" / "tiny-mixtral" / "config.json").read_text())
    (tmp_path / "hub" / "models--acme--empty" / "snapshots").mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert cached_models() == ["acme/tiny-moe"]
    assert load_scenario({**BASE, "model": "acme/tiny-moe"}).model.is_moe
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "none"))
    assert cached_models() == []
