"""held_peak: a one-stream memory model's peak bytes, reserved totals and breakdown peak, summed from its fields,
equal MemoryModel.peak_bytes, reserved_totals and _reserved_of's totals over _points exactly (==, NaN and the sign
of zero included), on real models and on seeded random ones that reach every branch of _points: checkpointing,
activation offload, eager attention's quadratic terms, a fused loss's tile, a frozen, trained, chunked or tied LM
head, fragmentation above and below the pinned share, floors and the other stream's pool.
"""
from __future__ import annotations

import math
import random
from dataclasses import fields

import pytest

import ftscope
from ftscope.estimate.activations import ActivationCoefficients
from ftscope.estimate.allocator_model import AllocatorModel
from ftscope.estimate.head_gradient import HeadGradient
from ftscope.estimate.held_peak import acts_at, held_terms, model_terms, peak_at, top_at, totals_at
from ftscope.estimate.memory import MemoryModel, memory_model
from ftscope.spec.scenario import fast_replace


def _same(a, b) -> bool:
    """a == b as floats, bit for bit (NaN equals NaN; 0.0 and -0.0 differ)."""
    return repr(a) == repr(b)


def _scenario(model: str, mix: dict, gpus: int = 1):
    return ftscope.load_scenario({"model": model, "hardware": {"gpu": "h100-80gb", "gpus_per_node": gpus},
                                  "mix": {"attention": "sdpa", **mix},
                                  "workload": {"micro_batch_size": 1, "seq_len": 1024}})


REAL = [("llama-3.2-1b", {"method": "full"}), ("llama-3.2-1b", {"method": "full", "loss": "chunked"}),
        ("llama-3.2-1b", {"method": "lora", "gradient_checkpointing": True, "attention": "eager"}),
        ("llama-2-7b", {"method": "full", "zero_stage": 2, "activation_offload": True,
                        "gradient_checkpointing": True}),
        ("llama-2-7b", {"method": "qlora", "loss": "fused"}), ("mixtral-8x7b", {"method": "qlora"}),
        ("llama-3.2-1b", {"method": "full", "fsdp": "full_shard"})]


def _value(rng: random.Random, scale: float) -> float:
    r = rng.random()
    if r < 0.02:
        return rng.choice((0.0, -0.0, math.inf, math.nan))
    if r < 0.25:
        return 0.0
    return rng.uniform(0.0, scale) * rng.choice((1.0, 1.0, 1.0, 1e-3, 7.3))


def _random_model(rng: random.Random, base: MemoryModel) -> MemoryModel:
    acts = ActivationCoefficients(**{f.name: _value(rng, 4e5) for f in fields(ActivationCoefficients)})
    acts = fast_replace(acts, loss_tile_tokens=rng.choice((0.0, 1.0, 4096.0, 8192.0, rng.uniform(1, 3e4))))
    weight = rng.choice((0.0, 0.0, _value(rng, 3e9)))
    head = HeadGradient(weight, rng.choice((1, 1, 2, 3, 8)), _value(rng, 3e5), _value(rng, 3e9), _value(rng, 3e9),
                        rng.choice((0.0, _value(rng, 3e9))))
    allocator = AllocatorModel(workspace_gib=rng.uniform(0, 1), fragmentation=rng.uniform(0, 0.5),
                               fragmentation_checkpointed=rng.uniform(0, 0.6), pinned=rng.uniform(0, 0.5))
    floats = {name: _value(rng, 4e10) for name in (
        "weights", "gradients", "gradients_in_forward", "optimizer", "optimizer_transient", "weight_transient",
        "block_transient", "reserved_floor", "small_pool_step", "stream_pool")}
    return fast_replace(base, acts=acts, head_grad=head, allocator=allocator, checkpointing=rng.random() < 0.5,
                        offload_activations=rng.random() < 0.3, **floats)


def _models() -> list[MemoryModel]:
    real = [memory_model(_scenario(m, mix, 4 if "fsdp" in mix or "zero_stage" in mix else 1)) for m, mix in REAL]
    rng = random.Random(21)
    return real + [_random_model(rng, real[rng.randrange(len(real))]) for _ in range(400)]


@pytest.fixture(scope="module")
def models():
    return _models()


def _batches(rng: random.Random) -> list:
    return [0, 1, 2, 3, 7, 64, 65_536, rng.randrange(1, 200), rng.randrange(1, 131_072), rng.uniform(0, 50)]


def test_the_random_models_reach_every_branch(models):
    one_stream = [m for m in models if held_terms(m) is not None]
    assert len(one_stream) > 300
    assert {m.checkpointing for m in one_stream} == {True, False}
    assert {m.offload_activations for m in one_stream} == {True, False}
    heads = {(bool(m.head_grad.weight), m.head_grad.chunks > 1, bool(m.head_grad.at_embedding)) for m in one_stream}
    assert len(heads) >= 5
    assert any(m.allocator.pinned < m.allocator.fragmentation for m in one_stream)
    assert any(m.allocator.pinned > m.allocator.fragmentation for m in one_stream)


@pytest.mark.parametrize("seq", [0, 1, 2, 512, 1024, 2048.0, 8191.5])
def test_peak_at_and_totals_at_are_peak_bytes_and_reserved_totals(models, seq):
    rng = random.Random(seq)
    for m in models:
        c = model_terms(m)
        if held_terms(m) is None:  # another stream holds memory: left to _reserved_of
            assert c is None
            continue
        for b in _batches(rng):
            assert _same(peak_at(c, acts_at(c, b, seq), m.least_reserved), m.peak_bytes(b, seq)), (m, b)
            assert [repr(x) for x in totals_at(c, b, seq)] == [repr(x) for x in m.reserved_totals(b, seq)], (m, b)


@pytest.mark.parametrize("seq", [1, 512, 1024, 2048.0, 8191.5])
def test_top_at_is_the_first_of_the_largest_totals(models, seq):
    """top_at: _reserved_of's largest total over _points (max, then the first point that holds it) and that
    point's (gradients, activations, temporary, allocated)."""
    rng = random.Random(seq)
    for m in (m for m in models if held_terms(m) is not None):
        c = model_terms(m)
        for b in _batches(rng):
            phases = m._points(b, seq)
            totals = m._reserved_of(phases)
            i = max(range(len(phases)), key=totals.__getitem__)
            want = (totals[i], *phases[i][1:])
            got = top_at(c, acts_at(c, b, seq))
            assert len(got) == 5 and all(_same(x, y) for x, y in zip(got, want)), (m, b, got, want)
