"""rank_figures (estimate/figures.py): a ranking's figures equal those of the estimate they stand for."""
from __future__ import annotations

import math

import pytest

import ftscope
from ftscope.estimate import figures as F
from ftscope.estimate.efficiency import load_calibration
from ftscope.estimate.shared import Shared
from ftscope.plan.search import estimate_with_margin
from ftscope.spec.hardware import gpu_from_catalog

GPUS = ["t4", "l4", "a40", "a100-80gb", "h100-80gb", "b200"]


def scn(model, mix=None, wl=None):
    ds = {"num_samples": 2000, "mean_tokens": 187, "median_tokens": 174, "p99_tokens": 411, "max_tokens": 1024}
    return ftscope.load_scenario({"model": model, "hardware": {"gpu": "a40"},
                                  "mix": {"method": "qlora", "gradient_checkpointing": True, **(mix or {})},
                                  "workload": {"micro_batch_size": "max", "seq_len": 1024, "dataset": ds,
                                               **(wl or {})}})


@pytest.mark.parametrize("model,mix,wl", [
    ("llama-2-7b", {"method": "full", "zero_stage": 2}, None),
    ("llama-2-7b", {"method": "lora", "gradient_checkpointing": False}, None),
    ("mixtral-8x7b", None, None),
    ("mixtral-8x7b", {"zero_stage": 3}, {"micro_batch_size": 2}),
])
@pytest.mark.parametrize("margin", [0.0, 0.1])
def test_figures_equal_the_estimates(model, mix, wl, margin):
    cal = load_calibration()
    base = scn(model, mix, wl)
    shared, fresh = Shared(base), Shared(base)
    for gpu in GPUS:
        for count, nodes in ((1, 1), (2, 1), (8, 1), (8, 4)):
            cand = base.with_(gpu=gpu_from_catalog(gpu), gpus_per_node=count, nodes=nodes)
            f = F.rank_figures(cand, margin, cal, shared)
            est = estimate_with_margin(cand, margin, cal, fresh)
            fits = est.fits and est.time is not None
            assert f.fits == fits
            if fits:  # equal, not close: the same functions on the same numbers
                assert (f.tight, f.hours, f.usd) == (est.status == "tight", est.run.hours, est.run.usd)
            else:
                assert f.does_not_fit == (est.reason or "").startswith("does not fit")


def test_a_step_that_is_not_a_finite_number_gives_none(monkeypatch):
    cal = load_calibration()
    cand = scn("llama-2-7b", {"method": "lora"}).with_(gpu=gpu_from_catalog("a100-80gb"))
    assert F.rank_figures(cand, 0.0, cal, None).fits
    real = F.step_parts

    def nan_comm(*a, **k):
        parts, *rest = real(*a, **k)
        return ({**parts, "communication": math.nan}, *rest)
    monkeypatch.setattr(F, "step_parts", nan_comm)
    assert F.rank_figures(cand, 0.0, cal, None) is None


@pytest.mark.parametrize("model,mix,wl", [
    ("llama-2-7b", {"method": "full", "zero_stage": 2}, None),
    ("mixtral-8x7b", None, None),
    ("mixtral-8x7b", {"zero_stage": 3}, {"micro_batch_size": 2}),
])
@pytest.mark.parametrize("margin", [0.0, 0.1])
def test_the_grid_gives_each_candidates_rank_figures(model, mix, wl, margin):
    """rank_grid (one memory model per GPU count, solved once per capacity) equals rank_figures candidate by
    candidate, fits and misfits, in the candidates' order; a scenario the memo does not cover takes rank_figures."""
    cal = load_calibration()
    base = scn(model, mix, wl)
    cands = [base.with_(gpu=gpu_from_catalog(g), gpus_per_node=c, nodes=n)
             for g in GPUS for c, n in ((1, 1), (2, 1), (8, 1), (8, 4))]
    grid = F.rank_grid(cands, margin, cal, Shared(base))
    assert grid == [F.rank_figures(c, margin, cal, Shared(base)) for c in cands]
    assert any(f.fits for f in grid) and any(not f.fits for f in grid)
    other = Shared(base.with_(seq_len=512))  # covers none of them
    assert F.rank_grid(cands[:3], margin, cal, other) == grid[:3]


@pytest.mark.parametrize("model,mix", [("llama-2-7b", {"method": "full", "zero_stage": 3}),
                                       ("llama-2-7b", {"method": "lora", "gradient_checkpointing": False}),
                                       ("mixtral-8x7b", None)])
def test_the_grids_breakdown_values_are_the_breakdowns(model, mix):
    """_breakdown_values (the grid's sanity check) reads what breakdown would, capacity cut included."""
    from ftscope.estimate.memory import memory_model
    from ftscope.spec.scenario import fast_replace
    mem = memory_model(scn(model, mix).with_(gpu=gpu_from_catalog("h100-80gb")))
    for batch in (1, 4, 64, 2048):
        bd = mem.breakdown(batch, 1024)
        for cap in (mem.capacity_bytes, bd.fit_bytes / 2, bd.fit_bytes, (bd.fit_bytes + bd.peak_bytes) / 2,
                    bd.peak_bytes * 2):
            cut = fast_replace(mem, capacity_bytes=cap)
            want = cut.breakdown(batch, 1024)
            values = [want.peak_bytes, want.allocated_bytes, *want.categories.values()]
            assert F._breakdown_values(cut, batch, 1024) == values
            assert F._breakdown_values(mem, batch, 1024, cap) == values  # the capacity given, not replaced


@pytest.mark.parametrize("model,mix", [("llama-2-7b", {"method": "full", "zero_stage": 3}),
                                       ("mixtral-8x7b", None)])
