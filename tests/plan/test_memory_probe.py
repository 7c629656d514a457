"""memory_probe: the memory models one mix gets on several GPU counts at once are memory_model's, field for field.

memory_models builds them together (estimate/memory.py build_memory_models: what does not read the GPU count is
computed once); if a part that reads the count were hoisted out of the per-count loop, models built together would
differ from each built alone, and these tests fail and say on which scenario.
"""
from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

import ftscope
from ftscope.estimate.memory import memory_model
from ftscope.plan.memory_probe import FLOOR_FREE, MemoryProbe, StateFloor, memory_models
from ftscope.plan.space import SHARDING
from ftscope.spec.hardware import gpu_from_catalog

WORLDS = ((1, "a100-80gb"), (2, "t4"), (8, "h200"), (16, "h100-80gb"), (64, "a40"))
"""GPU counts, each on another GPU type: the models differ in the count and in the capacity."""


def _scn(model: str, framework: str, **workload) -> object:
    return ftscope.load_scenario({"model": model, "hardware": {"gpu": "a100-80gb"}, "framework": framework,
                                  "mix": {"method": "lora"},
                                  "workload": {"micro_batch_size": 1, "seq_len": 1024, "num_samples": 1000,
                                               **workload}})


def _on(scn, world: int, gpu: str):
    cluster = replace(scn.cluster, gpu=gpu_from_catalog(gpu), gpus_per_node=min(world, 8), nodes=max(1, world // 8))
    return replace(scn, cluster=cluster)


@pytest.mark.parametrize("model, framework", [("llama-3.2-1b", "hf-trainer"), ("olmoe-1b-7b", "hf-trainer"),
                                              ("llama-3.2-1b", "torchtune-0.1"), ("llama-3.2-1b", "fsdp-qlora"),
                                              ("mixtral-8x7b", "peft-kbit"), ("llama-3.2-1b", "torchtitan"),
                                              ("llama-3.2-1b", "peft-sft-2024")])
def test_memory_models_are_memory_models_on_every_gpu_count(model, framework):
    """Every method, sharding, offload and optimizer (paged included), checkpointed or not, with and without a
    tensor x pipeline (x expert) layout, accumulating or not, on 1 to 64 GPUs of five types."""
    base = _scn(model, framework)
    checked = 0
    policies: dict = {}  # shared by every mix, as a search shares it
    for method, (zero, fsdp), offload, optimizer, ckpt, layout, ga in itertools.product(
            ("full", "lora", "qlora"), SHARDING, ("none", "optimizer", "optimizer+params"),
            ("adamw", "paged_adamw_8bit"), (False, True),
            (dict(), dict(tensor_parallel=2, sequence_parallel=True, pipeline_parallel=2)), (1, 4)):
        mix = replace(base.mix, method=method, zero_stage=zero, fsdp=fsdp, offload=offload, optimizer=optimizer,
                      gradient_checkpointing=ckpt, **layout)
        if base.model.is_moe and layout:
            mix = replace(mix, expert_parallel=2)
        scn = base.with_(gradient_accumulation=ga)
        scns = [_on(replace(scn, mix=mix), world, gpu) for world, gpu in WORLDS
                if world % mix.model_parallel == 0]
        built = memory_models(scns, policies)
        assert built == memory_models(scns)
        # a state floor shared with a mix that differs in FLOOR_FREE fields, made on another GPU count
        floor = StateFloor(replace(_on(base, 2, "t4"), mix=replace(mix, attention="eager", loss="chunked",
                                                                   gradient_checkpointing=not ckpt)))
        assert memory_models(scns, policies, floor) == built
        assert built == [memory_model(s) for s in scns], (method, zero, fsdp, offload, optimizer, ckpt, layout, ga)
        assert all(replace(m) == m for m in built)  # every field set (built without the dataclass's __init__)
        checked += len(scns)
    assert checked > 1000


def test_a_probe_given_its_model_answers_as_one_that_builds_it():
    scn = _on(_scn("olmoe-1b-7b", "hf-trainer"), 8, "h200")
    given, built = MemoryProbe(scn, 1024, model=memory_models([scn])[0]), MemoryProbe(scn, 1024)
    assert given.peak_at_one == built.peak_at_one and given.batch_terms() == built.batch_terms()
    assert given.fixed_batch_peak(80e9, 64) == built.fixed_batch_peak(80e9, 64)
    assert memory_models([]) == []


def test_the_activation_policy_reads_only_the_policy_fields():
    """memory_models keeps one activation policy per POLICY_FIELDS value: changing any other Mix field (offload,
    optimizer, tensor-parallel overlap, pipeline schedule, context-parallel implementation, expert parallelism)
    leaves a policy unchanged, on dense and MoE models, with and without a layout and checkpointing."""
    from ftscope.estimate.activations import activation_coefficients, activation_mix
    from ftscope.estimate.memory_layout import activation_policy
    from ftscope.plan.memory_probe import POLICY_FIELDS
    from ftscope.spec.mix import Mix
    others = dict(offload="optimizer", optimizer="adamw_8bit", tp_comm_overlap=True, pipeline_schedule="interleaved",
                  context_parallel_impl="all_to_all", expert_parallel=2)
    assert set(others) | set(POLICY_FIELDS) == {f.name for f in __import__("dataclasses").fields(Mix)}
    changed = 0
    for model in ("llama-3.2-1b", "olmoe-1b-7b"):
        base = _scn(model, "hf-trainer")
        for extra in (dict(), dict(gradient_checkpointing=True), dict(compile=True),
                      dict(tensor_parallel=2, sequence_parallel=True, pipeline_parallel=2, virtual_stages=2,
                           context_parallel=2)):
            scn = replace(base, mix=replace(base.mix, **extra))
            want = activation_policy(activation_coefficients(scn.model, activation_mix(scn.mix), scn.top_k,
                                                             scn.recipe), scn)
            for name, value in others.items():
                other = replace(scn, mix=replace(scn.mix, **{name: value}))
                assert activation_policy(activation_coefficients(other.model, activation_mix(other.mix), other.top_k,
                                                                 other.recipe), other) == want, (model, extra, name)
            for name in ("gradient_checkpointing", "tensor_parallel", "context_parallel"):  # a policy field moves it
                flip = {"gradient_checkpointing": not scn.mix.gradient_checkpointing}.get(name, 4)
                moved = replace(scn, mix=replace(scn.mix, **{name: flip}))
                changed += activation_policy(activation_coefficients(moved.model, activation_mix(moved.mix),
                                                                     moved.top_k, moved.recipe), moved) != want
    assert changed > 10


@pytest.mark.parametrize("model", ["llama-3.2-1b", "olmoe-1b-7b", "mixtral-8x7b"])
def test_a_state_floor_reads_no_floor_free_field(model):
    """The search shares one StateFloor among mixes that differ only in FLOOR_FREE fields: changing any of them
    changes none of its state bytes nor its floor on 1 to 64 GPUs, for every method, sharding, offload, optimizer
    and layout; a field it reads (the optimizer) does move it."""
    changes = dict(attention="eager", gradient_checkpointing=True, checkpointing="selective", checkpoint_every=2,
                   loss="chunked", fused_elementwise=True, lora_dropout=0.1, sequence_parallel=True,
                   tp_comm_overlap=True, pipeline_schedule="interleaved", context_parallel_impl="all_to_all")
    assert set(changes) == set(FLOOR_FREE)
    base = _scn(model, "hf-trainer")
    moved = 0
    for method, (zero, fsdp), offload, optimizer, layout in itertools.product(
            ("full", "lora", "qlora"), SHARDING, ("none", "optimizer", "optimizer+params"), ("adamw", "adamw_8bit"),
            (dict(), dict(tensor_parallel=2, pipeline_parallel=2, context_parallel=2))):
        mix = replace(base.mix, method=method, zero_stage=zero, fsdp=fsdp, offload=offload, optimizer=optimizer,
                      **layout, **(dict(expert_parallel=2) if base.model.is_moe and layout else {}))
        want = StateFloor(replace(base, mix=mix))
        facts = lambda f: (f.frozen, f.trainable, f.per, f.replicated, f.split, [f.at(w) for w in (8, 16, 64)])
        for name, value in changes.items():
            got = StateFloor(replace(base, mix=replace(mix, **{name: value})))
            assert facts(got) == facts(want), (method, zero, fsdp, offload, optimizer, layout, name)
        moved += facts(StateFloor(replace(base, mix=replace(mix, optimizer="sgd")))) != facts(want)
    assert moved > 20


@pytest.mark.parametrize("model, framework", [("llama-3.2-1b", "hf-trainer"), ("olmoe-1b-7b", "peft-kbit"),
                                              ("mixtral-8x7b", "fsdp-qlora"), ("llama-3.2-1b", "torchtune-0.1"),
                                              ("mixtral-8x7b", "llama-factory-2024")])
def test_forward_transients_read_no_transient_free_field(model, framework):
    """probe_part keeps one forward_transients per value of the Mix fields outside TRANSIENT_FREE: changing any of
    these leaves it unchanged for every method, sharding, checkpointing, expert storage, compile and precision,
    on dense and MoE models and recipes with and without k-bit copies; a field it reads moves it."""
    from ftscope.estimate.weight_memory import forward_transients
    from ftscope.plan.memory_probe import TRANSIENT_FREE
    changes = dict(attention="eager", offload="optimizer+params", optimizer="paged_adamw_8bit", experts_top_k=1,
                   loss="fused_linear", fused_elementwise=True, lora_dropout=0.1, checkpointing="selective",
                   checkpoint_every=2, tensor_parallel=2, sequence_parallel=True, tp_comm_overlap=True,
                   pipeline_parallel=2, pipeline_schedule="interleaved", virtual_stages=2, context_parallel=2,
                   context_parallel_impl="all_to_all", expert_parallel=2, optimizer_in_backward=True,
                   activation_offload=True)
    assert set(changes) == set(TRANSIENT_FREE)
    base = _scn(model, framework)
    moved = 0
    for method, (zero, fsdp), ckpt, backend, compile_, precision in itertools.product(
            ("full", "lora", "qlora"), SHARDING, (False, True), ("grouped_mm", "modules"), (False, True),
            ("bf16-mixed", "fp32")):
        mix = replace(base.mix, method=method, zero_stage=zero, fsdp=fsdp, gradient_checkpointing=ckpt,
                      experts_backend=backend, compile=compile_, precision=precision)
        want = forward_transients(replace(base, mix=mix))
        for name, value in changes.items():
            got = forward_transients(replace(base, mix=replace(mix, **{name: value})))
            assert got == want, (method, zero, fsdp, ckpt, backend, compile_, precision, name)
        moved += forward_transients(replace(base, mix=replace(mix, method="qlora" if method != "qlora" else "lora"))
                                    ) != want
    assert moved > 50
