"""space: candidates are numbered in the order rows were always listed, and every dimension is declared once."""
from __future__ import annotations

import itertools
from dataclasses import fields, replace

import ftscope
import pytest

from ftscope.errors import FtscopeError
from ftscope.plan.space import (ENGINES, MIX_DIMENSIONS, SHARDING, SearchSpace, Space, for_engine, gpu_counts, layout,
                               twin_offsets, with_mix)
from ftscope.spec.hardware import gpu_from_catalog


def _scn(model: str = "olmoe-1b-7b", nodes: int = 1) -> object:
    return ftscope.load_scenario({"model": model, "hardware": {"gpu": "a100-80gb", "gpus_per_node": 4, "nodes": nodes},
                                  "mix": {"method": "lora"}, "workload": {"micro_batch_size": 1, "seq_len": 512}})


def test_mixes_come_in_product_order_of_the_declared_dimensions():
    scn, sp = _scn(), SearchSpace()
    space = Space(scn, [(scn.cluster.gpu, 2)], sp)
    expected = [replace(scn.mix, method=m, gradient_checkpointing=gc, zero_stage=z, fsdp=f, offload=o, attention=a,
                        optimizer=opt, experts_backend=b)
                for m, gc, (z, f), o, a, opt, b in itertools.product(
                    sp.methods, sp.gradient_checkpointing, sp.sharding, sp.offload, sp.attention, sp.optimizer,
                    sp.experts_backend)]
    assert list(space.mixes()) == expected
    assert [space.mix(k) for k in (0, 1, 17, len(expected) - 1)] == [expected[k] for k in (0, 1, 17, -1)]
    assert len(space) == 2 * len(expected)  # 1 and 2 GPUs


def test_dense_models_keep_the_scenarios_experts_backend():
    scn = _scn("llama-3.2-1b")
    space = Space(scn, [(scn.cluster.gpu, 1)], SearchSpace())
    assert {m.experts_backend for m in space.mixes()} == {scn.mix.experts_backend}
    assert "experts_backend" not in {d.space_field for d in space.dimensions}


def test_every_search_space_field_is_a_declared_dimension():
    assert [d.space_field for d in MIX_DIMENSIONS] == [f.name for f in fields(SearchSpace)]


def test_neighbours_are_every_candidate_one_dimension_away():
    scn = _scn()
    small = SearchSpace(methods=("lora", "qlora"), sharding=((0, None), (3, None)), offload=("none",),
                        experts_backend=("grouped_mm", "modules"))
    space = Space(scn, [(scn.cluster.gpu, 8), (gpu_from_catalog("h100-80gb"), 4)], small)

    def dims(s):
        return [d.get(s.mix) for d in MIX_DIMENSIONS] + [s.cluster.world_size, s.cluster.gpu.key]

    idx = 2 * space.mixes_per_block + 5  # a100-80gb x 4
    mine = dims(space.candidate(idx))
    one_away = {i for i in range(len(space)) if sum(a != b for a, b in zip(dims(space.candidate(i)), mine)) == 1}
    assert set(space.neighbours(idx)) == one_away
    assert len(one_away) == sum(r - 1 for r in space.radix) + 3 + 1  # other values; 1, 2, 8 GPUs; h100 x 4


def test_gpu_counts_and_multi_node_layouts():
    assert gpu_counts(1) == [1] and gpu_counts(6) == [1, 2, 4] and gpu_counts(8) == [1, 2, 4, 8]
    assert gpu_counts(12) == [1, 2, 4, 8, 12] and gpu_counts(32) == [1, 2, 4, 8, 16, 32]
    assert layout(4, 8) == (4, 1) and layout(32, 8) == (8, 4) and layout(12, 8) == (12, 1)
    space = Space(_scn(nodes=2), [(gpu_from_catalog("h100-80gb"), 16)], SearchSpace())
    assert [(b.base.cluster.gpus_per_node, b.base.cluster.nodes) for b in space.blocks] == [
        (1, 1), (2, 1), (4, 1), (4, 2), (4, 4)]  # the scenario's 4-GPU nodes