def test_the_grids_sanity_check_is_the_breakdowns_on_every_capacity(model, mix):
    """_sane_on (made once per micro-batch, the capacity cut apart) reads what _breakdown_values' list says."""
    from ftscope.estimate.memory import memory_model
    from ftscope.estimate.solvers import BatchSolver
    mem = memory_model(scn(model, mix).with_(gpu=gpu_from_catalog("h100-80gb")))
    solver = BatchSolver(mem, 1024)
    for batch in (1, 4, 64, 2048):
        bd = mem.breakdown(batch, 1024)
        solver.peak(batch)
        for cap in (mem.capacity_bytes, bd.fit_bytes / 2, bd.fit_bytes, (bd.fit_bytes + bd.peak_bytes) / 2,
                    bd.peak_bytes * 2, -1.0):
            assert F._sane_on(solver, cap, batch) == F._values_sane(F._breakdown_values(mem, batch, 1024, cap))
    assert F._sane_on(solver, 1e30, 3) is True  # a batch the solver has not met: its points made anew


@pytest.mark.parametrize("zero,shared_above_one", [(0, True), (2, False)])
def test_equal_memory_models_share_one_solver_and_a_repeat_gives_the_same_sites(zero, shared_above_one):
    """DDP's memory model is the same at every GPU count above one (ZeRO-2's shards by it): the grid solves it once
    for all of them; its figures still equal rank_figures at each count, and a repeated grid gives the same ones."""
    cal = load_calibration()
    base = scn("llama-2-7b", {"method": "lora", "gradient_checkpointing": False, "zero_stage": zero})
    layouts = ((1, 1), (2, 1), (8, 1), (8, 2), (8, 16))
    cands = [base.with_(gpu=gpu_from_catalog(g), gpus_per_node=c, nodes=n) for c, n in layouts for g in GPUS]
    sh = Shared(base)
    grid = F.rank_grid(cands, 0.0, cal, sh)
    assert grid == [F.rank_figures(c, 0.0, cal, Shared(base)) for c in cands]
    assert sum(f.fits for f in grid) > len(GPUS)
    solvers = [sh.get(("grid", c * n), lambda: None) for c, n in layouts]
    assert all(s is not None for s in solvers)
    assert (solvers[1] is solvers[2] is solvers[3] is solvers[4]) == shared_above_one
    assert solvers[0] is not solvers[1]
    assert F.rank_grid(cands, 0.0, cal, sh) == grid  # every site again: remade from the sweep's memos
    # known and new sites together, fewer new fitting ones than grid_time takes (the scalar path times them)
    more = cands[:3] + [base.with_(gpu=gpu_from_catalog(g), gpus_per_node=4, nodes=4) for g in GPUS[-2:]]
    assert F.rank_grid(more, 0.0, cal, sh) == [F.rank_figures(c, 0.0, cal, Shared(base)) for c in more]
    assert F.rank_grid(more, 0.0, cal, sh) == F.rank_grid(more, 0.0, cal, Shared(base))


def test_each_sites_capacity_is_the_estimates():
    """The grid's capacity per site (GPU type, count and node layout: NCCL's buffers read all three) is the
    estimate's for that candidate, and the figures equal rank_figures on every layout of eight GPUs."""
    from ftscope.estimate import estimate
    cal = load_calibration()
    base = scn("llama-2-7b", {"method": "full", "zero_stage": 3})
    cands = [base.with_(gpu=gpu_from_catalog(g), gpus_per_node=c, nodes=n)
             for g in ("a100-80gb", "h100-80gb") for c, n in ((1, 1), (8, 1), (4, 2), (2, 4), (1, 8))]
    sh = Shared(base)
    F._CAPACITIES.clear()
    assert F.rank_grid(cands, 0.0, cal, sh) == [F.rank_figures(c, 0.0, cal, Shared(base)) for c in cands]
    caps = {estimate(c).model_memory.capacity_bytes for c in cands}
    assert len(caps) > 4  # the layouts of eight GPUs differ
    comm = F._comm_fields(sh.scenario)
    for c in cands:
        cl = c.cluster
        allocator = sh.get(("grid", cl.world_size), lambda: None).mem.allocator
        gpu, cap = F._CAPACITIES[cl.world_size, cl.gpus_per_node, id(allocator), comm][1][id(cl.gpu)]
        assert gpu is cl.gpu and cap == estimate(c).model_memory.capacity_bytes


@pytest.mark.parametrize("model,mix", [("llama-2-7b", {"method": "full", "zero_stage": 3}),
                                       ("llama-2-7b", {"method": "lora", "gradient_checkpointing": False}),
                                       ("llama-2-7b", {"method": "full", "fsdp": "shard_grad_op"}),
                                       ("mixtral-8x7b", None)])
def test_uncut_reads_the_reserved_totals_peak(model, mix):
    """_uncut's peak and the phase point it reads (its one-stream totals summed in place) are those of
    MemoryModel._reserved_of's totals: max(), then the first of the largest."""
    from ftscope.estimate.memory import memory_model
    mem = memory_model(scn(model, mix).with_(gpu=gpu_from_catalog("h100-80gb"), gpus_per_node=4))
    for batch in (1, 4, 64, 2048):
        phases = mem._points(batch, 1024)
        totals = mem._reserved_of(phases)
        i = totals.index(max(totals))
        _, grads, act, temp, allocated = phases[i]
        peak = max(max(totals), mem.least_reserved)
        got = F._uncut(mem, phases, mem.least_reserved)
        assert (got[0], got[2:]) == (peak, (allocated, grads, act, temp))
