"""Solvers (estimate/solvers.py): the largest micro-batch / sequence length that fits, checked on both sides
against the memory model itself."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

import ftscope
from ftscope.estimate.memory import memory_model
from ftscope.estimate.solvers import BATCH_CAP, SEQ_CAP, BatchSolver, max_micro_batch, max_seq_len


def scn(model="llama-3.2-1b", gpu="a100-80gb", mix=None, wl=None, hw=None):
    d = {"model": model, "hardware": {"gpu": gpu, **(hw or {})}, "mix": {"attention": "flash", **(mix or {})},
         "workload": {"micro_batch_size": 1, "seq_len": 1024, **(wl or {})}}
    return ftscope.load_scenario(d)


CASES = [
    dict(model="llama-2-7b", mix={"method": "lora"}),
    dict(model="llama-2-7b", mix={"method": "qlora", "attention": "eager"}),
    dict(model="llama-3.2-1b", mix={"method": "full", "gradient_checkpointing": True}),
    dict(model="llama-3.2-1b", mix={"method": "full", "zero_stage": 3}, hw={"gpus_per_node": 8}),
    # the IISWC stack (transformers 4.x per-expert modules, which bitsandbytes quantizes)
    dict(model="mixtral-8x7b", gpu="a40", mix={"method": "qlora", "experts_top_k": 2, "gradient_checkpointing": True,
                                               "experts_backend": "modules"}),
    dict(model="mixtral-8x7b", gpu="a40", mix={"method": "qlora", "experts_top_k": 8, "experts_backend": "modules"}),
    dict(model="blackmamba-2.8b", gpu="a40", mix={"method": "full", "precision": "bf16"}),
    dict(model="llama-3.1-8b", gpu="rtx-4090", mix={"method": "qlora", "loss": "chunked"}),
]


def brute_force_largest(fits, cap):
    n = 0
    while n < cap and fits(n + 1):
        n += 1
    return n


@pytest.mark.parametrize("kw", CASES)
@pytest.mark.parametrize("seq", [128, 1024, 4096])
def test_max_micro_batch_is_the_boundary(kw, seq):
    m = memory_model(scn(**kw))
    b = max_micro_batch(m, seq)
    if seq == 128:
        assert b >= 1, "every case here fits a short sample"
    assert b == 0 or m.fits(b, seq)
    assert not m.fits(b + 1, seq)


@pytest.mark.parametrize("kw", CASES)
@pytest.mark.parametrize("batch", [1, 4])
def test_max_seq_len_is_the_boundary(kw, batch):
    m = memory_model(scn(**kw))
    s = max_seq_len(m, batch)
    assert s >= 1
    assert m.fits(batch, s)
    assert not m.fits(batch, s + 1)


@pytest.mark.parametrize("kw", CASES[:4])
def test_max_micro_batch_equals_a_linear_scan(kw):
    m = memory_model(scn(**kw))
    assert max_micro_batch(m, 2048) == brute_force_largest(lambda b: m.fits(b, 2048), BATCH_CAP)


@settings(max_examples=40, deadline=None)
@given(kw=st.sampled_from(CASES), seq=st.integers(1, 16384), batch=st.integers(1, 64),
       margin=st.floats(0.0, 0.6))
def test_solvers_boundary_with_margin(kw, seq, batch, margin):
    m = memory_model(scn(**kw))
    b = max_micro_batch(m, seq, margin)
    assert b == 0 or m.fits(b, seq, margin)
    assert b == BATCH_CAP or not m.fits(b + 1, seq, margin)
    s = max_seq_len(m, batch, margin)
    assert s == 0 or m.fits(batch, s, margin)
    assert s == SEQ_CAP or not m.fits(batch, s + 1, margin)


def test_margin_never_raises_the_limit():
    m = memory_model(scn("llama-2-7b", mix={"method": "lora"}))
    limits = [max_micro_batch(m, 1024, x) for x in (0.0, 0.05, 0.1, 0.3, 0.5)]
    assert all(b <= a for a, b in zip(limits, limits[1:]))
    assert limits[-1] < limits[0]


def test_limits_fall_as_the_other_dimension_grows():
    m = memory_model(scn("llama-2-7b", mix={"method": "lora", "attention": "eager"}))
    batches = [max_micro_batch(m, s) for s in (256, 512, 1024, 2048)]
    assert all(b <= a for a, b in zip(batches, batches[1:])) and batches[-1] < batches[0]
    seqs = [max_seq_len(m, b) for b in (1, 2, 4, 8)]
    assert all(b <= a for a, b in zip(seqs, seqs[1:])) and seqs[-1] < seqs[0]


def test_nothing_fits_gives_zero():
    m = memory_model(scn("llama-2-70b", "l4", mix={"method": "full"}))
    assert not m.fits(1, 1)
    assert max_micro_batch(m, 512) == 0
    assert max_seq_len(m, 1) == 0
    e = ftscope.estimate(scn("llama-2-70b", "l4", mix={"method": "full"}, wl={"micro_batch_size": "max"}))
    assert e.max_micro_batch_size == 0 and e.max_seq_len == 0 and not e.fits


def test_tiny_model_on_huge_gpu_hits_the_cap():
    m = memory_model(scn("llama-3.2-1b", "b200", mix={"method": "qlora", "gradient_checkpointing": True}))
    assert max_micro_batch(m, 1, cap=64) == 64
    assert max_seq_len(m, 1, cap=100) == 100


def test_workload_max_uses_the_solved_batch():
    s = scn("llama-2-7b", mix={"method": "lora"}, wl={"micro_batch_size": "max", "seq_len": 1024})
    e = ftscope.estimate(s)
    m = memory_model(s)
    assert e.micro_batch_size == e.max_micro_batch_size == max_micro_batch(m, 1024)
    assert e.fits
    fixed = ftscope.estimate(s.with_(micro_batch_size=e.micro_batch_size))
    assert fixed.memory.peak_bytes == e.memory.peak_bytes
    assert not ftscope.estimate(s.with_(micro_batch_size=e.micro_batch_size + 1)).fits


def test_solved_batch_uses_dynamic_padding_peak_length():
    ds = {"num_samples": 1000, "mean_tokens": 187, "median_tokens": 174, "p99_tokens": 411, "max_tokens": 700}
    s = scn("llama-2-7b", mix={"method": "lora"}, wl={"micro_batch_size": "max", "seq_len": 1024, "dataset": ds})
    e = ftscope.estimate(s)
    assert e.seq_len == 700
    assert e.max_micro_batch_size == max_micro_batch(memory_model(s), 700)


def test_an_init_floor_above_the_card_gives_zero_at_once():
    """torchtune 0.1's QLoRA init reserves weights + 68 B per weight of the largest matrix: on a 6 GiB card a 7B
    step would fit but its init does not: the solvers answer 0."""
    d = {"model": "llama-2-7b", "framework": "torchtune-0.1", "hardware": {"gpu": {"base": "t4", "memory_gib": 6}},
         "mix": {"method": "qlora", "lora_targets": "all-linear"}, "workload": {"micro_batch_size": 1, "seq_len": 8}}
    m = memory_model(ftscope.load_scenario(d))
    assert max(m.reserved_bytes(p) for p in m.phase_points(1, 8)) < m.capacity_bytes < m.reserved_floor
    assert max_micro_batch(m, 8) == 0 and max_seq_len(m, 1) == 0


@pytest.mark.parametrize("kw", [dict(mix={"method": "full"}), dict(model="llama-2-7b", mix={"method": "qlora"}),
                                dict(model="olmoe-1b-7b", mix={"method": "lora", "gradient_checkpointing": True})])
def test_a_batch_solver_answers_as_the_model_on_every_capacity(kw):
    """One model solved for several GPUs' limits (a search's) gives max_micro_batch's answer and peak_bytes' bytes."""
    seq = 2048
    base = memory_model(scn(**kw))
    solver = BatchSolver(base, seq)
    for gpu in ("t4", "a100-80gb", "h200", "t4"):
        m = memory_model(scn(gpu=gpu, **kw))
        assert m.least_reserved == base.least_reserved
        for margin in (0.0, 0.1):
            assert solver.largest(m.capacity_bytes * (1 - margin)) == max_micro_batch(m, seq, margin)
    for b in (1, 3, 17):
        assert solver.peak(b) == base.peak_bytes(b, seq)


def test_a_solvers_peaks_and_points_are_the_models():
    """peak(b) and points(b): the model's peak bytes and phase points (kept from a recent peak, or made)."""
    mem = memory_model(scn())
    solver = BatchSolver(mem, 1024)
    assert solver.least == mem.least_reserved
    for b in (1, 2, 3, 4, 5, 6, 7):
        assert solver.peak(b) == mem.peak_bytes(b, 1024)
        assert solver.points(b) == mem._points(b, 1024)
    assert len(solver.recent) <= 4 and solver.points(1) == mem._points(1, 1024)  # no longer kept: made again


