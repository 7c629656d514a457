"""Shared fixtures: a small valid scenario mapping that tests modify one key at a time. Hypothesis keeps no
example database (it would write .hypothesis/ into the checkout)."""
from __future__ import annotations

import copy

import pytest
from hypothesis import settings

settings.register_profile("ftscope", database=None)
settings.load_profile("ftscope")

BASE_SCENARIO = {
    "model": "llama-2-7b",
    "hardware": {"gpu": "a100-80gb", "gpus_per_node": 1},
    "mix": {"method": "lora", "lora_rank": 16, "lora_targets": "all-linear"},
    "workload": {"micro_batch_size": 2, "seq_len": 512},
}


@pytest.fixture
def scenario_dict() -> dict:
    """A fresh deep copy of a valid scenario (Llama-2-7B LoRA on one A100-80GB)."""
    return copy.deepcopy(BASE_SCENARIO)
