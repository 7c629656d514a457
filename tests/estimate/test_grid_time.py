"""grid_time (estimate/grid_time.py): a plan's hours and dollars as arrays equal the scalar path's, number for
number (==, not approx), and builtin_sum equals the running interpreter's sum()."""
from __future__ import annotations

import itertools
import math
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
        # one collective per window, as _collectives makes them; the one no compute hides (unhidden 0.0) last
        transfers = [(pick(), w, 0.0 if w == "none" else pick())
                     for w in rng.sample(["bwd", "fwd_bwd", "last_bwd", "none"], rng.randint(1, 4))]
        transfers.sort(key=lambda t: t[1] == "none")
        want = G._exposed([(np.array([s]), w, np.array([u])) for s, w, u in transfers],
                          {k: np.array([v]) for k, v in win.items()}, np.array([overlap]))[0]
        wins = tuple((s, overlap * win[w], u) for s, w, u in transfers if w != "none")
        none = next((s for s, w, _ in transfers if w == "none"), None)
        got = G._fexposed(wins, none, overlap * win["fwd_bwd"])
        assert (math.isnan(got) and math.isnan(want)) or (got == want and math.copysign(1, got) == math.copysign(1, want))


@pytest.mark.parametrize("seed", range(4))
def test_one_candidates_floats_are_the_plain_formulas(seed):
    """_one (ring factors taken once per candidate, one collective per window) equals _reference_one, the plain
    transcription of step_columns and hours_of it was written from, on random values, specials included."""
    from types import SimpleNamespace
    rng = random.Random(seed)
    special = [float("nan"), float("inf"), -0.0, 0.0, -1.0]
    pick = lambda hi: rng.choice(special) if rng.random() < 0.05 else rng.uniform(0, hi)  # noqa: E731
    for _ in range(2000):
        stage, fsdp = rng.randint(0, 3), rng.random() < 0.5
        mix = SimpleNamespace(fsdp=fsdp, offload=rng.choice(["none", "optimizer", "optimizer+params"]))
        ga = rng.choice([1, 1, 3])
        terms = (mix, stage, ga, ga + 0.0, rng.choice([2.0, 4.0]), stage >= 1,
                 (rng.choice([2, 8, 16]), rng.choice([0.5, 1.0])) if mix.offload == "none" else None,
                 pick(1e11), rng.randint(0, 3), rng.randint(1, 80) + 1.0, rng.randint(0, 900) + 0.0,
                 rng.choice([2000.0, 1e7]), rng.choice([1, 2]))
        g = (pick(1.0), pick(1e-4), pick(1.0), pick(900.0), pick(3e12), pick(1e-3), pick(5e10), pick(1e9),
             pick(100.0), pick(1.0), rng.choice([float("nan"), rng.uniform(0.1, 10)]))
        gpn, nodes = rng.choice([1, 2, 8]), rng.choice([1, 1, 2, 16])
        c = (0, gpn * nodes, gpn, nodes, pick(50.0), rng.randint(1, 64), rng.choice([0, rng.randint(1, 10**10)]),
             *(pick(2.0) for _ in range(5)))
        live = rng.random() < 0.7
        gbs = G._link(g[3], *c[1:5])
        try:
            want = _reference_one(*terms, live, g, c)
        except (ZeroDivisionError, OverflowError, ValueError) as e:
            want = type(e)
        try:
            got = G._one(*terms, live, g, c, gbs)
        except (ZeroDivisionError, OverflowError, ValueError) as e:
            got = type(e)
        assert repr(got) == repr(want)


def _fring(bytes_: float, n: float, gbs: float, comm: float, factor: float, live: bool) -> float:
    if not live and (n <= 1 or bytes_ <= 0 or gbs <= 0):
        return 0.0
    return factor * (n - 1) / n * bytes_ / (gbs * 1e9 * comm)


