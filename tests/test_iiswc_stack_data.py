"""The committed measurements of benchmarks/iiswc_stack/measure_per_token.py: shape, coverage, and the one
physical claim FINDINGS.md rests on (bitsandbytes 0.42's ctx.tensors hold exactly the 4-bit linears' inputs
that need grad; no other setting holds them)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ftscope import catalog
from ftscope.estimate.activations import activation_coefficients
from ftscope.measure.runtime.configs import shrink_config
from ftscope.spec.mix import Mix
from ftscope.spec.resolve import model_from_config
from ftscope.spec.recipe import load_recipe

DATA = Path(__file__).resolve().parent.parent / "data" / "iiswc-stack" / "per-token-bytes.json"
RUN_KEYS = {"stack", "variant", "layers", "hidden", "intermediate", "experts", "top_k", "vocab", "batch", "seq",
            "tokens", "forward_end_bytes_per_token", "backward_peak_bytes_per_token", "terms_bytes_per_token",
            "groups"}


@pytest.fixture(scope="module")
def doc() -> dict:
    return json.loads(DATA.read_text())


def _bnb_formula(r: dict) -> float:
    """FINDINGS.md's term for the shrunk Mixtral (o_proj input = hidden there): bf16, LoRA on experts + gate."""
    h, i, k, n = r["hidden"], r["intermediate"], r["top_k"], r["layers"]
    return 2 * (k * i + (n - 1) * (3 * h + k * (h + i)))


def test_versions_name_both_stacks(doc):
    assert doc["versions"]["2024"]["transformers"] == "4.40.0"
    assert doc["versions"]["2024"]["bitsandbytes"] == "0.42.0"
    assert doc["versions"]["2024"]["peft"] == "0.7.1"
    assert doc["versions"]["today"]["transformers"].split(".")[0] == "5"


def test_every_run_has_the_fields_and_positive_bytes(doc):
    assert doc["runs"]
    for r in doc["runs"]:
        assert RUN_KEYS <= set(r)
        assert r["tokens"] == r["batch"] * r["seq"]
        assert r["experts"] == 8 and r["top_k"] in (2, 8)
        assert 0 < r["forward_end_bytes_per_token"] <= r["backward_peak_bytes_per_token"]
        assert all(g["bytes_per_token"] > 0 for g in r["groups"])


def test_the_study_path_varies_layers_hidden_top_k_and_seq(doc):
    study = [r for r in doc["runs"] if r["variant"] == "study"]
    for key in ("layers", "hidden", "top_k", "seq"):
        assert len({r[key] for r in study}) >= 2, key


def test_bnb_ctx_bytes_follow_the_formula_and_only_under_bnb_042_nonreentrant(doc):
    for r in doc["runs"]:
        held = r["terms_bytes_per_token"].get("bnb_ctx_inputs", 0.0)
        if r["variant"] in ("study", "study-no-aux-loss"):
            assert held == pytest.approx(_bnb_formula(r), rel=1e-3), r["variant"]
        else:  # reentrant checkpointing, bf16 LoRA, or today's bitsandbytes: nothing kept on ctx
            assert held == 0.0, r["variant"]


def _estimator_inputs(r: dict):
    """The run's shrunk Mixtral as a ModelSpec, and the mix and recipe of its stack and variant."""
    cfg = shrink_config(catalog.model_config("mixtral-8x7b"), layers=r["layers"], hidden=r["hidden"], vocab=r["vocab"])
    cfg["num_experts_per_tok"] = r["top_k"]
    model = model_from_config(cfg, "mixtral-shrunk")
    assert (model.arch.hidden_size, model.arch.moe_intermediate_size) == (r["hidden"], r["intermediate"])
    recipe = load_recipe("llama-factory-2024" if r["stack"] == "2024" else "hf-trainer")
    if r["variant"] == "study-reentrant":
        recipe = dataclasses.replace(recipe, checkpoint_impl="reentrant")
    mix = Mix(method="lora" if r["variant"].endswith("bf16-lora") else "qlora", lora_rank=16,
              lora_targets=("w1", "w2", "w3", "gate"), gradient_checkpointing=True, attention="flash",
              experts_backend="modules" if r["stack"] == "2024" else "grouped_mm")
    return model, mix, recipe


def test_the_estimators_term_is_the_measured_bytes(doc):
    """At every measured shape and setting, the estimator's held 4-bit inputs are the bytes bitsandbytes kept, and
    its checkpointed bytes per token are those plus the measured layer inputs."""
    for r in doc["runs"]:
        model, mix, recipe = _estimator_inputs(r)
        acts = activation_coefficients(model, mix, r["top_k"], recipe)
        terms = r["terms_bytes_per_token"]
        assert acts.kbit_inputs_per_token == terms.get("bnb_ctx_inputs", 0.0), r["variant"]
        assert acts.checkpoint_per_token == terms.get("bnb_ctx_inputs", 0.0) + terms["checkpoint_layer_inputs"]
