"""pass_bounds: one signature's micro-batch seconds on every GPU type at once equal bounds.micro_batch_seconds."""
from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

import ftscope
from ftscope.estimate.efficiency import load_calibration
from ftscope.plan.bounds import micro_batch_seconds
from ftscope.plan.pass_bounds import micro_batch_seconds_per_gpu
from ftscope.spec.hardware import gpu_from_catalog

GPUS = ["a100-80gb", "h100-80gb", "l40s", "mi300x", "rtx-4090", "b200"]


def _scn(model: str, **mix):
    return ftscope.load_scenario({"model": model, "hardware": {"gpu": "a100-80gb", "gpus_per_node": 2},
                                  "mix": {"method": "lora", **mix},
                                  "workload": {"micro_batch_size": 1, "seq_len": 2048, "gradient_accumulation": 4}})


@pytest.mark.parametrize("model", ["llama-3.2-1b", "olmoe-1b-7b"])
def test_micro_batch_seconds_per_gpu_are_each_gpus_own(model):
    """Dense and MoE; eager, sdpa and flash attention; checkpointing; QLoRA's dequantization; torch.compile's
    fused elementwise ops; grouped and per-expert matmuls; tensor parallelism; host-bound micro-batches of one
    short sequence and GPU-bound ones of 16 long ones."""
    cal = load_calibration()
    mixes = [dict(), dict(attention="eager"), dict(attention="flash", gradient_checkpointing=True),
             dict(method="qlora", gradient_checkpointing=True), dict(compile=True), dict(method="full"),
             dict(experts_backend="modules"), dict(tensor_parallel=2, sequence_parallel=True)]
    checked = 0
    memo: dict = {}
    for mix, (batch, length) in itertools.product(mixes, ((1, 37.0), (16, 2048.0))):
        if "experts_backend" in mix and model != "olmoe-1b-7b":
            continue
        base = _scn(model, **mix)
        scns = [replace(base, cluster=replace(base.cluster, gpu=gpu_from_catalog(g))) for g in GPUS]
        effs = [cal.for_gpu(g)[0] for g in GPUS]
        got = micro_batch_seconds_per_gpu(np, scns, effs, batch, length)
        # with a memo the op times are made once per op list and rates: the second call reads them
        for _ in range(2):
            assert micro_batch_seconds_per_gpu(np, scns, effs, batch, length, memo).tolist() == got.tolist()
        want = [micro_batch_seconds(s, batch, length, e) for s, e in zip(scns, effs)]
        assert got.tolist() == pytest.approx(want, rel=1e-12, abs=0), (mix, batch)
        assert len(set(want)) > 1
        checked += 1
    assert checked >= 14
    assert sum(k[0] == "times" for k in memo) <= checked  # flash with checkpointing shares nothing here; the repeats hit


def test_checkpointing_reads_the_shared_op_times_with_its_own_recompute():
    """Mixes that differ only in checkpointing share one op list and rates in the memo, and each gets its own
    micro_batch_seconds."""
    cal = load_calibration()
    memo: dict = {}
    for gc in (False, True):
        base = _scn("llama-3.2-1b", gradient_checkpointing=gc)
        scns = [replace(base, cluster=replace(base.cluster, gpu=gpu_from_catalog(g))) for g in GPUS]
        effs = [cal.for_gpu(g)[0] for g in GPUS]
        got = micro_batch_seconds_per_gpu(np, scns, effs, 4, 512.0, memo)
        want = [micro_batch_seconds(s, 4, 512.0, e) for s, e in zip(scns, effs)]
        assert got.tolist() == pytest.approx(want, rel=1e-12, abs=0), gc
    assert sum(k[0] == "times" for k in memo) == 1


def test_the_collectives_read_only_the_comm_fields():
    """exposed_seconds_per_sequence shares its numbers per COMM_FIELDS value: the other searched fields change
    no model-parallel transfer."""
    from ftscope.estimate.comm import model_parallel
    from ftscope.estimate.layout import layout
    base = _scn("olmoe-1b-7b").with_(gpu=gpu_from_catalog("h100-80gb"), gpus_per_node=8, nodes=2)
    eff = load_calibration().for_gpu("h100-80gb")[0]
    others = [dict(method="full"), dict(method="qlora"), dict(attention="eager"), dict(experts_backend="modules"),
              dict(zero_stage=3), dict(offload="optimizer"), dict(optimizer="adamw_8bit")]
    for par in (dict(expert_parallel=8), dict(tensor_parallel=2, sequence_parallel=True), dict(pipeline_parallel=2),
                dict(context_parallel=2, context_parallel_impl="all_to_all")):
        scn = base.with_(**par)
        want = model_parallel(scn, eff, 1, 512.0, layout(scn))
        assert want
        for change in others:
            other = scn.with_(**change)
            assert model_parallel(other, eff, 1, 512.0, layout(other)) == want, (par, change)