def test_with_mix_is_replace():
    scn = _scn()
    mix = replace(scn.mix, method="qlora", zero_stage=2)
    assert with_mix(scn, mix) == replace(scn, mix=mix) and with_mix(scn, mix).mix is mix


def test_an_engine_keeps_only_its_own_sharding_values():
    assert for_engine(SearchSpace(), None) == SearchSpace()
    assert for_engine(SearchSpace(), "deepspeed").sharding == ((0, None), (1, None), (2, None), (3, None))
    assert for_engine(SearchSpace(), "fsdp").sharding == ((0, "full_shard"), (0, "shard_grad_op"))
    assert sorted(ENGINES["deepspeed"] + ENGINES["fsdp"], key=str) == sorted(SHARDING, key=str)  # every value, once
    narrow = SearchSpace(sharding=((2, None), (0, "full_shard")))
    assert for_engine(narrow, "deepspeed").sharding == ((2, None),)  # the caller's own space is narrowed, not replaced
    with pytest.raises(FtscopeError, match="--engine must be one of deepspeed, fsdp; got 'zero3'"):
        for_engine(SearchSpace(), "zero3")
    with pytest.raises(FtscopeError, match="no fsdp sharding value"):
        for_engine(SearchSpace(sharding=((2, None),)), "fsdp")


def test_mix_runs_list_the_mixes_in_order_in_runs_of_the_free_trailing_dimensions():
    """Space.mix_runs gives every mix of `mixes`, equal and in order, grouped in runs whose mixes differ only in the
    trailing dimensions whose fields are free (none free: single mixes; the MoE layout dimensions: their product)."""
    import ftscope
    from ftscope.plan.recommend import _targets
    from ftscope.plan.space import LAYOUTS, SearchSpace, Space
    for model in ("llama-3.2-1b", "olmoe-1b-7b"):
        scn = ftscope.load_scenario({"model": model, "hardware": {"gpu": "a100-80gb"}, "mix": {"method": "lora"},
                                     "workload": {"micro_batch_size": 1, "seq_len": 1024, "num_samples": 100}})
        space = Space(scn, _targets(scn, ["a100-80gb:8"], False), SearchSpace(**LAYOUTS))
        every = list(space.mixes())
        for free, length in ((set(), 1), ({"context_parallel", "expert_parallel"}, 14 if scn.model.is_moe else 2),
                             ({"expert_parallel", "tensor_parallel"}, 7 if scn.model.is_moe else 1)):
            listed = []
            for start, n, first, run in space.mix_runs(free):
                mixes = list(run())
                assert start == len(listed) and n == len(mixes) == length and first == mixes[0]
                listed += mixes
            assert listed == every, (model, free)


def test_twin_offsets_point_each_fused_kernel_at_its_sdpa_sibling():
    """twin_offsets: a flash (or flash3) mix's sdpa sibling lies `offset` mixes back and differs only in the kernel,
    and its memory_mix is the same (the scan copies its probes); eager has no twin, and a space that does not
    search sdpa has none."""
    from ftscope.estimate.memory import memory_mix
    scn = _scn()
    space = Space(scn, [(scn.cluster.gpu, 2)], SearchSpace(attention=("eager", "sdpa", "flash", "flash3")))
    offsets = twin_offsets(space)
    assert set(offsets) == {"flash", "flash3"} and 0 < offsets["flash"] < offsets["flash3"]
    seen = 0
    for k, mix in enumerate(space.mixes()):
        if mix.attention in offsets:
            twin = space.mix(k - offsets[mix.attention])
            assert twin == replace(mix, attention="sdpa") and memory_mix(twin) == memory_mix(mix)
            seen += 1
    assert seen == space.mixes_per_block // 2  # flash and flash3: two of the four kernels
    assert twin_offsets(Space(scn, [(scn.cluster.gpu, 2)], SearchSpace(attention=("eager", "flash")))) == {}
