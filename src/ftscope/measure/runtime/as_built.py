"""The scenario as a run built it, and ftscope's estimate beside a measured point.

A measurement runs the model transformers built (often a `--shrink`-ed copy), so the estimate that sits beside
it must be for that model: `built_scenario` swaps the scenario's model for the built config (profile, the
distributed worker and launcher, and validate's profile-store checks all use it). `estimate_beside` is the
estimate as context: an unsupported combination gives None, never a lost measurement.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...errors import FtscopeError
from ...estimate import estimate
from ...estimate.result import Estimate
from ...spec.resolve import model_from_config
from ...spec.scenario import Scenario


def built_scenario(scn: Scenario, config: dict[str, Any], batch: int | None = None) -> Scenario:
    """The scenario with the model as actually built (from its HF config), at micro-batch `batch` if given.
    A top-k above the built model's experts (a shrunk copy) becomes all of them, as the build does."""
    model = model_from_config(config, name=f"{scn.model.name} (as built)")
    mix = scn.mix
    if model.is_moe and mix.experts_top_k and mix.experts_top_k > model.arch.num_experts:
        mix = replace(mix, experts_top_k=model.arch.num_experts)
    built = replace(scn, model=model, mix=mix)
    return built if batch is None else built.with_(micro_batch_size=batch)


def estimate_beside(scn: Scenario) -> Estimate | None:
    """ftscope's estimate of the scenario (strict=False), or None when the estimator refuses it."""
    try:
        return estimate(scn, strict=False)
    except FtscopeError:
        return None
