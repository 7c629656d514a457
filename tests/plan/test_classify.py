"""classify: every candidate's status without an estimate equals the status its estimate gives."""
from __future__ import annotations

import sys

import numpy as np

import ftscope
from ftscope.estimate.efficiency import load_calibration
from ftscope.plan.classify import FEASIBLE, FITS, NO_FIT, UNSEARCHED, UNSUPPORTED, classify
from ftscope.plan.engine import status_of
from ftscope.plan.recommend import _targets, evaluator
from ftscope.plan.space import SearchSpace, Space
from tests.plan.test_fit_test import capacities

SMALL = SearchSpace(methods=("full", "qlora"), sharding=((0, None), (2, None), (0, "full_shard")),
                    offload=("none", "optimizer+params"), attention=("eager", "flash"), optimizer=("adamw",),
                    experts_backend=("grouped_mm", "modules"))


def _space(batch):
    scn = ftscope.load_scenario({"model": "olmoe-1b-7b", "hardware": {"gpu": "a100-80gb"}, "mix": {"method": "lora"},
                                 "workload": {"micro_batch_size": batch, "seq_len": 4096, "num_samples": 1000}})
    return Space(scn, _targets(scn, ["t4:2", "a40:4", "h100-80gb:2"], False), SMALL)


def test_statuses_equal_what_the_estimates_say():
    for batch, global_batch in (("max", None), (8, 8)):
        space = _space(batch)
        cal = load_calibration()
        cls, cut = classify(np, space, "time", cal, {"top": None}, global_batch, None, None)
        evaluate = evaluator(global_batch, cal, None, None)
        got = cls.full(np).ravel()
        assert not cut and set(got.tolist()) == {UNSUPPORTED, NO_FIT, FITS}  # T4 lacks bf16 and FlashAttention
        for idx in range(len(space)):
            exact = status_of(evaluate(space.candidate(idx)).reason)
            assert {FITS: FEASIBLE}.get(int(got[idx]), int(got[idx])) == exact, (idx, space.candidate(idx).mix.label())


def test_progress_is_reported_and_a_spent_clock_leaves_candidates_unsearched():
    space = _space("max")
    calls = []
    cls, cut = classify(np, space, "time", load_calibration(), {"top": None}, None, 0.0,
                        lambda stage, done, total: calls.append((stage, done, total)))
    assert cut and (cls.full(np) == UNSEARCHED).all()
    assert calls and calls[0] == ("classify", 0, len(space))


def test_a_clock_spent_after_the_scan_leaves_the_unbounded_fitting_candidates_unsearched():
    """The time bounds stop at `stop_at` too (the scan at `scan_until`): what fits but has no bound is unsearched,
    the other statuses stay exact."""
    space = _space("max")
    cal = load_calibration()
    full, _ = classify(np, space, "time", cal, {"top": None}, None, None, None)
    cls, cut = classify(np, space, "time", cal, {"top": None}, None, 0.0, None, scan_until=float("inf"))
    want, got = full.full(np), cls.full(np)
    assert cut and (want == FITS).any()
    assert (got[want == FITS] == UNSEARCHED).all() and (got[want != FITS] == want[want != FITS]).all()


def test_only_mixes_some_block_can_run_have_columns():
    """A mix refused, or unsupported on every block, has no column: its candidates are counted unsupported; the
    positions of the others map to the space's candidate numbers in listing order."""
    from ftscope.plan.engine import REJECTED, _first_rejected
    space = _space("max")
    cls, _ = classify(np, space, "time", load_calibration(), {"top": None}, None, None, None)
    full = cls.full(np)
    assert len(cls.dead) and len(cls.columns) and len(cls.dead) + len(cls.columns) == space.mixes_per_block
    assert (full[:, cls.dead] == UNSUPPORTED).all()
    assert ((full[:, cls.columns] != UNSUPPORTED).any(axis=0)).all()  # a column has a candidate that may run
    positions = range(cls.status.size)
    numbers = [cls.index(p) for p in positions]
    assert numbers == sorted(numbers) and [cls.position(i) for i in numbers] == list(positions)
    assert cls.position(int(cls.dead[0])) is None
    assert full.ravel()[numbers].tolist() == cls.status.ravel().tolist()
    for k in (1, 10, 10_000):
        assert _first_rejected(np, cls, k) == np.flatnonzero(np.isin(full.ravel(), REJECTED))[:k].tolist()