def test_exposed_communication_per_sequence_is_at_most_the_estimates():
    """Per sequence, the exposed model-parallel collectives are at most the estimate's communication per sequence
    (a step's over micro-batch x accumulation), and above 0 where some collective has no window."""
    from ftscope.plan.pass_bounds import exposed_seconds_per_sequence
    from ftscope.plan.recommend import evaluator
    cal = load_calibration()
    base = _scn("olmoe-1b-7b").with_(gpu=gpu_from_catalog("h100-80gb"), gpus_per_node=8, nodes=2)
    evaluate = evaluator(64, cal, None, None)
    for par in (dict(expert_parallel=8), dict(tensor_parallel=2, sequence_parallel=True), dict(pipeline_parallel=2),
                dict(context_parallel=2, context_parallel_impl="all_to_all"), dict()):
        scn = base.with_(**par)
        est = evaluate(scn).estimate
        eff = cal.for_gpu("h100-80gb")[0]
        bound = exposed_seconds_per_sequence(np, [scn], [eff], scn.mix, 2048.0, {})[0]
        per_sequence = est.time.breakdown_s["communication"] / (est.micro_batch_size *
                                                                est.scenario.workload.gradient_accumulation)
        assert 0 < bound <= per_sequence if par else bound == 0, (par, bound, per_sequence)


def test_the_rates_read_only_the_rate_fields_and_given_rates_change_nothing():
    """rates_per_gpu shares the rates per RATE_MIX_FIELDS value: the other searched fields (and the workload) change
    no rate; micro_batch_seconds_per_gpu with them equals it without."""
    from ftscope.estimate.time import rates
    from ftscope.plan.pass_bounds import rates_per_gpu
    cal = load_calibration()
    eff = cal.for_gpu("h100-80gb")[0]
    base = _scn("olmoe-1b-7b").with_(gpu=gpu_from_catalog("h100-80gb"), gpus_per_node=8)
    want = rates(base, eff)
    for change in (dict(method="full"), dict(gradient_checkpointing=True), dict(experts_backend="modules"),
                   dict(zero_stage=3), dict(offload="optimizer"), dict(optimizer="adamw_8bit"),
                   dict(tensor_parallel=2, sequence_parallel=True), dict(expert_parallel=4), dict(seq_len=333)):
        assert rates(base.with_(**change), eff) == want, change
    memo: dict = {}
    for mix in (dict(), dict(attention="eager"), dict(method="qlora", gradient_checkpointing=True)):
        scn = _scn("olmoe-1b-7b", **mix)
        scns = [replace(scn, cluster=replace(scn.cluster, gpu=gpu_from_catalog(g))) for g in GPUS]
        effs = [cal.for_gpu(g)[0] for g in GPUS]
        rated = rates_per_gpu(np, scns, effs, memo)
        assert rated[0] == [rates(s, e) for s, e in zip(scns, effs)]
        got = micro_batch_seconds_per_gpu(np, scns, effs, 2, 700.0, None, rated)
        assert got.tolist() == micro_batch_seconds_per_gpu(np, scns, effs, 2, 700.0).tolist()
    assert len(memo) == 2  # eager has its own rates; qlora with checkpointing shares the first's


def test_a_pipeline_stage_takes_its_share_of_the_op_times_without_the_pipeline():
    """With a memo, a pipelined mix's micro-batch seconds come from the op times of its ops without the pipeline, a
    block op's at 1 / stages (the head's whole): what its own ops give, to rounding, for dense and MoE, eager and
    flash attention, checkpointing, QLoRA, tensor and expert parallelism beside, short and long micro-batches."""
    cal = load_calibration()
    checked = 0
    for model, mix, pp, (batch, length) in itertools.product(
            ("llama-3.2-1b", "olmoe-1b-7b"),
            (dict(), dict(attention="eager"), dict(attention="flash", gradient_checkpointing=True),
             dict(method="qlora", gradient_checkpointing=True), dict(tensor_parallel=2, sequence_parallel=True)),
            (2, 4), ((1, 37.0), (16, 2048.0))):
        extra = dict(expert_parallel=2) if model == "olmoe-1b-7b" else {}
        base = _scn(model).with_(gpus_per_node=8, nodes=2).with_(pipeline_parallel=pp, **mix, **extra)
        scns = [replace(base, cluster=replace(base.cluster, gpu=gpu_from_catalog(g))) for g in GPUS]
        effs = [cal.for_gpu(g)[0] for g in GPUS]
        memo: dict = {}
        staged = micro_batch_seconds_per_gpu(np, scns, effs, batch, length, memo)
        own = micro_batch_seconds_per_gpu(np, scns, effs, batch, length)
        assert staged.tolist() == pytest.approx(own.tolist(), rel=1e-12, abs=0), (model, mix, pp, batch)
        (times,) = [v for k, v in memo.items() if k[0] == "times"]  # the whole model's, staged at 1 / pp
        assert list(times[3]) == [1 / pp]
        checked += 1
    assert checked == 40


