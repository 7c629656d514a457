"""grid_time (estimate/grid_time.py): a plan's hours and dollars as arrays equal the scalar path's, number for
number (==, not approx), and builtin_sum equals the running interpreter's sum()."""
from __future__ import annotations

import itertools
import random

import pytest

import ftscope
from ftscope.estimate import figures as F
from ftscope.estimate import grid_time as G
from ftscope.estimate.comm import collectives
from ftscope.estimate.cost import price_of, run_steps
from ftscope.estimate.efficiency import load_calibration
from ftscope.estimate.memory import memory_model
from ftscope.estimate.micro_seconds import micro_row
from ftscope.estimate.shared import Shared
from ftscope.estimate.time import step_parts
from ftscope.spec.hardware import gpu_from_catalog

# NVLink and PCIe-only GPUs (rtx-4090: no peer-to-peer), five architectures, with and without a catalog price
GPUS = ["t4", "rtx-4090", "a100-80gb", "h100-80gb", "h200", "b200", "mi300x", "h800"]
SITES = [(1, 1), (2, 1), (3, 1), (8, 1), (1, 4), (8, 3), (4, 16)]  # GPUs per node x nodes: 1 to 64 GPUs, not all powers of 2
DS = {"num_samples": 2000, "mean_tokens": 187, "median_tokens": 174, "p99_tokens": 411, "max_tokens": 1024}
CASES = [  # dense, MoE, QLoRA, LoRA; DDP, ZeRO 1-3, FSDP; offload; fp32; 8-bit states; fixed batch; packing
    ("llama-2-7b", {"method": "full", "zero_stage": 0}, {}),
    ("llama-2-7b", {"method": "full", "zero_stage": 1, "gradient_checkpointing": True}, {}),
    ("llama-2-7b", {"method": "lora", "zero_stage": 2}, {"gradient_accumulation": 4}),
    ("llama-2-7b", {"method": "full", "zero_stage": 3, "gradient_checkpointing": True}, {}),
    ("llama-2-7b", {"method": "full", "fsdp": "full_shard"}, {"gradient_accumulation": 3}),
    ("llama-2-7b", {"method": "full", "fsdp": "shard_grad_op", "optimizer": "adamw_8bit"}, {}),
    ("llama-2-7b", {"method": "full", "zero_stage": 2, "offload": "optimizer"}, {}),
    ("llama-2-7b", {"method": "full", "zero_stage": 3, "offload": "optimizer+params"}, {}),
    ("llama-2-7b", {"method": "full", "precision": "fp32", "zero_stage": 1}, {"micro_batch_size": 2}),
    ("mixtral-8x7b", {"method": "qlora", "gradient_checkpointing": True}, {}),
    ("mixtral-8x7b", {"method": "qlora", "gradient_checkpointing": True, "zero_stage": 3},
     {"padding": "packed", "gradient_accumulation": 5}),
    ("llama-2-7b", {"method": "qlora", "nested_quant": False, "zero_stage": 3, "gradient_checkpointing": True}, {}),
    ("llama-2-7b", {"method": "qlora", "nested_quant": True, "zero_stage": 3, "gradient_checkpointing": True}, {}),
    ("llama-2-7b", {"method": "qlora", "nested_quant": False, "fsdp": "full_shard"}, {"gradient_accumulation": 2}),
    ("llama-2-7b", {"framework": "torchtune", "method": "qlora", "fsdp": "full_shard"}, {}),  # torchao: scalers too
    ("llama-2-7b", {"method": "qlora", "fsdp": "shard_grad_op"}, {}),          # the 4-bit data gathered once a step
    ("llama-2-7b", {"method": "full", "precision": "fp32", "fsdp": "full_shard"}, {}),  # fp32 weights gathered
    ("llama-2-7b", {"method": "qlora", "fsdp": "full_shard", "offload": "optimizer+params",  # 4-bit shards from host
                    "gradient_checkpointing": True}, {}),
    ("mixtral-8x7b", {"method": "lora", "fsdp": "full_shard", "gradient_checkpointing": True}, {}),
]


def _scenario(model, mix, wl):
    gpus = 2 if set(mix) & {"tensor_parallel", "pipeline_parallel", "context_parallel"} else 1
    mix = dict(mix)
    framework = mix.pop("framework", None)  # a case's framework recipe, written beside its mix
    return ftscope.load_scenario({"model": model, "hardware": {"gpu": "a100-80gb", "gpus_per_node": gpus}, "mix": mix,
                                  "workload": {"micro_batch_size": "max", "seq_len": 1024, "dataset": DS, **wl},
                                  **({"framework": framework} if framework else {})})