def test_mixes_that_share_a_memory_model_copy_their_twins_probes_exactly(monkeypatch):
    """A fused attention kernel's mix copies its FUSED_ATTENTION sibling's peaks, batch terms and fixed-batch
    solves (equal memory models): every array equals the classification that probes each mix itself, with a
    fixed global batch and a margin, on GPUs without FlashAttention or without FlashAttention-3; and with probe
    arrays that start at 3 slots and grow."""
    scn = ftscope.load_scenario({"model": "olmoe-1b-7b", "hardware": {"gpu": "a100-80gb"}, "mix": {"method": "lora"},
                                 "workload": {"micro_batch_size": 4, "seq_len": 2048, "num_samples": 1000}})
    space = Space(scn, _targets(scn, ["t4:2", "a40:4", "h100-80gb:8"], False),
                  SearchSpace(methods=("lora", "qlora"), sharding=((0, None), (3, None)), offload=("none",),
                              attention=("flash", "eager", "sdpa", "flash3", "flash1"), optimizer=("adamw",),
                              experts_backend=("grouped_mm", "modules"), tensor_parallel=((1, False), (2, True)),
                              expert_parallel=(1, 2)))
    from ftscope.plan.scan import Scan as _Scan
    copies = []
    copy = _Scan._copy
    monkeypatch.setattr(_Scan, "_copy", lambda self, *a: copies.append(a) or copy(self, *a))
    cal = load_calibration()
    classify_module = sys.modules[_Scan.__module__]
    for global_batch, margin in ((None, 0.0), (16, 0.05)):
        fresh, _ = classify(np, space, "cost", cal, {"top": None}, global_batch, None, None, margin,
                            share_twins=False)
        monkeypatch.setattr(classify_module, "SLOT_CHUNK", 3)  # the probe arrays grow many times
        shared, _ = classify(np, space, "cost", cal, {"top": None}, global_batch, None, None, margin)
        monkeypatch.undo()
        monkeypatch.setattr(_Scan, "_copy", lambda self, *a: copies.append(a) or copy(self, *a))
        for name in ("status", "primary", "hours", "usd", "micro_batch", "micro_batch_max", "tier"):
            assert np.array_equal(shared.full(np, name), fresh.full(np, name), equal_nan=True), name
        assert (shared.full(np) == FITS).sum() > 0
    assert len(copies) > 20


def test_bounds_kept_at_the_fitting_candidates_read_as_flat_arrays():
    """AtFits (the bounds kept only where a candidate fits) answers what the dense array it stands for does: one
    position or many, the whole array, a comparison; an empty one holds its fill."""
    from ftscope.plan.classify import AtFits
    at, values = np.array([1, 4, 5, 11]), np.array([0.5, 2.0, np.nan, 7.0])
    dense = np.full((3, 4), np.inf)
    dense.ravel()[at] = values
    kept = AtFits(np, dense.shape, at, values, np.inf)
    assert np.array_equal(kept.dense(), dense, equal_nan=True)
    for pos in range(12):
        got = kept.flat[pos]
        assert got == dense.flat[pos] or (np.isnan(got) and np.isnan(dense.flat[pos])), pos
        assert type(got) is type(kept.flat[np.int64(pos)]) is np.float64  # a Python int reads like a numpy one
    some = np.array([0, 4, 11, 3])
    assert np.array_equal(kept.ravel()[some], dense.ravel()[some])
    assert np.array_equal(kept > 1.0, dense > 1.0)
    empty = AtFits(np, (2, 2), np.array([], np.int64), np.array([]), 0.0)
    assert empty.flat[3] == 0.0 and type(empty.flat[3]) is np.float64 and np.array_equal(empty.ravel()[np.array([0, 1])], [0.0, 0.0])