@pytest.mark.parametrize("kw", CASES + [
    dict(model="llama-3.2-1b", mix={"method": "full", "fsdp": "full_shard"}, hw={"gpus_per_node": 8}),
    dict(model="llama-3.2-1b", mix={"method": "lora", "fsdp": "shard_grad_op", "gradient_checkpointing": True},
         hw={"gpus_per_node": 4}),
    dict(model="llama-3.2-1b", mix={"method": "full", "loss": "chunked", "gradient_checkpointing": True}),
    dict(model="llama-2-7b", mix={"method": "full", "zero_stage": 2, "activation_offload": True,
                                  "gradient_checkpointing": True}, hw={"gpus_per_node": 2})])
def test_a_solvers_peaks_are_peak_bytes(kw):
    """BatchSolver.peak (its held totals summed with the model's terms read once, or _reserved_of itself where
    another stream holds memory) equals MemoryModel.peak_bytes with ==; top after a peak (from that peak's
    activations, kept) equals top made anew."""
    from ftscope.estimate.solvers import held_terms
    mem = memory_model(scn(**kw))
    solver, fresh = BatchSolver(mem, 1024), BatchSolver(mem, 1024)
    for b in (1, 2, 5, 33, 400):
        assert solver.peak(b) == mem.peak_bytes(b, 1024)
        assert solver.top(b) == fresh.top(b)
    assert (held_terms(mem) is None) == (mem.stream_gathered != 0.0 or mem.gradient_pool != 0.0)