def _reference_one(mix, stage, ga, runs, per_grad, sharded, adam, gathered, passes, units, modules, work, sps, live,
                   g, c):
    """grid_time._one as first written (a verbatim copy): step_columns' and hours_of's operations on one
    candidate's floats, through _fring and _reference_exposed."""
    comm_eff, lat, overlap, intra, bandwidth, kernels, host_link, cpu_adam, hook_us, other, price = g
    _, world, gpn, nodes, inter, batch, trainable, fwd, bwd, rec, deq, att = c
    if ga != 1:
        fwd_bwd, w_bwd, w_last, w_att = (fwd + bwd + rec + deq) * ga, bwd * ga, bwd, att * ga
    else:
        fwd_bwd, w_bwd, w_last, w_att = fwd + bwd + rec + deq, bwd, bwd, att
    if world > 1:
        n, gbs = world, G._link(intra, world, gpn, nodes, inter)
        g_bytes = trainable / 1 * per_grad
        ratio = g_bytes / G.DDP_BUCKET_BYTES
        buckets = ratio if ratio > 1.0 else 1.0
        last_bucket = _fring(G.DDP_BUCKET_BYTES if G.DDP_BUCKET_BYTES < g_bytes else g_bytes, n, gbs, comm_eff, 2.0,
                             live)
        if stage <= 1:
            ts = [(_fring(g_bytes, n, gbs, comm_eff, 2.0, live) + buckets * lat, w_last, last_bucket)]
            none = [(_fring(trainable / 1 * 2.0, n, gbs, comm_eff, 1.0, live) + buckets * lat, 0.0)] if stage == 1 \
                else []
            windows = [ts]
        else:
            reduce = ga * (_fring(g_bytes, n, gbs, comm_eff, 1.0, live) + buckets * lat)
            by_bwd = [(reduce, w_bwd, ga * last_bucket / 2)]
            none, by_fwd = [], []
            if stage == 2 and not mix.fsdp:
                none.append((_fring(trainable / 1 * 2.0, n, gbs, comm_eff, 1.0, live) + buckets * lat, 0.0))
            if stage == 2 and mix.fsdp:
                by_fwd.append((_fring(gathered, n, gbs, comm_eff, 1.0, live), fwd_bwd, 0.0))
            if stage == 3:
                gathers = ga * passes * _fring(gathered, n, gbs, comm_eff, 1.0, live)
                if mix.fsdp:
                    by_fwd.append((gathers + ga * units * passes * lat, fwd_bwd, gathers / units))
                else:
                    by_fwd.append((gathers + ga * modules * passes * lat, fwd_bwd, gathers / units))
                    none.append((ga * modules * passes * hook_us * 1e-6, 0.0))
            windows = [by_bwd, by_fwd] if by_fwd else [by_bwd]
        comm = _reference_exposed(windows, none, overlap, fwd_bwd)
    else:  # collectives() is empty on one GPU: exposed([]) leaves min(0.0, overlap x fwd_bwd) hidden
        room = overlap * fwd_bwd
        comm = 0.0 - (room if room < 0.0 else 0.0)
    shard = trainable / 1 / (world if sharded else 1)
    if adam is not None:
        opt = shard * adam[0] * adam[1] / bandwidth + kernels
    else:
        opt = shard / cpu_adam + shard * (2.0 + 2.0) / host_link
        if mix.offload == "optimizer+params":
            opt = opt + gathered / world * passes * ga / host_link
    parts = (fwd * runs, bwd * runs, rec * runs, deq * runs) if runs != 1.0 else (fwd, bwd, rec, deq)
    step = sum((*parts, opt, comm, other))
    steps = work / (batch * ga * world * sps)
    if not math.isfinite(steps):  # np.ceil's infinity or NaN: not a finite number of hours
        return None
    hours = float(math.ceil(steps)) * step / 3600.0
    usd = hours * world * price
    priced = price == price
    if not (step > 0 and min(*parts, opt, comm, other) >= 0 and math.isfinite(step + hours) and hours >= 0
            and not (priced and not (math.isfinite(usd) and usd >= 0))):
        return None
    return hours, (usd if priced else None)


def _reference_exposed(windows: list, none: list, overlap: float, fwd_bwd: float) -> float:
    """_exposed of one candidate (`windows`: its collectives per window, each (seconds, window seconds, unhidden), in
    _collectives' order of windows; `none`: the ones no compute hides, (seconds, unhidden))."""
    total_all = hidden = 0.0
    for ts in windows:
        total = sum([s for s, _, _ in ts])
        fixed = sum([s if s < u else u for s, _, u in ts])  # _min(u, s)
        room = overlap * ts[0][1]
        free = total - fixed
        hidden = hidden + (room if room < free else free)
        total_all = total_all + total
    if none:
        total = sum([s for s, _ in none])
        fixed = sum([s if s < u else u for s, u in none])
        free = total - fixed
        hidden = hidden + (0.0 if 0.0 < free else free)
        total_all = total_all + total
    cap = overlap * fwd_bwd
    hidden = cap if cap < hidden else hidden
    return total_all - hidden