def _cands(base):
    least = base.cluster.gpus_per_node  # a model-parallel mix needs its degree of GPUs per node
    return [base.with_(gpu=gpu_from_catalog(g), gpus_per_node=c, nodes=n) for g in GPUS for c, n in SITES
            if c >= least]


def _scalar(scn, batch, trainable, cal, sh):
    """figures._ranked's step parts, collectives, hours and dollars, step by step as there."""
    eff, _ = cal.for_gpu(scn.cluster.gpu.key)
    parts, _, _, _, lay, seq, _ = step_parts(scn, batch, eff, trainable, shared=sh)
    step = sum(parts.values())
    hours = run_steps(scn, batch) * step / 3600.0
    price = price_of(scn)[0]
    transfers = [(t.seconds, t.window, t.unhidden) for t in collectives(scn, eff, trainable, batch, seq, lay)]
    return parts, transfers, (hours, None if price is None else hours * scn.cluster.world_size * price)


@pytest.mark.parametrize("model,mix,wl", CASES)
def test_the_arrays_equal_the_scalar_path_number_for_number(model, mix, wl):
    """Every GPU type x count x nodes at micro-batches 1, 3 and 16, fitting or not (time does not ask): each part
    of the step, each collective and the run's hours and dollars."""
    cal = load_calibration()
    base = _scenario(model, mix, wl)
    sh = Shared(base)
    assert G.takes(base)
    table, rows, cols, want = [], {}, [], []
    for scn in _cands(base):
        gpu, cl = scn.cluster.gpu, scn.cluster
        eff = cal.for_gpu(gpu.key)[0]
        trainable = memory_model(scn).trainable_params
        if id(gpu) not in rows:
            rows[id(gpu)] = len(table)
            table.append(G.gpu_row(sh, scn, cal))
        for batch in (1, 3, 16):
            micro = micro_row(sh, cal, eff, batch, gpu, lambda: scn)
            cols.append((rows[id(gpu)], cl.world_size, cl.gpus_per_node, cl.nodes, cl.inter_node_gbs, batch, trainable,
                         *micro))
            want.append(_scalar(scn, batch, trainable, cal, sh))
    parts, transfers, _, _ = G.step_columns(base, table, cols)
    for k, (want_parts, want_transfers, _) in enumerate(want):
        assert {name: v[k] for name, v in parts.items()} == want_parts  # ==: the same operations in the same order
        assert list(parts) == list(want_parts)  # and the same order of the parts, which sum() adds
        if want_transfers:  # one GPU has none
            assert [(s[k], w, u if isinstance(u, float) else u[k]) for s, w, u in transfers] == want_transfers
    got = G.hours_of(base, table, cols)
    assert got == [run for _, _, run in want]
    assert G._floats(base, table, cols) == got  # one candidate at a time in floats: the same numbers
    assert [run for k in range(0, len(cols), 5) for run in G.hours_of(base, table, cols[k:k + 5])] == got
    assert any(u is None for _, u in got) and len({h for h, _ in got}) > len(got) // 2
    # a plan over more nodes has no one-GPU candidate (step_columns then skips one's communication)
    multi = [k for k, col in enumerate(cols) if col[1] > 1]
    parts, _, _, _ = G.step_columns(base, table, [cols[k] for k in multi])
    assert [{name: v[j] for name, v in parts.items()} for j in range(len(multi))] == [want[k][0] for k in multi]
    assert G.hours_of(base, table, [cols[k] for k in multi]) == [want[k][2] for k in multi]


@pytest.mark.parametrize("model,mix,wl", CASES + [("llama-2-7b", {"method": "lora", "tensor_parallel": 2}, {}),
                                                  ("llama-2-7b", {"method": "lora", "activation_offload": True}, {})])
@pytest.mark.parametrize("margin", [0.0, 0.1])
def test_the_grid_equals_each_candidates_rank_figures(model, mix, wl, margin):
    """grid_figures (arrays for the mixes grid_time takes, the scalar path for the others) equals rank_figures,
    which estimate equals (test_figures.py)."""
    cal = load_calibration()
    base = _scenario(model, mix, wl)
    cands = _cands(base)
    grid = F.rank_grid(cands, margin, cal, Shared(base))
    assert grid == [F.rank_figures(c, margin, cal, Shared(base)) for c in cands]
    assert any(f.fits for f in grid)


