"""plan() (plan/search.py): rows, ranking, best, Pareto frontier, JSON."""
from __future__ import annotations

import json

import pytest

import ftscope
from ftscope import FtscopeError
from ftscope.plan.search import _rank_key, one_row_per_gpu, pareto_front

GPUS = ["a40", "a100-80gb", "h100-80gb", "l4", "t4"]


def scn(model="mixtral-8x7b", mix=None, wl=None):
    ds = {"num_samples": 2000, "mean_tokens": 187, "median_tokens": 174, "p99_tokens": 411, "max_tokens": 1024}
    d = {"model": model, "hardware": {"gpu": "a40"},
         "mix": {"method": "qlora", "gradient_checkpointing": True, "attention": "flash",
                 "experts_backend": "modules", **(mix or {})},  # the IISWC stack: quantized per-expert modules
         "workload": {"micro_batch_size": 1, "seq_len": 1024, "dataset": ds, **(wl or {})}}
    return ftscope.load_scenario(d)


@pytest.fixture(scope="module")
def by_cost():
    return ftscope.plan(scn(), gpus=GPUS, counts=[1, 2, 4], by="cost")


@pytest.fixture(scope="module")
def by_time():
    return ftscope.plan(scn(), gpus=GPUS, counts=[1, 2, 4], by="time")


def test_one_row_per_gpu_and_count(by_cost):
    keys = sorted((e.scenario.cluster.gpu.key, e.scenario.cluster.world_size) for e in by_cost.rows)
    assert keys == sorted((g, n) for g in GPUS for n in (1, 2, 4))


def test_every_row_fits_or_says_why(by_cost):
    for e in by_cost.rows:
        assert e.fits or e.reason, e.to_dict()["label"]
        if e.fits:
            assert e.time is not None and e.run is not None
            # the batch is solved: largest that fits
            assert e.micro_batch_size == e.max_micro_batch_size >= 1
    # flash attention on a T4 is listed, not raised
    t4 = [e for e in by_cost.rows if e.scenario.cluster.gpu.key == "t4"]
    assert t4 and all(not e.fits and "FlashAttention" in e.reason for e in t4)


@pytest.mark.parametrize("which", ["by_cost", "by_time"])
def test_best_is_feasible_and_minimal(which, request):
    p = request.getfixturevalue(which)
    feasible = [e for e in p.rows if e.fits and e.run is not None]
    assert p.best is not None and p.best.fits
    if p.by == "cost":
        assert p.best.run.usd == min(e.run.usd for e in feasible if e.run.usd is not None)
    else:
        assert p.best.run.hours == min(e.run.hours for e in feasible)
    keys = [_rank_key(e, p.by) for e in p.rows]
    assert keys == sorted(keys)
    assert p.rows[0] is p.best


def test_infeasible_rows_rank_last(by_cost):
    seen_infeasible = False
    for e in by_cost.rows:
        if not e.fits:
            seen_infeasible = True
        else:
            assert not seen_infeasible


def test_pareto_rows_are_not_dominated(by_cost):
    rows = by_cost.rows
    priced = [e for e in rows if e.fits and e.run is not None and e.run.usd is not None]
    front = [rows[i] for i in by_cost.pareto]
    assert front
    for f in front:
        assert f.fits
        for o in priced:
            dominated = (o.run.hours <= f.run.hours and o.run.usd <= f.run.usd
                         and (o.run.hours < f.run.hours or o.run.usd < f.run.usd))
            assert not dominated
    # every priced feasible row off the front is dominated by a front row
    for o in priced:
        if o not in front:
            assert any(f.run.hours <= o.run.hours and f.run.usd <= o.run.usd for f in front)
    # both extremes are on the front
    assert min(priced, key=lambda e: (e.run.usd, e.run.hours)) in front
    assert min(priced, key=lambda e: (e.run.hours, e.run.usd)) in front
    assert pareto_front(rows) == by_cost.pareto


def test_more_gpu_counts_never_worsen_the_best_time():
    s = scn()
    best = [ftscope.plan(s, gpus=["a40", "a100-80gb"], counts=c, by="time").best.run.hours
            for c in ([1], [1, 2], [1, 2, 4, 8])]
    assert best[0] >= best[1] >= best[2]
    assert best[2] < best[0]


def test_json_has_rows_and_best(by_cost):
    d = json.loads(json.dumps(by_cost.to_dict()))
    assert set(d) >= {"rows", "best"}
    assert len(d["rows"]) == len(by_cost.rows)
    assert d["best"]["label"] == d["rows"][0]["label"]
    for r in d["rows"]:
        assert isinstance(r["pareto"], bool)
        for k in ("memory", "limits", "time", "run", "reason", "scenario"):
            assert k in r
        if r["memory"]["fits"]:
            for k in ("samples_per_s", "tokens_per_s", "step_s"):
                assert r["time"][k] > 0
            assert r["run"]["hours"] > 0 and r["limits"]["max_micro_batch_size"] >= 1
    assert sum(r["pareto"] for r in d["rows"]) == len(by_cost.pareto)