def test_refusal_reads_no_refusal_free_field():
    """The scan decides refusal once per distinct value of the Mix fields outside scan.REFUSAL_FREE: changing any of
    those fields never changes the answer, on refused and accepted mixes of a dense and an MoE model."""
    import itertools
    from dataclasses import fields, replace
    from ftscope.plan.ranking import refusal
    from ftscope.plan.scan import REFUSAL_FREE
    from ftscope.spec.mix import Mix
    changes = dict(nested_quant=False, lora_rank=64, lora_targets="attention", attention="eager", loss="chunked",
                   fused_elementwise=True, lora_dropout=0.1, context_parallel=2, context_parallel_impl="all_to_all",
                   expert_parallel=4, compile=True, optimizer_in_backward=True, activation_offload=True)
    assert set(changes) == set(REFUSAL_FREE) and set(REFUSAL_FREE) < {f.name for f in fields(Mix)}
    refused = accepted = 0
    for model in ("llama-3.2-1b", "olmoe-1b-7b"):
        base = ftscope.load_scenario({"model": model, "hardware": {"gpu": "a100-80gb"}, "mix": {"method": "lora"},
                                      "workload": {"micro_batch_size": 1, "seq_len": 1024, "num_samples": 100}})
        for method, (zero, fsdp), offload, optimizer, precision, ckpt, tp, pp, backend in itertools.product(
                ("full", "lora", "qlora"),
                ((0, None), (1, None), (2, None), (3, None), (0, "full_shard"), (2, "full_shard")),
                ("none", "optimizer", "optimizer+params"), ("adamw", "adamw_8bit"), ("bf16-mixed", "fp32"),
                (False, True), (1, 2), (1, 2), ("grouped_mm", "eager")):
            mix = replace(base.mix, method=method, zero_stage=zero, fsdp=fsdp, offload=offload, optimizer=optimizer,
                          precision=precision, gradient_checkpointing=ckpt, tensor_parallel=tp, pipeline_parallel=pp,
                          experts_backend=backend)
            want = refusal(base.model, mix)
            refused += want is not None
            accepted += want is None
            for name, value in changes.items():
                assert refusal(base.model, replace(mix, **{name: value})) == want, (model, mix.label(), name)
    assert refused > 500 and accepted > 100


def test_each_candidates_capacity_is_its_estimates():
    """The scan's capacity per block and mix (usable memory less NCCL's buffers, which read the GPU count, the node
    layout and the mix's parallel groups) is the one the estimate of that candidate decides its fit with."""
    from ftscope.estimate.memory import memory_model, usable_bytes
    from ftscope.plan.recommend import _targets
    from ftscope.estimate.comm_buffers import comm_key
    from ftscope.plan.scan import COMM_FIELDS, Scan
    scn = ftscope.load_scenario({"model": "olmoe-1b-7b", "hardware": {"gpu": "h100-80gb"}, "mix": {"method": "lora"},
                                 "workload": {"micro_batch_size": 1, "seq_len": 2048, "num_samples": 1000}})
    space = Space(scn, _targets(scn, ["h100-80gb:16", "a100-80gb:4"], False),
                  SearchSpace(methods=("lora",), sharding=((0, None), (3, None)), offload=("none",),
                              attention=("flash",), optimizer=("adamw",), experts_backend=("grouped_mm",),
                              tensor_parallel=((1, False), (2, True)), pipeline_parallel=(1, 2),
                              expert_parallel=(1, 2)))
    scan = Scan(np, space, {}, None)
    for k in range(space.mixes_per_block):
        scan.mix(k, space.mix(k))
    cols = np.flatnonzero(scan.slot >= 0)
    caps, _ = capacities(scan, cols)
    seen = set()
    for b, block in enumerate(space.blocks):
        for j, k in enumerate(cols.tolist()):
            if not scan.layout_ok[scan.w_of[b], k]:  # the layout does not run on this count: no estimate
                continue
            cand = space.candidate(b * space.mixes_per_block + k)
            assert space.coords(b * space.mixes_per_block + k) == (b, k)
            cap = memory_model(cand).capacity_bytes
            assert comm_key(cand)[3:-1] == tuple(getattr(cand.mix, f) for f in COMM_FIELDS)  # what the scan keys
            assert caps[b, j] == cap, (block.world, cand.mix.label())
            assert cap == usable_bytes(block.gpu) or block.world > 1
            seen.add(cap)
    assert len(seen) > 2 * len({b.gpu.key for b in space.blocks})  # counts and mixes move it


