"""bounds: the facts the search relies on hold for the estimator as it is (tripwires for estimator changes).

Each test states one assumption from plan/bounds.py and checks it on real models and mixes; if an estimator
change breaks one, the pruned search may stop being exact, and this file says which rule to revisit.
"""
from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

import ftscope
from ftscope.estimate import unsupported_reason
from ftscope.estimate.compute import micro_batch_ops
from ftscope.estimate.efficiency import load_calibration
from ftscope.estimate.memory import (DEFAULT_ALLOCATOR, build_memory_models, device_capacity, memory_model,
                                     usable_bytes)
from ftscope.estimate.time import step_time
from ftscope.plan.bounds import refined_hours, shortest_sequence
from ftscope.plan.classify import FITS, classify
from ftscope.plan.recommend import SearchSpace, evaluator
from ftscope.estimate.solvers import max_micro_batch
from ftscope.plan.space import Space
from ftscope.spec.hardware import gpu_from_catalog

DYNAMIC = {"padding": "dynamic", "seq_len": 2048,
           "dataset": {"num_samples": 5000, "mean_tokens": 300, "median_tokens": 250, "p99_tokens": 1200,
                       "max_tokens": 2048}}
MIXES = [dict(method=m, attention=a, experts_backend=b, gradient_checkpointing=gc)
         for m, a, b, gc in itertools.product(("full", "lora", "qlora"), ("eager", "sdpa"),
                                              ("eager", "grouped_mm", "modules"), (False, True))]


def _scn(model: str, batch: int | str = 1, framework: str = "hf-trainer", **mix) -> object:
    return ftscope.load_scenario({"model": model, "hardware": {"gpu": "a100-80gb", "gpus_per_node": 2},
                                  "framework": framework, "mix": {"method": "lora", **mix},
                                  "workload": {"micro_batch_size": batch, **DYNAMIC}})


def test_memory_model_reads_the_gpu_only_through_its_capacity():
    for mix in MIXES[::5]:
        a = memory_model(_scn("olmoe-1b-7b", **mix))
        for gpu in ("a40", "h200", "mi300x"):
            # built afresh (memory_model shares one model across GPU types on the strength of this property)
            on = _scn("olmoe-1b-7b", **mix).with_(gpu=gpu_from_catalog(gpu))
            b = build_memory_models([on], DEFAULT_ALLOCATOR)[0]
            assert b == replace(a, capacity_bytes=device_capacity(on))  # usable less NCCL's (two GPUs)


def test_gpu_support_does_not_depend_on_the_gpu_count():
    for gpu, mix in itertools.product(("t4", "v100-32gb", "a100-80gb"), MIXES[::3]):
        scn = _scn("olmoe-1b-7b", **mix).with_(gpu=gpu_from_catalog(gpu))
        assert len({unsupported_reason(scn.with_(gpus_per_node=n)) for n in (1, 2, 8)}) == 1


@pytest.mark.parametrize("model", ["llama-3.2-1b", "mixtral-8x7b"])
def test_fitting_at_micro_batch_one_is_fitting_at_all(model):
    for mix, gpu in itertools.product(MIXES[::2], ("t4", "a100-80gb")):
        mem = memory_model(_scn(model, **mix).with_(gpu=gpu_from_catalog(gpu)))
        for seq in (512, 2048, 8192):
            assert (max_micro_batch(mem, seq) > 0) == mem.fits(1, seq)


def test_padded_length_grows_with_the_micro_batch_and_starts_at_the_shortest():
    scn = _scn("llama-3.2-1b")
    lengths = [scn.workload.mean_padded_len(b) for b in range(1, 3000, 7)]
    assert lengths == sorted(lengths) and min(lengths) >= shortest_sequence(scn)


def test_compute_never_shrinks_with_the_length_nor_the_micro_batch():
    eff, _ = load_calibration().for_gpu("a100-80gb")

    def per_sequence(scn, batch, length):
        fixed = scn.with_(padding="max_length", seq_len=length)
        p = step_time(fixed, batch, eff, 10**7).breakdown_s
        return (p["forward"] + p["backward"] + p["recompute"] + p["dequant"]) / batch

    for model, mix in itertools.product(("llama-3.2-1b", "olmoe-1b-7b"), MIXES[::4]):
        scn = _scn(model, **mix)
        by_length = [per_sequence(scn, 4, s) for s in (64, 65, 700, 4096)]
        # host-bound: flat, up to the rounding of splitting a pass between dequantization and the rest
        assert all(b >= a * (1 - 1e-12) for a, b in zip(by_length, by_length[1:])), (model, mix)
        whole = [per_sequence(scn, b, 700) * b for b in (1, 2, 3, 8, 64)]  # a micro-batch's time grows with it
        assert all(b >= a * (1 - 1e-12) for a, b in zip(whole, whole[1:])), (model, mix)  # host-bound: flat


