"""ranking: rounding that makes noise-level differences tie, and is monotone (the search's stop rule needs it)."""
from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from ftscope.plan.ranking import mix_complexity, refusal, tie
from ftscope.spec.mix import Mix
from ftscope.spec.resolve import load_model

finite = st.floats(min_value=1e-9, max_value=1e12, allow_nan=False)


@given(finite, finite)
def test_tie_is_monotone(x, y):
    lo, hi = sorted((x, y))
    assert tie(lo) <= tie(hi)


def test_tie_rounds_to_three_significant_digits_and_keeps_infinity():
    assert tie(2.3449) == 2.34 and tie(2.3451) == 2.35 and tie(9996.0) == 10000.0
    assert tie(math.inf) == math.inf


def test_simpler_mixes_have_lower_complexity():
    plain = Mix(method="lora", attention="sdpa")
    assert mix_complexity(plain) == 0
    assert mix_complexity(Mix(method="qlora", attention="flash", zero_stage=3, offload="optimizer",
                              gradient_checkpointing=True)) == 1 + 1 + 3 + 2 + 1


def test_refusal_reads_only_the_model_and_the_mix():
    moe = load_model("mixtral-8x7b")
    assert refusal(moe, Mix(offload="optimizer")).startswith("unsupported: offload: optimizer needs")
    assert refusal(moe, Mix(experts_backend="grouped_mm", precision="fp16-mixed")) == "unsupported: experts_backend grouped_mm runs in bf16 only; use batched_mm or eager with fp16/fp32"
    assert refusal(load_model("llama-2-7b"), Mix(experts_backend="grouped_mm", precision="fp16-mixed")) is None
