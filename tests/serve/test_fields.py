"""A one-line error's field: carried by the error, named in the message, or told by its words."""
from __future__ import annotations

import pytest

from ftscope.errors import FtscopeError
from ftscope.serve.fields import error_body, field_of
from ftscope.spec.scenario import load_scenario

BASE = {"model": "llama-3.2-1b", "workload": {"micro_batch_size": 1, "seq_len": 256}}
CASES = [
    ({"model": "nope-7b"}, "model"),
    ({"hardware": {"gpu": "b100000"}}, "hardware.gpu"),
    ({"hardware": {"gpu": {"base": "a100-80gb", "memory_gib": -1}}}, "hardware.gpu.memory_gib"),
    ({"mix": {"precision": "int3"}}, "mix.precision"),
    ({"mix": {"offload": "optimizer+params", "zero_stage": 2}}, "mix.offload"),
    ({"mix": {"method": "qlora", "precision": "fp32"}}, "mix.precision"),
    ({"mix": {"fsdp": "full_shard", "zero_stage": 3}}, "mix.fsdp"),
    ({"mix": {"lora_targets": ["nothing_here"]}}, "mix.lora_targets"),
    ({"workload": {"seq_len": None}}, "workload.seq_len"),
    ({"workload": {"seq_len": 128, "padding": "tight"}}, "workload.padding"),
    ({"workload": {"seq_len": 128, "dataset": {"num_samples": 10, "mean_tokens": 900, "max_tokens": 100}}},
     "workload.dataset.mean_tokens"),
    ({"workload": {"seq_len": 128, "epoch": 2}}, "workload"),
    ({"modle": "x"}, None),
    ({"price": {"usd_per_gpu_hour": 0}}, "price.usd_per_gpu_hour"),
]


@pytest.mark.parametrize("change,field", CASES, ids=[str(f) for _, f in CASES])
def test_real_messages_map_to_their_field(change, field):
    raw = {**BASE, **change}
    with pytest.raises(FtscopeError) as exc:
        load_scenario(raw)
    assert field_of(exc.value) == field, str(exc.value)


def test_a_carried_field_wins_and_the_body_keeps_the_message():
    exc = FtscopeError("mix.method must be one of full, lora, qlora; got 'x'")
    exc.field = "mix.method_override"
    assert field_of(exc) == "mix.method_override"
    assert error_body(FtscopeError("something else entirely")) == {"error": "something else entirely", "field": None}