def test_dimensions_declared_compute_free_leave_the_flops_alone():
    scn = _scn("olmoe-1b-7b")
    space = Space(scn, [(scn.cluster.gpu, 1)], SearchSpace())
    free = [d for d in space.dimensions if not d.affects_compute]
    for d in free:
        ops = {tuple(micro_batch_ops(scn.with_(**d.assign(v)), 3, 500.0)) for v in getattr(SearchSpace(), d.space_field)}
        assert len(ops) == 1, d.space_field


@pytest.mark.parametrize("model,batch,gpus,framework", [("olmoe-1b-7b", "max", ["a40:2", "h100-80gb:4"], "hf-trainer"),
                                                        ("llama-2-7b", 4, ["a100-40gb:4"], "hf-trainer"),
                                                        ("llama-3.2-1b", "max", ["l4:2"], "trl-sft")])
def test_every_fitting_candidate_respects_its_bounds(model, batch, gpus, framework):
    from ftscope.plan.recommend import _targets
    scn = _scn(model, batch=batch, framework=framework)
    space = Space(scn, _targets(scn, gpus, False), SearchSpace(offload=("none",), optimizer=("adamw",),
                                                                experts_backend=("grouped_mm", "modules")))
    cal = load_calibration()
    gb = None if batch == "max" else batch * 2
    cls, _ = classify(np, space, "time", cal, {"top": None}, gb, None, None)
    evaluate = evaluator(gb, cal, None, None)
    fits = np.flatnonzero(cls.status.ravel() == FITS)  # positions in the classification's arrays
    assert len(fits) > 20
    for idx in fits.tolist():
        c = evaluate(space.candidate(cls.index(idx)))
        assert c.feasible, c.reason
        e = c.estimate
        assert cls.micro_batch.flat[idx] <= e.micro_batch_size <= cls.micro_batch_max.flat[idx]
        assert cls.hours.flat[idx] <= e.run.hours
        eff, _ = cal.for_gpu(space.candidate(cls.index(idx)).cluster.gpu.key)
        sharp = refined_hours(space.candidate(cls.index(idx)), int(cls.micro_batch.flat[idx]),
                              int(cls.micro_batch_max.flat[idx]), gb, eff)
        assert cls.hours.flat[idx] * 0.5 < sharp <= e.run.hours


LAYOUT_SPACE = SearchSpace(methods=("full", "lora"), sharding=((0, None), (1, None), (3, None)), offload=("none",),
                           attention=("flash",), optimizer=("adamw",), experts_backend=("grouped_mm",),
                           tensor_parallel=((1, False), (2, True), (4, True)), pipeline_parallel=(1, 2),
                           context_parallel=(1, 2), expert_parallel=(1, 2, 4))


@pytest.mark.parametrize("model,batch", [("llama-2-7b", 8), ("olmoe-1b-7b", "max")])
def test_parallel_layouts_respect_their_bounds(model, batch):
    """Tensor, pipeline, context and expert parallel candidates: the bounds hold with hours over the data-parallel
    replicas (a model-parallel group shares each micro-batch) and the pipeline's capped micro-batch."""
    from ftscope.plan.recommend import _targets
    scn = _scn(model, batch=batch).with_(gradient_accumulation=2)
    space = Space(scn, _targets(scn, ["h100-80gb:16"], False), LAYOUT_SPACE)
    cal = load_calibration()
    gb = None if batch == "max" else 64
    cls, _ = classify(np, space, "time", cal, {"top": None}, gb, None, None)
    evaluate = evaluator(gb, cal, None, None)
    fits = np.flatnonzero(cls.status.ravel() == FITS)  # positions in the classification's arrays
    layouts = {space.candidate(cls.index(i)).mix.model_parallel for i in fits.tolist()}
    assert len(fits) > 20 and layouts >= {1, 2, 4, 8}
    for idx in fits.tolist()[::3]:
        cand = space.candidate(cls.index(idx))
        c = evaluate(cand)
        assert c.feasible, c.reason
        e = c.estimate
        assert cls.micro_batch.flat[idx] <= e.micro_batch_size <= cls.micro_batch_max.flat[idx]
        eff, _ = cal.for_gpu(cand.cluster.gpu.key)
        sharp = refined_hours(cand, int(cls.micro_batch.flat[idx]), int(cls.micro_batch_max.flat[idx]), gb, eff)
        assert cls.hours.flat[idx] <= e.run.hours and sharp <= e.run.hours, cand.mix.label()


