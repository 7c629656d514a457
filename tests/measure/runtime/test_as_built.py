"""The scenario as a run built it, and the estimate beside a measured point (measure/runtime/as_built.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

import ftscope
from ftscope import FtscopeError, catalog
from ftscope.measure.runtime import as_built
from ftscope.measure.runtime.configs import shrink_config

ROOT = Path(__file__).resolve().parents[3]


def test_built_scenario_takes_the_built_model_and_clamps_top_k():
    scn = ftscope.load_scenario(ROOT / "examples" / "tiny-mixtral.yaml").with_(experts_top_k=4)
    config = shrink_config(catalog.model_config("mixtral-8x7b"), layers=1, hidden=64, experts=2, vocab=128)
    built = as_built.built_scenario(scn, config, batch=3)
    assert built.model.name.endswith("(as built)") and built.model.num_layers == 1
    assert built.model.arch.num_experts == 2 and built.mix.experts_top_k == 2
    assert built.workload.micro_batch_size == 3
    assert as_built.built_scenario(scn, config).workload.micro_batch_size == scn.workload.micro_batch_size


def test_estimate_beside_gives_none_only_for_a_refused_scenario(monkeypatch):
    scn = ftscope.load_scenario(ROOT / "examples" / "tiny-mixtral.yaml")
    assert as_built.estimate_beside(scn).memory.peak_bytes > 0

    def refuse(*_a, **_k):
        raise FtscopeError("refused")

    monkeypatch.setattr(as_built, "estimate", refuse)
    assert as_built.estimate_beside(scn) is None

    def crash(*_a, **_k):
        raise ZeroDivisionError

    monkeypatch.setattr(as_built, "estimate", crash)
    with pytest.raises(ZeroDivisionError):  # a bug is not hidden as "no estimate"
        as_built.estimate_beside(scn)
