"""micro_seconds (estimate/micro_seconds.py): a plan's micro-batch seconds equal time.py's pass_times' parts and
attention, number for number (==, not approx)."""
from __future__ import annotations

import pytest

import ftscope
from ftscope.estimate import micro_seconds as MS
from ftscope.estimate.efficiency import load_calibration
from ftscope.estimate.shared import Shared
from ftscope.spec.hardware import gpu_from_catalog

GPUS = ["t4", "rtx-4090", "a100-80gb", "h100-80gb", "h200", "b200", "mi300x", "h800"]
DS = {"num_samples": 2000, "mean_tokens": 187, "median_tokens": 174, "p99_tokens": 411, "max_tokens": 1024}


def _scenario(model, mix):
    return ftscope.load_scenario({"model": model, "hardware": {"gpu": "a100-80gb"}, "mix": mix,
                                  "workload": {"micro_batch_size": "max", "seq_len": 1024, "dataset": DS}})


PASS_MIXES = [{"method": "full"}, {"method": "lora", "gradient_checkpointing": True},
              {"method": "qlora", "gradient_checkpointing": True, "checkpointing": "selective"},
              {"method": "full", "gradient_checkpointing": True, "checkpointing": "per-op", "compile": True},
              {"method": "lora", "gradient_checkpointing": True, "checkpoint_every": 2, "attention": "eager"},
              {"method": "qlora", "experts_backend": "modules", "gradient_checkpointing": True},
              {"method": "full", "fp8": True, "experts_backend": "grouped_mm", "gradient_checkpointing": True}]


@pytest.mark.parametrize("model", ["llama-2-7b", "mixtral-8x7b"])
@pytest.mark.parametrize("mix", PASS_MIXES)
def test_pass_seconds_are_pass_times_parts_and_attention(model, mix):
    """pass_seconds (what a plan's micro_row makes) equals time.pass_times' parts and attention with ==, on GPU
    types of every architecture and micro-batches from 1 to 64."""
    from ftscope.estimate.compute import cached_ops
    from ftscope.estimate.time import pass_times, rates
    cal = load_calibration()
    base = _scenario(model, mix)
    for gpu in GPUS:
        scn = base.with_(gpu=gpu_from_catalog(gpu))
        eff = cal.for_gpu(scn.cluster.gpu.key)[0]
        r = rates(scn, eff)
        for batch in (1, 2, 7, 64):
            seq = scn.workload.mean_padded_len(batch)
            ops = cached_ops(scn, batch, seq)
            mb, _, att = pass_times(ops, scn, eff, r)
            want = (mb["forward"], mb["backward"], mb["recompute"], mb["dequant"], att)
            assert MS.pass_seconds(ops, scn.mix, r) == want


def test_micro_row_reads_what_an_estimate_timed():
    """micro_row takes the pass times an estimate of the sweep already made (micro_batch_times' memo) as they are."""
    from ftscope.estimate.time import micro_batch_times
    base = _scenario("llama-2-7b", {"method": "lora"})
    sh, cal = Shared(base), load_calibration()
    eff = cal.for_gpu(base.cluster.gpu.key)[0]
    (mb, _, att), _, _ = micro_batch_times(base, 3, eff, None, sh)
    row = MS.micro_row(sh, cal, eff, 3, base.cluster.gpu, lambda: base)
    assert row == (mb["forward"], mb["backward"], mb["recompute"], mb["dequant"], att)


def test_a_new_micro_row_is_pass_times_and_zero_stages_share_it():
    """A micro_row no estimate has timed is pass_times' (made by pass_seconds), and a sweep of another ZeRO stage
    (the same compute_mix) reads the same tuple rather than making it again."""
    from ftscope.estimate.time import micro_batch_times
    cal = load_calibration()
    gpu = gpu_from_catalog("a100-80gb")  # a plan's GPU objects are the catalog's, one per type
    bases = [_scenario("llama-2-7b", {"method": "lora", "zero_stage": zero, "lora_rank": 24}).with_(gpu=gpu)
             for zero in (1, 2)]
    eff = cal.for_gpu(bases[0].cluster.gpu.key)[0]
    rows = [MS.micro_row(Shared(base), cal, eff, 5, base.cluster.gpu, lambda: base) for base in bases]
    assert rows[0] is rows[1]
    (mb, _, att), _, _ = micro_batch_times(bases[1], 5, eff, None, Shared(bases[1]))
    assert rows[1] == (mb["forward"], mb["backward"], mb["recompute"], mb["dequant"], att)


def _random_op(rng):
    from ftscope.estimate.compute import Op
    kind = rng.choice(["matmul", "matmul", "attention", "stream", "dequant", "dispatch"])
    return Op(kind, rng.choice(["attention", "mlp", "experts", "lm_head"]), rng.choice([0.0, rng.uniform(1, 1e13)]),
              rng.uniform(0, 1e10), rng.choice([1, 2.0, rng.uniform(0.5, 90)]),
              rng.choice([0.25, 1, 1.0, 63.5, 64, 127.9, 128, rng.uniform(0, 9000)]), rng.choice([1.0, 2.0, 2.5]),
              rng.random() < 0.7, rng.random() < 0.3, rng.choice([0, 1, 64, 129, rng.randrange(1, 20000)]),
              rng.choice([0, 16, rng.randrange(1, 20000)]), rng.choice([0, 1, 3, 8]),
              rng.choice([0.5, 1.0, rng.uniform(1, 8192)]), rng.random() < 0.3, rng.random() < 0.3, rng.random() < 0.2)


def _random_rates(rng):
    from ftscope.estimate.time import Rates
    u = rng.uniform
    return Rates(u(1e13, 1e15), u(1e13, 2e15), u(1e13, 1e15), u(1e13, 2e15), rng.choice([0.0, u(1e13, 1e15)]),
                 u(0, 2000), u(1e11, 5e12), u(1e11, 5e12), u(1e-6, 1e-5), u(1e-6, 2e-5), u(0, 1e-4),
                 rng.choice([0, 40, 108, 132]), rng.choice([0.0, u(1, 512)]), u(0.5, 1.0),
                 rng.choice([1.0, u(0.3, 1)]), rng.choice([1.0, u(0.1, 1)]))


def test_pass_seconds_on_random_ops_and_rates():
    """pass_seconds writes compute.recomputed and time.op_time out in its loop: on random ops (every kind, short and
    fractional GEMM rows, empty shapes, FP8, grouped, fusible, head ops), random rates (eager and fused attention,
    no SM count, no k_half, compile factors) and every checkpointing policy it equals pass_times with ==."""
    import random
    from types import SimpleNamespace
    from ftscope.estimate.time import pass_times
    rng = random.Random(21)
    mixes = [_scenario("llama-2-7b", mix).mix for mix in
             ({"method": "lora"}, {"method": "lora", "gradient_checkpointing": True},
              {"method": "lora", "gradient_checkpointing": True, "checkpoint_every": 3},
              {"method": "lora", "gradient_checkpointing": True, "checkpointing": "selective"},
              {"method": "lora", "gradient_checkpointing": True, "checkpointing": "per-op"})]
    for _ in range(400):
        ops = tuple(_random_op(rng) for _ in range(rng.randrange(1, 30)))
        r, mix = _random_rates(rng), rng.choice(mixes)
        mb, _, att = pass_times(ops, SimpleNamespace(mix=mix), None, r)
        assert MS.pass_seconds(ops, mix, r) == (mb["forward"], mb["backward"], mb["recompute"], mb["dequant"], att)