def test_one_row_per_gpu_view(by_cost):
    view = one_row_per_gpu(by_cost)
    assert [e.scenario.cluster.gpu.key for e in view] == list(dict.fromkeys(
        e.scenario.cluster.gpu.key for e in by_cost.rows))
    assert view[0] is by_cost.rows[0]


def test_nothing_fits_gives_no_best():
    s = scn("llama-2-70b", mix={"method": "full", "gradient_checkpointing": False})
    p = ftscope.plan(s, gpus=["l4"], counts=[1, 2])
    assert p.best is None and p.pareto == []
    assert all(not e.fits and "does not fit" in e.reason for e in p.rows)
    assert p.to_dict()["best"] is None


def test_keep_batch_uses_the_scenario_batch():
    p = ftscope.plan(scn(wl={"micro_batch_size": 2}), gpus=["a100-80gb"], counts=[1], solve_batch=False)
    assert p.rows[0].micro_batch_size == 2


def test_max_gpus_and_nodes_filter_counts():
    p = ftscope.plan(scn(), gpus=["a100-80gb"], counts=[1, 2, 4, 8], max_gpus=4, nodes=2)
    assert sorted(e.scenario.cluster.world_size for e in p.rows) == [2, 4]
    assert all(e.scenario.cluster.nodes == 2 for e in p.rows)
    with pytest.raises(FtscopeError):
        ftscope.plan(scn(), gpus=["a100-80gb"], counts=[8], max_gpus=4)


def test_bad_arguments():
    with pytest.raises(FtscopeError, match="--by"):
        ftscope.plan(scn(), gpus=["a40"], by="speed")
    with pytest.raises(FtscopeError, match="unknown GPU"):
        ftscope.plan(scn(), gpus=["a40x"])


def test_default_gpus_are_the_priced_ones():
    from ftscope import catalog
    from ftscope.plan.search import candidate_gpus
    assert candidate_gpus(None) == [k for k in catalog.gpu_table() if catalog.prices_for(k)]
    assert candidate_gpus(["A100", "nvidia-a40"]) == ["a100-80gb", "a40"]


def test_a_margin_solves_the_batch_to_leave_it_free_and_ranks_tight_rows_last():
    s = ftscope.load_scenario({"model": "llama-3.1-8b", "mix": {"method": "lora", "gradient_checkpointing": True,
                                                                   "optimizer": "adamw_8bit"},
                               "workload": {"micro_batch_size": 1, "seq_len": 4096}})
    plain = ftscope.plan(s, gpus=["rtx-4090", "l40s", "a100-80gb"], counts=[1, 2])
    safe = ftscope.plan(s, gpus=["rtx-4090", "l40s", "a100-80gb"], counts=[1, 2], margin=0.05)
    assert all(e.status == "fits" for e in plain.rows if e.fits)  # no margin: nothing is tight
    by_key = {(e.scenario.cluster.gpu.key, e.scenario.cluster.world_size): e for e in plain.rows}
    tiers = []
    for e in safe.rows:
        if not e.fits:
            continue
        tiers.append(e.status)
        before = by_key[(e.scenario.cluster.gpu.key, e.scenario.cluster.world_size)]
        assert e.micro_batch_size <= before.micro_batch_size
        if e.status == "fits":
            assert e.headroom_fraction >= 0.05
        else:  # tight: not even micro-batch 1 leaves 5 % free, so it runs at the largest that fits at all
            assert e.micro_batch_size == before.micro_batch_size and e.headroom_fraction < 0.05
    assert "tight" in tiers and "fits" in tiers and tiers == sorted(tiers, key=lambda t: t == "tight")
    with pytest.raises(FtscopeError, match="--margin"):
        ftscope.plan(s, gpus=["l40s"], margin=1.0)


def test_pareto_front_is_every_row_no_other_beats_on_both():
    """The sorted sweep equals the definition (no other row at most as slow and as dear, and better on one), ties
    and rows without a price included."""
    import random
    from types import SimpleNamespace as Row

    rng = random.Random(7)
    for _ in range(500):
        rows = [Row(fits=rng.random() < 0.8, run=Row(hours=rng.choice([1.0, 2.0, rng.random()]),
                                                     usd=rng.choice([None, 1.0, 2.0, rng.random()])))
                for _ in range(rng.randint(0, 20))]
        pts = [(i, r.run.hours, r.run.usd) for i, r in enumerate(rows) if r.fits and r.run.usd is not None]
        expected = [i for i, h, u in pts if not any(h2 <= h and u2 <= u and (h2 < h or u2 < u) for _, h2, u2 in pts)]
        assert pareto_front(rows) == expected


