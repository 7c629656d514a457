"""Corpus models (validate/corpus/models.py): presets by name, MPT built from the source's fields."""
from __future__ import annotations

import pytest

from ftscope.spec.resolve import model_from_config
from ftscope.validate.corpus import load_corpus
from ftscope.validate.corpus.models import mpt_config, preset


def test_preset_resolves_names_aliases_and_same_architectures():
    assert preset("meta-llama/Llama-2-7b-hf") == ("llama-2-7b", "")
    assert preset("Qwen/Qwen3-30B-A3B")[0] == "qwen3-30b-a3b"
    name, note = preset("meta-llama/Meta-Llama-3-8B")
    assert name == "llama-3.1-8b" and "llama-3.1-8b" in note
    assert preset("mistralai/Mistral-7B-v0.2 (base, 32k)")[0] == "mistral-7b"
    assert preset("bigscience/T0_3B") == (None, "")


@pytest.fixture(scope="module")
def foundry():
    return next(s for s in load_corpus() if s.id == "llm-foundry-mpt-benchmarks")


def test_mpt_configs_build_the_parameters_llm_foundry_counts(foundry):
    """NumParams in the tables = the blocks + embeddings + a learned position table of seq_len rows, which
    ftscope leaves out (not a matmul): every other parameter is counted exactly."""
    seen = set()
    for p in foundry.points:
        key = (p["model"], p["seq_len"])
        if key in seen:
            continue
        seen.add(key)
        fields = foundry.meta["models"][p["model"]]
        spec = model_from_config(mpt_config(fields, p["seq_len"]))
        assert spec.total_params + p["seq_len"] * fields["d_model"] == p["num_params"], key
    assert len(seen) > 20