def test_the_refined_bound_counts_the_communication_no_compute_hides(monkeypatch):
    """Rule 4 adds the exposed collectives (expert parallelism's all-to-all, 1F1B's sends, tensor parallelism
    without overlap): sharper than with communication dropped, still at most the estimate's hours."""
    from ftscope.plan import bounds
    cal = load_calibration()
    eff, _ = cal.for_gpu("h100-80gb")
    evaluate = evaluator(64, cal, None, None)
    scn = _scn("olmoe-1b-7b", batch=2).with_(gpu=gpu_from_catalog("h100-80gb"), gpus_per_node=8, nodes=2,
                                              gradient_accumulation=2)
    for layout in (dict(expert_parallel=8), dict(pipeline_parallel=2), dict(tensor_parallel=2)):
        cand = scn.with_(**layout)
        est = evaluate(cand).estimate
        with_comm = refined_hours(cand, est.micro_batch_size, est.micro_batch_size, 64, eff)
        with monkeypatch.context() as m:
            parts = bounds.step_parts_and_transfers  # the step's parts, without its collectives
            m.setattr(bounds, "step_parts_and_transfers", lambda *a, **k: (*parts(*a, **k)[:-1], []))
            without = refined_hours(cand, est.micro_batch_size, est.micro_batch_size, 64, eff)
        assert without < with_comm <= est.run.hours, layout


def test_memory_reads_the_accumulation_only_as_accumulating_or_not():
    """MemoryProbe.fixed_batch_peak keeps one memory model for every accumulation above 1."""
    for mix in MIXES[::4]:
        scn = _scn("olmoe-1b-7b", **mix)
        models = [memory_model(scn.with_(gradient_accumulation=ga)) for ga in (1, 2, 3, 64)]
        assert models[1] == models[2] == models[3], mix


def test_the_probes_peak_is_the_memory_models():
    from ftscope.plan.bounds import MemoryProbe
    for mix in MIXES[::3]:
        scn = _scn("olmoe-1b-7b", **mix)
        for seq in (300, 2048):
            assert MemoryProbe(scn, seq).peak_at_one == memory_model(scn).peak_bytes(1, seq)


def test_probes_that_share_equal_memory_models_answer_as_fresh_ones():
    """classify lets probes with equal memory models share their peaks and solves: the answers stay each probe's."""
    from ftscope.plan.bounds import MemoryProbe
    memos: dict = {}
    caps = [usable_bytes(gpu_from_catalog(g)) for g in ("t4", "a40", "h200")]
    for mix in MIXES:
        scn = _scn("olmoe-1b-7b", **mix)
        shared, fresh = MemoryProbe(scn, 1024, memos), MemoryProbe(scn, 1024)
        assert shared.batch_terms() == fresh.batch_terms()
        for cap, gb in itertools.product(caps, (8, 512)):
            assert shared.max_micro_batch(cap) == fresh.max_micro_batch(cap)
            assert shared.fixed_batch_peak(cap, gb) == fresh.fixed_batch_peak(cap, gb)
    assert len(memos) < len(MIXES)  # the sharing is exercised: some mixes have equal memory models


def test_an_inexact_fixed_batch_peak_fits_where_the_exact_one_does():
    """fixed_batch_peak(exact=False), what a search by time or cost keeps: on every capacity the peak at 1 fits,
    it fits exactly where the exact peak fits (with and without accumulation, below and at the batch cap), and
    it is the exact peak where it needs no solve."""
    from ftscope.plan.bounds import MemoryProbe
    caps = [usable_bytes(gpu_from_catalog(g)) for g in ("t4", "rtx-4090", "a40", "a100-80gb", "h200")]
    solved = 0
    for mix in MIXES[::2]:
        for ga in (1, 4):
            scn = _scn("olmoe-1b-7b", **mix).with_(gradient_accumulation=ga)
            probe = MemoryProbe(scn, 1024)
            for cap, gb in itertools.product(caps, (8, 64, 4096)):
                if probe.peak_at_one > cap:
                    continue
                exact, fast = probe.fixed_batch_peak(cap, gb), probe.fixed_batch_peak(cap, gb, exact=False)
                assert (exact <= cap) == (fast <= cap), (mix, ga, cap, gb)
                if fast != exact:
                    solved += 1
                    assert ga > 1 and fast == probe.peak_at_one
    assert solved  # the shortcut is exercised


