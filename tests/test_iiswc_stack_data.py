"""The committed measurements of benchmarks/iiswc_stack/measure_per_token.py: shape, coverage, and the one
physical claim FINDINGS.md rests on (bitsandbytes 0.42's ctx.tensors hold exactly the 4-bit linears' inputs
that need grad; no other setting holds them)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

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