def test_exposed_communication_of_some_blocks_is_theirs_of_all():
    """With `blocks`, exposed_seconds_per_sequence computes those blocks alone, once per COMM_FIELDS value, and each
    holds what a call over every block gives (the first mix of the value stands for the later ones)."""
    from ftscope.plan.pass_bounds import exposed_seconds_per_sequence
    cal = load_calibration()
    bases = [_scn("olmoe-1b-7b").with_(gpu=gpu_from_catalog(g), gpus_per_node=8, nodes=n)
             for g in ("h100-80gb", "a100-80gb") for n in (1, 2)]
    effs = [cal.for_gpu(b.cluster.gpu.key)[0] for b in bases]
    mix = bases[0].with_(expert_parallel=8, tensor_parallel=2, sequence_parallel=True).mix
    whole = exposed_seconds_per_sequence(np, bases, effs, mix, 2048.0, {})
    assert (whole > 0).all()
    memo: dict = {}
    some = exposed_seconds_per_sequence(np, bases, effs, mix, 2048.0, memo, [1, 3])
    assert some[[1, 3]].tolist() == whole[[1, 3]].tolist() and np.isnan(some[[0, 2]]).all()
    later = exposed_seconds_per_sequence(np, bases, effs, replace(mix, lora_rank=64), 2048.0, memo, [0])
    assert later is some and later[[0, 1, 3]].tolist() == whole[[0, 1, 3]].tolist()


def test_work_rates_are_op_rates_per_gpu_of_sequence_work():
    """work_rates (the classification's arrays) gives exactly op_rates_per_gpu(sequence_work(...)) with the same
    memo, for dense and MoE, every method, eager and fused attention, each checkpointing, pipelines and other
    layouts, at one length and three (the one length from arrays of the op lists' numbers); mixes that share an op
    list share its fits."""
    from ftscope.estimate.time import rates
    from ftscope.plan.bounds import op_rates_per_gpu, sequence_work
    from ftscope.plan.pass_bounds import work_rates
    cal = load_calibration()
    gpus = ["a100-80gb", "h100-80gb", "mi300x", "b200"]
    effs = [cal.for_gpu(g)[0] for g in gpus]
    checked = 0
    for model in ("llama-3.2-1b", "olmoe-1b-7b", "deepseek-v3"):
        memo: dict = {}
        for mix, pp, ckpt, one_length in itertools.product(
                (dict(), dict(method="qlora", attention="eager"), dict(method="full", compile=True),
                 dict(tensor_parallel=2, sequence_parallel=True, context_parallel=2)), (1, 2),
                (dict(gradient_checkpointing=False), dict(gradient_checkpointing=True),
                 dict(gradient_checkpointing=True, checkpointing="selective")), (True, False)):
            layout = dict(mix, pipeline_parallel=pp, **({"expert_parallel": 2} if model != "llama-3.2-1b" else {}))
            scn = _scn(model).with_(gpus_per_node=8, nodes=2).with_(**layout, **ckpt)
            scns = [replace(scn, cluster=replace(scn.cluster, gpu=gpu_from_catalog(g))) for g in gpus]
            each = [rates(s, e) for s, e in zip(scns, effs)]
            want = op_rates_per_gpu(np, sequence_work(scn, 1024.0, memo, one_length), scns, effs, each)
            got = work_rates(np, scn, 1024.0, memo, one_length, [scn], effs, each)
            assert got.tobytes() == want.tobytes(), (model, layout, ckpt, one_length)
            # laid out alike, so that seconds_per_sequence sums the ops in the same order
            assert got.strides == want.strides, (model, layout, ckpt, one_length)
            checked += 1
        assert sum(k[0] == "slope arrays" for k in memo) == 4 * 2  # per ops_mix without the pipeline, per length
    assert checked == 144