def test_a_mix_it_does_not_take_is_left_to_the_scalar_path():
    for mix in ({"tensor_parallel": 2}, {"pipeline_parallel": 2}, {"context_parallel": 2}, {"activation_offload": True}):
        assert not G.takes(_scenario("llama-2-7b", {"method": "lora", **mix}, {"gradient_accumulation": 2}))
    assert G.takes(_scenario("mixtral-8x7b", {"method": "lora"}, {}))


def test_a_figure_that_is_not_a_finite_number_is_left_to_the_scalar_path():
    cal = load_calibration()
    base = _scenario("llama-2-7b", {"method": "lora", "zero_stage": 2}, {})
    scn = base.with_(gpu=gpu_from_catalog("h100-80gb"), gpus_per_node=2)
    sh = Shared(base)
    row = G.gpu_row(sh, scn, cal)
    micro = micro_row(sh, cal, cal.for_gpu("h100-80gb")[0], 4, scn.cluster.gpu, lambda: scn)
    good = (0, 2, 2, 1, 25.0, 4, 10**7, *micro)
    nan = (0, 2, 2, 1, 25.0, 4, 10**7, float("nan"), *micro[1:])
    negative = (0, 2, 2, 1, 25.0, 4, 10**7, *micro[:3], -1.0, micro[4])
    got = G.hours_of(base, [row], [good, nan, negative])
    assert got[0] is not None and got[1:] == [None, None]
    zero_rate = (row[0] * 0.0, *row[1:])  # no link: the arrays' infinities, the floats' ZeroDivisionError
    assert G._floats(base, [zero_rate], [good]) == [None]
    assert G.step_columns(base, [row], [good] * 30)[0] and G.hours_of(base, [row], [good] * 30) == [got[0]] * 30


@pytest.mark.parametrize("seed", range(5))
def test_builtin_sum_is_the_interpreters_sum(seed):
    """Terms of mixed magnitude and sign, where a compensated sum (Python >= 3.12) and a left-to-right one differ."""
    import numpy as np
    rng = random.Random(seed)
    rows = [[rng.choice([1.0, -1.0]) * rng.random() * 10.0 ** rng.randint(-12, 12) for _ in range(7)]
            for _ in range(200)]
    got = G.builtin_sum([np.array(col) for col in zip(*rows)]).tolist()
    assert got == [sum(r) for r in rows]
    left_to_right = [list(itertools.accumulate(r))[-1] for r in rows]
    assert (got != left_to_right) == G.COMPENSATED_SUM


@pytest.mark.parametrize("seed", range(3))
def test_the_floats_exposure_is_the_arrays_on_every_value(seed):
    """_fexposed (one candidate) equals _exposed (arrays) bit for bit, NaN, infinities, -0.0 and negatives included:
    each min picks the side numpy's where does."""
    import math

    import numpy as np
    rng = random.Random(seed)
    special = [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, -1.0, 1.0]
    pick = lambda: rng.choice(special) if rng.random() < 0.3 else rng.uniform(-1, 10)  # noqa: E731
    for _ in range(300):
        win = {"fwd_bwd": pick(), "bwd": pick(), "last_bwd": pick()}
        overlap = pick()
        transfers = [(pick(), w, pick()) for w in rng.sample(["bwd", "fwd_bwd", "last_bwd", "none"], rng.randint(1, 4))
                     for _ in range(rng.randint(1, 2))]
        transfers.sort(key=lambda t: t[1] == "none")  # the float path takes "none" last, as _collectives orders them
        want = G._exposed([(np.array([s]), w, np.array([u])) for s, w, u in transfers],
                          {k: np.array([v]) for k, v in win.items()}, np.array([overlap]))[0]
        groups: dict[str, list] = {}
        for s, w, u in transfers:
            groups.setdefault(w, []).append((s, win.get(w, 0.0), u))
        none = [(s, u) for s, _, u in groups.pop("none", [])]
        got = G._fexposed(list(groups.values()), none, overlap, win["fwd_bwd"])
        assert (math.isnan(got) and math.isnan(want)) or (got == want and math.copysign(1, got) == math.copysign(1, want))