def test_sequence_work_shared_per_ops_mix_is_each_mixs_own():
    """sequence_work with a memo fits the ops once per ops_mix (checkpointing and the fused attention kernel left
    out) and gives every mix what it computes alone, passes included; the memo holds fewer fits than mixes."""
    from ftscope.plan.bounds import sequence_work
    for model in ("llama-3.2-1b", "olmoe-1b-7b"):
        memo: dict = {}
        mixes = [dict(method=method, gradient_checkpointing=ckpt, attention=attention, **extra)
                 for method in ("lora", "qlora") for ckpt in (False, True)
                 for attention in ("eager", "sdpa", "flash", "flash3")
                 for extra in (dict(), dict(checkpointing="selective"), dict(tensor_parallel=2, sequence_parallel=True))
                 if ckpt or not extra.get("checkpointing")]
        for mix in mixes:
            scn = _scn(model, **mix)
            assert sequence_work(scn, 700.0, memo) == sequence_work(scn, 700.0), (model, mix)
        fits = [k for k in memo if len(k) == 3]  # (ops_mix, length, one_length); the rest: the passes' lists
        assert 0 < len(fits) < len(mixes) / 4 and len(memo) - len(fits) < len(mixes)


@pytest.mark.parametrize("model", ["llama-3.2-1b", "olmoe-1b-7b", "mixtral-8x7b"])
def test_the_state_floor_is_below_every_peak(model):
    """StateFloor (weights and optimizer states alone) never exceeds the memory model's peak at micro-batch 1,
    for every method, sharding, offload and optimizer, with and without a layout, on 1 to 16 GPUs, and is
    often more than a quarter of it (it is not a vacuous 0)."""
    from ftscope.plan.bounds import MemoryProbe, StateFloor
    from ftscope.plan.space import SHARDING
    base = _scn(model)
    close = 0
    for method, (zero, fsdp), offload, optimizer, layout in itertools.product(
            ("full", "lora", "qlora"), SHARDING, ("none", "optimizer", "optimizer+params"), ("adamw", "adamw_8bit"),
            (dict(), dict(tensor_parallel=2, sequence_parallel=True, pipeline_parallel=2))):
        mix = replace(base.mix, method=method, zero_stage=zero, fsdp=fsdp, offload=offload, optimizer=optimizer,
                      **layout)
        if base.model.is_moe:
            mix = replace(mix, expert_parallel=2 if layout else 1)
        floor = StateFloor(replace(base, mix=mix))
        for world in (4, 16):
            scn = replace(base, mix=mix, cluster=replace(base.cluster, gpus_per_node=world if world <= 8 else 8,
                                                         nodes=1 if world <= 8 else world // 8))
            peak = MemoryProbe(scn, 2048).peak_at_one
            assert 0 <= floor.at(world) <= peak, (method, zero, fsdp, offload, optimizer, layout, world)
            close += floor.at(world) > 0.25 * peak
    assert close > 10


def test_op_rates_per_gpu_are_op_rates_on_each_gpu():
    """The array over GPU types holds exactly op_rates' numbers, for dense and MoE, eager and fused attention, FP8
    and torch.compile, on GPUs of several architectures."""
    from ftscope.plan.bounds import op_rates, op_rates_per_gpu, sequence_work
    cal = load_calibration()
    gpus = ["a100-80gb", "h100-80gb", "l40s", "mi300x", "t4"]
    from ftscope.estimate.time import rates
    each, tables = [rates(_scn("llama-3.2-1b"), load_calibration().for_gpu("a100-80gb")[0])] * len(gpus), {}
    for model, mix in itertools.product(("llama-3.2-1b", "olmoe-1b-7b"),
                                        (dict(), dict(attention="eager"), dict(compile=True), dict(fp8=True),
                                         dict(method="qlora", gradient_checkpointing=True))):
        base = _scn(model, **mix)
        work = sequence_work(base, 700.0)
        scns = [replace(base, cluster=replace(base.cluster, gpu=gpu_from_catalog(g))) for g in gpus]
        effs = [cal.for_gpu(g)[0] for g in gpus]
        got = op_rates_per_gpu(np, work, scns, effs)
        assert got.shape == (len(gpus), len(work), 4) and got.any()
        for g, (scn, eff) in enumerate(zip(scns, effs)):
            assert got[g].tolist() == [list(r) for r in op_rates(work, scn, eff)], (model, mix, gpus[g])
        # a rate table kept per op classes and rates (the classification's memo) answers what a fresh one does
        for _ in range(2):
            assert np.array_equal(op_rates_per_gpu(np, work, scns, effs, each, tables),
                                  op_rates_per_gpu(np, work, scns, effs, each)), (model, mix)
    assert 0 < len([k for k in tables if k[0] != "work"]) < 10  # rate tables; the rest: each work list's arrays


def test_the_work_at_one_length_is_the_fit_read_there():
    """sequence_work(one_length=True), what a packed workload's bounds read (every micro-batch pads to one length):
    at that length each op's FLOPs and bytes equal the three-length fit's wherever the fit has its form, for dense
    and MoE, LoRA, QLoRA and full, eager and fused attention, with and without a layout."""
    from ftscope.plan.bounds import sequence_work
    seen = 0
    for model, mix in itertools.product(
            ("llama-3.2-1b", "olmoe-1b-7b", "mixtral-8x7b"),
            (dict(), dict(method="qlora"), dict(method="full", attention="eager"),
             dict(tensor_parallel=2, sequence_parallel=True, pipeline_parallel=2, context_parallel=2))):
        scn = _scn(model).with_(gpus_per_node=8).with_(**mix)
        for seq in (512.0, 4096.0):
            one, fit = sequence_work(scn, seq, one_length=True), sequence_work(scn, seq)
            assert len(one) == len(fit) > 5
            for a, b in zip(one, fit):
                assert a.flops[1] == a.bytes[1] == 0.0 and a.passes == b.passes
                for x, y in ((a.flops, b.flops), (a.bytes, b.bytes)):
                    if y != (0.0, 0.0):
                        assert x[0] * seq == pytest.approx(y[0] * seq + y[1] * seq * seq, rel=1e-9), (model, mix)
                        seen += 1
    assert seen > 100


@pytest.mark.parametrize("model,batch", [("llama-2-7b", 8), ("olmoe-1b-7b", "max"), ("mixtral-8x7b", 4)])
def test_packed_candidates_respect_their_one_length_bounds(model, batch):
    """A packed workload's time bounds read the work at its one padded length (sequence_work's one_length): every
    fitting candidate's bound stays at most its estimate, with layouts, expert parallelism and QLoRA."""
    from ftscope.plan.recommend import _targets
    scn = ftscope.load_scenario({"model": model, "hardware": {"gpu": "h100-80gb", "gpus_per_node": 8},
                                 "mix": {"method": "lora"},
                                 "workload": {"micro_batch_size": batch, "gradient_accumulation": 2, "seq_len": 2048,
                                              "padding": "packed", "num_samples": 4000}})
    space = Space(scn, _targets(scn, ["h100-80gb:16", "a100-40gb:4"], False),
                  replace(LAYOUT_SPACE, methods=("lora", "qlora", "full")))
    cal = load_calibration()
    gb = None if batch == "max" else 64
    cls, _ = classify(np, space, "time", cal, {"top": None}, gb, None, None)
    evaluate = evaluator(gb, cal, None, None)
    fits = np.flatnonzero(cls.status.ravel() == FITS)
    assert len(fits) > 20
    for idx in fits.tolist()[::4]:
        cand = space.candidate(cls.index(idx))
        c = evaluate(cand)
        assert c.feasible, c.reason
        assert 0 < cls.hours.flat[idx] <= c.estimate.run.hours, cand.mix.label()


def test_a_pipelines_work_is_its_stage_share_of_the_work_without_it():
    """sequence_work with a memo fits a pipelined mix's ops once without the pipeline and gives each block op 1 /
    stages of it (the head whole): the fits a fresh call makes, to rounding, for dense and MoE, every method, eager
    and fused attention, with tensor, context and expert parallelism beside, at one length and three."""
    from ftscope.plan.bounds import sequence_work
    checked = 0
    for model, mix, pp in itertools.product(
            ("llama-3.2-1b", "olmoe-1b-7b", "mixtral-8x7b"),
            (dict(), dict(method="qlora", attention="eager"), dict(method="full", gradient_checkpointing=True),
             dict(tensor_parallel=2, sequence_parallel=True, context_parallel=2)), (2, 4)):
        layout = dict(mix, pipeline_parallel=pp, **({"expert_parallel": 2} if model != "llama-3.2-1b" else {}))
        scn = _scn(model).with_(gpus_per_node=8, nodes=2).with_(**layout)
        for one_length in (True, False):
            memo: dict = {}
            shared, fresh = sequence_work(scn, 1024.0, memo, one_length), sequence_work(scn, 1024.0, None, one_length)
            assert len([k for k in memo if len(k) == 3]) == 2 and len(shared) == len(fresh) > 5
            for a, b in zip(shared, fresh):
                assert (a.kind, a.passes) == (b.kind, b.passes)
                for x, y in zip(a.flops + a.bytes, b.flops + b.bytes):
                    assert x == pytest.approx(y, rel=1e-12, abs=0.0), (model, layout, one_length)
                    checked += y > 0
    assert checked > 500