def test_signatures_that_differ_only_in_equal_rates_share_their_time_bounds(monkeypatch):
    """A signature whose ops_mix, checkpointing and rates equal an earlier one's (sdpa and flash attention: the
    same ops and, on these GPU types, the same rates) reuses its numbers: fewer work_rates calls than signatures
    with a bound, and every hours bound what a classification that computes each signature gives."""
    from ftscope.plan import classify as module
    scn = ftscope.load_scenario({"model": "olmoe-1b-7b", "hardware": {"gpu": "a100-80gb"}, "mix": {"method": "lora"},
                                 "workload": {"micro_batch_size": "max", "seq_len": 4096, "num_samples": 1000}})
    space = Space(scn, _targets(scn, ["a40:4", "h100-80gb:2"], False),
                  SearchSpace(methods=("lora", "qlora"), sharding=((0, None),), offload=("none",),
                              attention=("sdpa", "flash"), optimizer=("adamw",), experts_backend=("grouped_mm",)))
    cal = load_calibration()
    calls, work_rates, signature_work = [], module.work_rates, module._signature_work
    monkeypatch.setattr(module, "work_rates", lambda *a: calls.append(a[1].mix.attention) or work_rates(*a))
    shared, _ = classify(np, space, "time", cal, {"top": None}, None, None, None)
    assert sorted(set(calls)) == ["sdpa"]  # every flash signature took its sdpa twin's numbers
    monkeypatch.setattr(module, "_signature_work", lambda *a: signature_work(*a[:-1], {}))  # nothing kept
    calls.clear()
    every, _ = classify(np, space, "time", cal, {"top": None}, None, None, None)
    assert sorted(set(calls)) == ["flash", "sdpa"]
    assert (shared.full(np) == FITS).any()
    assert shared.full(np, "hours").tobytes() == every.full(np, "hours").tobytes()


def test_fixed_batch_peaks_settled_a_few_probes_at_a_time_are_the_same(monkeypatch):
    """Scan.settle reads the fixed-batch peaks PROBE_CHUNK probes at a time: two at a time gives every array the
    classification gives in one piece, with a fixed global batch, with and without a margin, by memory (solves)
    and by cost."""
    from ftscope.plan import scan as scan_module
    scn = ftscope.load_scenario({"model": "olmoe-1b-7b", "hardware": {"gpu": "a100-80gb"}, "mix": {"method": "lora"},
                                 "workload": {"micro_batch_size": 4, "seq_len": 2048, "num_samples": 1000}})
    space = Space(scn, _targets(scn, ["t4:2", "a40:4", "h100-80gb:8"], False),
                  SearchSpace(methods=("lora", "qlora", "full"), sharding=((0, None), (3, None)), offload=("none",),
                              attention=("flash", "sdpa"), optimizer=("adamw",), tensor_parallel=((1, False), (2, True)),
                              expert_parallel=(1, 2)))
    cal = load_calibration()
    for by, global_batch, margin in (("cost", 16, 0.0), ("memory", 16, 0.05), ("memory", 64, 0.0)):
        whole, _ = classify(np, space, by, cal, {"top": None}, global_batch, None, None, margin)
        monkeypatch.setattr(scan_module, "PROBE_CHUNK", 2)
        pieces, _ = classify(np, space, by, cal, {"top": None}, global_batch, None, None, margin)
        monkeypatch.undo()
        for name in ("status", "primary", "hours", "usd", "micro_batch", "micro_batch_max", "tier"):
            assert np.array_equal(pieces.full(np, name), whole.full(np, name), equal_nan=True), (by, name)
        assert (whole.full(np) == FITS).sum() > 0