def _reference_solve(limit, slopes, peak, cap, floor):
    """solvers._solve as it was written before _bounds (the guess tested point by point): the reference."""
    if floor > limit:
        return 0
    best = float(cap)
    for k, per_sample in slopes:
        if k > limit:
            return 0
        if per_sample > 0:
            room = (limit - k) / per_sample
            if room < best:
                best = room
    n = max(0, min(int(best), cap))
    while n > 0 and not peak(n) <= limit:
        n -= 1
    while n < cap and peak(n + 1) <= limit:
        n += 1
    return n


def test_the_solve_from_bounds_answers_as_the_point_by_point_loop():
    """_bounds + _solve_on (the constants' largest, then only the growing points) give what the loop over every
    point gives, on seeded random slopes and limits with zeros, negatives, repeats, infinities and NaNs."""
    import math
    import random
    from ftscope.estimate.solvers import _bounds, _solve, _solve_on
    rng = random.Random(21)
    odd = (0.0, -0.0, -1.0, math.inf, -math.inf, math.nan)
    for _ in range(20_000):
        def value(scale):
            return rng.choice(odd) if rng.random() < 0.1 else rng.uniform(-0.1, 1.0) * scale
        slopes = [(value(1e10), value(1e7)) for _ in range(rng.randint(0, 7))]
        if slopes and rng.random() < 0.3:
            slopes.append(rng.choice(slopes))  # a repeated point
        floor, limit, cap = value(1e10), value(2e10), rng.choice((1, 7, 300, BATCH_CAP))
        if math.isnan(limit):
            limit = 1e10  # (a NaN limit walks down from the cap one batch at a time: in both)
        per = rng.uniform(1e5, 1e8)
        base = rng.uniform(0.0, 1e10)

        def peak(n):
            return base + per * n
        want = _reference_solve(limit, slopes, peak, cap, floor)
        assert _solve(limit, slopes, peak, cap, floor) == want
        assert _solve_on(limit, _bounds(slopes, floor), peak, cap) == want
