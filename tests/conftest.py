"""Shared fixtures (a small valid scenario mapping that tests modify one key at a time) and the hypothesis profiles.

Property tests cannot flake: the default profile ("ci") is derandomized (examples derived from each test, the
same on every run) and keeps no example database between runs. `make fuzz` selects the "fuzz" profile instead
(HYPOTHESIS_PROFILE=fuzz): fresh random examples on every run, run in rounds for a long hunt.
"""
from __future__ import annotations

import copy
import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("fuzz", derandomize=False, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# GNU readline, imported by pytest's machinery, writes COLUMNS=80 and LINES into the C environment (not into
# os.environ); every `ftscope` subprocess would inherit them and, since ftscope honours COLUMNS when piped, print
# 80-column tables. Tests run ftscope as a user's pipe does (COLUMNS unset) unless they set COLUMNS themselves.
for _name in ("COLUMNS", "LINES"):
    if _name not in os.environ:
        os.unsetenv(_name)

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
