"""engine: the pruned search answers exactly what estimating every candidate answers (issue 21's acceptance).

Each case runs recommend twice, pruned and exhaustive, over a space small enough to estimate in full, and
compares the JSON of the top-10 rows, the first rejected rows, the best, the best ZeRO candidate, the
explanation and the counts per reason, character for character.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import ftscope
from ftscope.plan.engine import TopK
from ftscope.plan.scan import Scan
from ftscope.plan.recommend import SearchSpace, explain, recommend
from ftscope.plan.ranking import rank_key

ROOT = Path(__file__).resolve().parents[2]
SPACE = SearchSpace(methods=("full", "lora", "qlora"), attention=("sdpa", "flash"), offload=("none", "optimizer"),
                    optimizer=("adamw", "adamw_8bit"), experts_backend=("grouped_mm", "modules"))


def _scn(model: str, method: str = "lora", batch: int | str = 1, seq: int = 2048, framework: str = "hf-trainer",
         **workload) -> object:
    wl = {"micro_batch_size": batch, "seq_len": seq, "padding": "packed", "num_samples": 4000, **workload}
    return ftscope.load_scenario({"model": model, "hardware": {"gpu": "a100-80gb"}, "framework": framework,
                                  "mix": {"method": method, "attention": "flash"}, "workload": wl})


DYNAMIC = {"padding": "dynamic", "seq_len": 1024,
           "dataset": {"num_samples": 15000, "mean_tokens": 187, "median_tokens": 174, "p99_tokens": 411,
                       "max_tokens": 1024}}
GRID = {
    "dense, fixed global batch": (_scn("llama-2-7b", batch=4), dict(gpus=["a100-80gb:4", "a40:2"])),
    "dense, solved batch, by cost": (_scn("llama-3.1-8b", batch="max"), dict(gpus=["l40s:4", "h100-80gb:2"], by="cost")),
    "MoE, dynamic padding": (_scn("mixtral-8x7b", "qlora", batch="max", **DYNAMIC), dict(gpus=["h100-80gb:8", "a40:2"])),
    "QLoRA 70B, by memory": (_scn("llama-2-70b", "qlora", batch=2, seq=4096), dict(gpus=["a100-80gb:8"], by="memory")),
    "multi-node": (_scn("llama-2-70b", batch=8, seq=4096), dict(gpus=["h100-80gb:32"])),
    "TRL's fused loss (memory concave in the batch)": (_scn("llama-3.1-8b", batch="max", seq=512, framework="trl-sft"),
                                                       dict(gpus=["a40:2", "h100-80gb:2"])),
    "--engine deepspeed (ZeRO 0-3 only)": (_scn("llama-2-13b", batch="max"), dict(gpus=["a100-80gb:4", "l40s:2"],
                                                                               engine="deepspeed")),
    "budget and deadline": (_scn("llama-2-13b", batch="max"), dict(gpus=["a100-80gb:8"], budget_usd=40.0,
                                                                    deadline_hours=3.0)),
    "5 % margin: tight after safe": (_scn("llama-3.1-8b", batch="max", seq=4096),
                                     dict(gpus=["rtx-4090:2", "l40s:2"], margin=0.05)),
    "5 % margin, fixed global batch": (_scn("llama-3.1-8b", batch=2, seq=4096),
                                       dict(gpus=["rtx-4090:2", "a40:2"], margin=0.05)),
}


def _visible(rec) -> str:
    d = rec.to_dict()
    return json.dumps({k: d[k] for k in ("rows", "best", "best_deepspeed", "explanation", "counts", "by")}, default=str)


def _pruned_and_exhaustive(scn, space, kw):
    """Both searches, after checking the pruned one answers exactly what the exhaustive one does, with no bound
    broken on the way."""
    pruned = recommend(scn, space=space, **kw)
    full = recommend(scn, space=space, exhaustive=True, **kw)
    assert _visible(pruned) == _visible(full)
    assert pruned.summary.bound_violations == 0 and not pruned.summary.exhaustive
    return pruned, full


@pytest.mark.parametrize("case", list(GRID))
def test_pruned_search_returns_what_the_exhaustive_one_does(case):
    scn, kw = GRID[case]
    pruned, full = _pruned_and_exhaustive(scn, SPACE, kw)
    assert pruned.best is not None and pruned.summary.feasible > 10
    assert pruned.summary.complete and pruned.summary.unsearched == 0
    if "budget_usd" not in kw:  # a budget needs the exact dollars of every candidate whose bound is within it
        assert pruned.summary.estimates < full.summary.estimates / 2, (pruned.summary, full.summary)


@pytest.mark.parametrize("case", [c for c in GRID if "margin" in c])
def test_the_margin_cases_hold_tight_and_safe_candidates_and_rank_tight_last(case):
    scn, kw = GRID[case]
    every = []
    recommend(scn, space=SPACE, on_row=every.append, **kw)
    status = [c.estimate.status for c in every if c.feasible]
    assert status.count("tight") > 0 and status.count("fits") > 0
    rec = recommend(scn, space=SPACE, top=1000, **kw)
    ranked = [c.estimate.status for c in rec.rows if c.feasible]
    assert ranked == sorted(ranked, key=lambda s: s == "tight")
    no_margin = recommend(scn, space=SPACE, top=1000, **{**kw, "margin": 0.0})
    assert all(c.estimate.status == "fits" for c in no_margin.rows if c.feasible)
    assert len([c for c in no_margin.rows if c.feasible]) == len(ranked)  # the margin reorders, it rejects nothing


LAYOUT_SPACE = SearchSpace(methods=("full", "lora"), sharding=((0, None), (1, None), (3, None)), offload=("none",),
                           attention=("flash",), optimizer=("adamw",), experts_backend=("grouped_mm",),
                           tensor_parallel=((1, False), (2, True), (4, True)), pipeline_parallel=(1, 2, 4),
                           context_parallel=(1, 2), expert_parallel=(1, 4))
LAYOUT_GRID = {
    "dense layouts, fixed global batch, multi-node": (_scn("llama-2-13b", batch=4, gradient_accumulation=4),
                                                      dict(gpus=["h100-80gb:16", "a100-40gb:4"])),
    "MoE layouts, solved batch, by cost": (_scn("olmoe-1b-7b", batch="max", gradient_accumulation=4),
                                           dict(gpus=["h100-80gb:8", "a40:4"], by="cost")),
}


@pytest.mark.parametrize("case", list(LAYOUT_GRID))
def test_pruned_search_over_parallel_layouts_returns_what_the_exhaustive_one_does(case):
    scn, kw = LAYOUT_GRID[case]
    pruned, full = _pruned_and_exhaustive(scn, LAYOUT_SPACE, kw)
    assert pruned.summary.estimates < full.summary.estimates / 2, (pruned.summary, full.summary)
    ranked = [c.scenario.mix for c in full.rows if c.feasible]
    assert any(m.model_parallel > 1 for m in ranked), "a layout case whose top-10 holds no layout tests little"


def test_the_exhaustive_reference_is_a_full_stable_sort_of_every_candidate():
    scn, kw = GRID["MoE, dynamic padding"]
    every = []
    rec = recommend(scn, space=SPACE, on_row=every.append, **kw)
    assert len(every) == rec.summary.candidates
    ranked = sorted(every, key=lambda c: rank_key(c, "time"))  # stable: listing order breaks equal keys
    top = [c for c in ranked if c.feasible][:10]
    rejected = [c for c in ranked if not c.feasible][:10]
    as_json = lambda rows: json.dumps([c.to_dict() for c in rows], default=str)  # noqa: E731
    assert as_json(rec.rows) == as_json(top + rejected)
    assert rec.explanation == explain(ranked[0], ranked, "time")
    assert rec.summary.feasible == sum(c.feasible for c in every)
    reasons = {r: sum(1 for c in every if (c.reason or "").startswith(r)) for r in rec.summary.reasons}
    assert reasons == rec.summary.reasons


def test_a_time_budget_returns_what_it_has_and_says_how_much_it_covered():
    scn, kw = GRID["dense, fixed global batch"]
    for exhaustive in (False, True):
        rec = recommend(scn, space=SPACE, time_budget_s=1e-9, exhaustive=exhaustive, **kw)
        s = rec.summary
        assert not s.complete and s.covered < 1 and s.unsearched > 0
        assert s.feasible + sum(s.reasons.values()) + s.unsearched == s.candidates


def test_a_time_budget_leaves_the_exact_estimates_a_share_and_holds_after_the_scan(monkeypatch):
    """The scan stops at SCAN_SHARE of the budget, the time bounds at BOUND_SHARE, the ranking at the budget: a
    search the clock cuts in the scan (here slowed to 5 ms a mix) still estimates and ranks what it saw, in time."""
    import time
    from ftscope.plan import classify
    scn, kw = GRID["dense, fixed global batch"]
    monkeypatch.setattr(classify, "MIX_CHUNK", 8)
    mix = Scan.mix
    monkeypatch.setattr(Scan, "mix", lambda self, k, m: time.sleep(0.005) or mix(self, k, m))
    start = time.perf_counter()
    rec = recommend(scn, space=SPACE, time_budget_s=1.0, **kw)
    s = rec.summary
    assert time.perf_counter() - start < 2.0 and not s.complete and s.unsearched > 0  # 1 s, and start-up slack
    assert s.estimates > 0 and rec.best is not None


def test_top_k_keeps_the_k_smallest_keys_with_listing_order_breaking_ties():
    top = TopK(3)
    for idx, key in enumerate([(0, 2.0), (0, 1.0), (0, 2.0), (0, 3.0), (0, 1.0), (0, 2.0)]):
        top.push(key, idx, f"c{idx}")
    assert [item for _, _, item in top.items] == ["c1", "c4", "c0"]
    assert top.full and top.worst == ((0, 2.0), 0)


MOE_LAYOUT_SPACE = SearchSpace(methods=("full", "lora", "qlora"), sharding=((0, None), (3, None), (0, "full_shard")),
                               offload=("none", "optimizer+params"), attention=("sdpa", "flash"), optimizer=("adamw",),
                               experts_backend=("grouped_mm",), tensor_parallel=((1, False), (2, True)),
                               pipeline_parallel=(1, 2), context_parallel=(1,), expert_parallel=(1, 2, 4))


def test_moe_layouts_with_a_fixed_global_batch_and_a_margin_return_what_the_exhaustive_search_does(monkeypatch):
    """Expert parallelism with a fixed global batch and a 5 % margin, fused attention twins that copy their
    sibling's probes, GPU counts whose state floor rules out every memory model, probe arrays that grow: the
    pruned search answers exactly what estimating every candidate does."""
    from ftscope.plan import bounds
    floors = []
    at = bounds.StateFloor.at
    monkeypatch.setattr(bounds.StateFloor, "at", lambda self, world: floors.append(at(self, world)) or floors[-1])
    monkeypatch.setattr(sys.modules[Scan.__module__], "SLOT_CHUNK", 5)
    scn = _scn("olmoe-1b-7b", batch=2, gradient_accumulation=4)
    pruned, full = _pruned_and_exhaustive(scn, MOE_LAYOUT_SPACE, dict(gpus=["h100-80gb:8", "a40:4"], margin=0.05))
    assert pruned.summary.estimates < full.summary.estimates / 2, (pruned.summary, full.summary)
    ranked = [c.scenario.mix for c in full.rows if c.feasible]
    assert any(m.expert_parallel > 1 for m in ranked), "no expert-parallel layout in the top-10 tests little"
    assert pruned.summary.reasons["does not fit"] > 0 and max(floors) > 80e9  # some counts pruned on every GPU


def test_a_margin_layout_that_fits_where_the_full_capacitys_accumulation_does_not_is_counted_as_fitting():
    """Eager attention at 4,096 tokens on Llama-2-70B QLoRA, a global batch of 32 (8 x 4) kept on 1-8 GPUs: the full
    capacity's solve (micro-batch 2) keeps it with accumulation, whose model holds more and no longer fits, while
    the margin's micro-batch 1, which recommend._estimate runs, fits. The classification read the full capacity's
    layout and counted such candidates as not fitting (302 of 304 feasible on examples/llama2-70b-lora-zero3.yaml)."""
    scn = ftscope.load_scenario(ROOT / "examples" / "llama2-70b-lora-zero3.yaml")
    space = SearchSpace(methods=("qlora",), gradient_checkpointing=(True,), sharding=((0, None), (3, None)),
                        offload=("none",), attention=("eager",), optimizer=("adamw",))
    pruned, full = _pruned_and_exhaustive(scn, space, dict(gpus=["h100-80gb:8"], margin=0.05))
    assert full.summary.feasible >= 4


@pytest.mark.parametrize("margin", [0.0, 0.05])
@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_every_bundled_example_searches_exactly_what_the_exhaustive_one_does(example, margin):
    """The full default space (every mix, the scenario's GPU, counts up to its own), as `ftscope recommend` runs it:
    rows, counts per reason, best and explanation equal, character for character."""
    _pruned_and_exhaustive(ftscope.load_scenario(ROOT / "examples" / example), SearchSpace(), dict(margin=margin))


def test_the_ranking_order_is_lexsorts_chunk_by_chunk():
    """engine._ascending yields np.lexsort((bounds, tiers))'s order, ties and infinities and NaN included, whatever
    the chunk."""
    import numpy as np
    from ftscope.plan.engine import _ascending
    rng = np.random.default_rng(0)
    for n, whole, chunk in ((0, False, 3), (7, True, 3), (5000, True, 16), (5000, False, 16), (20000, True, 4096)):
        bounds = rng.integers(0, 50, n).astype(float) if whole else rng.random(n)
        bounds[rng.integers(0, max(n, 1), n // 10)] = np.inf
        bounds[rng.integers(0, max(n, 1), n // 20)] = np.nan
        tiers = rng.integers(0, 2, n).astype(np.int8)
        assert list(_ascending(np, bounds, tiers, chunk)) == np.lexsort((bounds, tiers)).tolist(), (n, chunk)


def test_the_collector_is_paused_for_the_pruned_search_and_at_work_for_its_exhaustive_fallback(monkeypatch):
    """The cyclic garbage collector is off while the pruned search runs and as it was afterwards; a broken bound
    sends the search to the exhaustive one, which runs with the collector on and answers what it answers alone."""
    import gc
    from ftscope.plan import engine

    scn, kw = GRID["dense, fixed global batch"]
    seen = []
    pruned = engine.Engine._pruned
    monkeypatch.setattr(engine.Engine, "_pruned", lambda self: seen.append(gc.isenabled()) or pruned(self))
    assert gc.isenabled()
    recommend(scn, space=SPACE, **kw)
    assert seen == [False] and gc.isenabled()
    exhaustive = engine.Engine.exhaustive
    monkeypatch.setattr(engine.Engine, "exhaustive", lambda self, *a: seen.append(gc.isenabled()) or
                        exhaustive(self, *a))
    check = engine.Engine._check
    monkeypatch.setattr(engine.Engine, "_check", lambda self, c, idx, cls: setattr(self, "violations", 1))
    broken = recommend(scn, space=SPACE, **kw)
    monkeypatch.setattr(engine.Engine, "_check", check)
    full = recommend(scn, space=SPACE, exhaustive=True, **kw)
    assert seen[1:3] == [False, True] and gc.isenabled()
    assert broken.summary.exhaustive and broken.summary.bound_violations == 1
    assert _visible(broken) == _visible(full)