def _eager(s, gpus, counts, nodes=1, by="cost", margin=0.0, solve_batch=True):
    """Every candidate estimated in full (the path plan took before its rows became lazy), sorted by _rank_key."""
    from ftscope.estimate.efficiency import load_calibration
    from ftscope.estimate.shared import Shared
    from ftscope.spec.hardware import gpu_from_catalog
    from ftscope.plan.search import estimate_with_margin
    cal = load_calibration()
    base = s.with_(micro_batch_size="max") if solve_batch else s
    shared = Shared(base)  # a fresh memo: nothing computed by the plan under test is reused
    rows = [estimate_with_margin(base.with_(gpu=gpu_from_catalog(g), gpus_per_node=c, nodes=nodes), margin, cal, shared)
            for g in gpus for c in counts]
    return sorted(rows, key=lambda e: _rank_key(e, by))


EAGER_CASES = [  # dense, MoE, QLoRA, multi-node, fixed batch, margins, both rankings
    ("llama-2-7b", {"method": "full", "zero_stage": 3}, None, [1, 2, 4, 8], 1, "cost", 0.0, True),
    ("llama-2-7b", {"method": "lora"}, None, [8], 4, "time", 0.1, True),
    ("mixtral-8x7b", None, None, [1, 2, 4, 8], 1, "cost", 0.0, True),
    ("mixtral-8x7b", {"zero_stage": 3}, None, [1, 2, 4], 1, "time", 0.05, True),
    ("mixtral-8x7b", {"method": "full", "fsdp": "full_shard"}, None, [8], 8, "cost", 0.0, True),
    ("mixtral-8x7b", None, {"micro_batch_size": 4}, [1, 2, 4], 1, "time", 0.1, False),
]


@pytest.mark.parametrize("model,mix,wl,counts,nodes,by,margin,solve", EAGER_CASES)
def test_rows_rank_and_front_are_those_of_estimating_every_candidate(model, mix, wl, counts, nodes, by, margin, solve):
    s = scn(model, mix, wl)
    gpus = ["a40", "a100-80gb", "h100-80gb", "l4", "t4", "b200", "rtx-4090"]
    p = ftscope.plan(s, gpus=gpus, counts=counts, nodes=nodes, by=by, margin=margin, solve_batch=solve)
    eager = _eager(s, gpus, counts, nodes, by, margin, solve)
    assert list(p.rows) == eager  # the same estimates (every field, floats equal), in the same order
    assert [r.to_dict() for r in p.rows] == [r.to_dict() for r in eager]
    assert p.pareto == pareto_front(eager)
    assert p.best == (eager[0] if eager[0].fits and eager[0].time is not None else None)
    assert one_row_per_gpu(p) == [r for i, r in enumerate(eager)
                                  if r.scenario.cluster.gpu.key not in {e.scenario.cluster.gpu.key for e in eager[:i]}]


def test_rows_are_estimated_when_read():
    from ftscope.plan.search import Rows
    p = ftscope.plan(scn(), gpus=GPUS, counts=[1, 2, 4])
    assert isinstance(p.rows, Rows)
    assert sum(e is not None for e in p.rows._made) == 0  # ranked on their figures; the best too, until read
    assert p.best is p.rows[0] and p.best.fits
    assert sum(e is not None for e in p.rows._made) == 1
    first = p.rows[3]
    assert p.rows[3] is first and p.rows[:4][3] is first and p.rows.scenario(3) is first.scenario
    assert len(p.rows) == len(list(p.rows)) == len(GPUS) * 3
    import copy
    import pickle
    for copied in (pickle.loads(pickle.dumps(p.rows)), copy.deepcopy(p.rows)):  # as the list of its estimates
        assert type(copied) is list and [e.to_dict() for e in copied] == [e.to_dict() for e in p.rows]


def test_a_figure_that_is_not_a_number_leaves_the_row_to_the_estimate(monkeypatch):
    """grid_figures gives None when a figure is not finite: plan then ranks on the estimate itself (whose own
    checks raise when it is wrong)."""
    import importlib
    search = importlib.import_module("ftscope.plan.search")  # ftscope.plan is also the function
    s = scn(mix={"method": "lora"})
    expected = ftscope.plan(s, gpus=GPUS, counts=[1, 2])
    monkeypatch.setattr(search, "grid_figures", lambda sh, sites, *a: [None] * len(sites))
    monkeypatch.setattr(search, "_SWEEPS", {})  # a fresh sweep: the repeated plan's ranking is not read back
    assert list(ftscope.plan(s, gpus=GPUS, counts=[1, 2]).rows) == list(expected.rows)


def test_a_repeated_plan_reads_its_ranking_back(monkeypatch):
    """The same sweep, sites, margin and key again: the ranking is read back (no grid is made), equal to the first,
    and each plan has its own front list."""
    import importlib
    search = importlib.import_module("ftscope.plan.search")
    s = scn(mix={"method": "lora", "zero_stage": 2})
    first = ftscope.plan(s, gpus=GPUS, counts=[1, 8], by="time", margin=0.05)
    monkeypatch.setattr(search, "grid_figures", lambda *a: pytest.fail("a repeated plan made its grid again"))
    again = ftscope.plan(s.with_(zero_stage=2), gpus=list(GPUS), counts=(1, 8), by="time", margin=0.05)
    assert list(again.rows) == list(first.rows) and again.pareto == first.pareto and again.feasible == first.feasible
    assert again.pareto is not first.pareto
