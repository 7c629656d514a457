"""Init caches, FSDP1 unshard-stream pools and small-pool segments (estimate/reserved_floor.py)."""
from __future__ import annotations

import dataclasses

import pytest

import ftscope
from ftscope.estimate.memory import memory_model


def scn(model="llama-2-7b", per=8, nodes=1, attention="flash", wl=None, **mix):
    return ftscope.load_scenario({"model": model, "hardware": {"gpu": "h100-80gb", "gpus_per_node": per, "nodes": nodes},
                                  "mix": {"method": "full", "attention": attention, **mix},
                                  "workload": {"micro_batch_size": 1, "seq_len": 4096, "gradient_accumulation": 8,
                                               **(wl or {})}})


def test_fsdp1_init_cache_and_unshard_stream_pool_add_to_reserved_only():
    """fsdp_qlora's FSDP1: init (sync_module_states) leaves the largest unit's blocks cached, a floor under the
    reserved peak; the gathered units sit in the unshard stream's own pool, on top of the compute stream's bytes.
    Allocated bytes do not change; a recipe without those facts (FSDP2 under torchtune) has neither."""
    from ftscope.estimate.reserved_floor import fsdp1_init_cache, fsdp1_stream_bytes, fsdp1_units
    from ftscope.estimate.weight_memory import gathered_unit_bytes
    d = {"model": "llama-2-7b", "framework": "fsdp-qlora", "hardware": {"gpu": "rtx3090-24gb", "gpus_per_node": 2},
         "mix": {"method": "qlora"}, "workload": {"micro_batch_size": 1, "seq_len": 512}}
    s = ftscope.load_scenario(d)
    m = s.model
    root = (m.embedding_params + m.lm_head_params + m.final_norm_params) * 2.0
    init, pool, gathered = fsdp1_stream_bytes(s, 2.0, 2)
    assert init == fsdp1_init_cache(fsdp1_units(s, 2.0), 2)
    # the gathered blocks are the scenario's (4-bit data, norms in bf16) whatever init's replay is given
    assert pool == pytest.approx(root + 2 * gathered_unit_bytes(s)) and gathered == pytest.approx(pool)
    adapters = m.lora_params(s.mix.lora_rank, s.mix.lora_targets) / m.num_layers * 2.0  # bf16, with their block
    assert gathered_unit_bytes(s) == pytest.approx(m.largest_layer_params() * 0.5 + adapters, rel=1e-3)
    mm = memory_model(s)
    # bitsandbytes' FSDP units hold the 4-bit data alone (its quant_state is no parameter: weight_memory.kbit_state_bytes)
    assert mm.reserved_floor == pytest.approx(mm.weights + fsdp1_stream_bytes(s, 0.5, 2)[0])
    b = mm.breakdown(1, 512)
    assert b.peak_bytes >= mm.reserved_floor + mm.stream_pool
    off = dataclasses.replace(s.recipe, fsdp1_sync_init=False, fsdp1_unshard_stream=False)
    bare = memory_model(dataclasses.replace(s, recipe=off))
    assert bare.reserved_floor == 0 and bare.stream_pool == 0 and bare.stream_gathered == 0
    assert bare.breakdown(1, 512).peak_bytes < b.peak_bytes
    assert max(bare.breakdown(1, 512).phases.values()) == max(b.phases.values())  # allocated unchanged


def test_broadcast_buckets_close_at_the_limit_after_adding_a_tensor():
    from ftscope.estimate.reserved_floor import broadcast_buckets
    mib = 2**20
    assert broadcast_buckets([100 * mib, 100 * mib, 100 * mib, 10 * mib]) == [300 * mib, 10 * mib]
    assert broadcast_buckets([300 * mib, 1 * mib]) == [300 * mib, 1 * mib]
    assert broadcast_buckets([]) == []


def test_fsdp1_init_replay_one_unit_and_many():
    """One unit of one 2 MiB-aligned tensor: the parameter and its broadcast bucket take a segment each, the
    flat copy and the shard reuse them, so 2 S are reserved with S / n alive. Identical units after it: their
    live shards carve into the cache, so later units need segments of their own and the cache grows, but each
    unit's move, buckets and flat copy (3 S) bound what any one unit adds."""
    from ftscope.estimate.reserved_floor import fsdp1_init_cache
    s = 64 * 2**20
    assert fsdp1_init_cache(((s,),), 2) == 2 * s - s // 2
    one, many = fsdp1_init_cache(((s, s),), 4), fsdp1_init_cache(((s, s),) * 16, 4)
    assert one < many <= one + 16 * 2 * s // 4 + 3 * 2 * s


def test_fsdp1_init_floor_against_the_answerai_post():
    """Answer.AI's post reports 3.72 GiB reserved right after wrapping a Llama-2-7B QLoRA on two GPUs; the replayed
    init floor (sharded weights + what init left cached) sits below that, within 10 % (not fitted to it)."""
    d = {"model": "llama-2-7b", "framework": "fsdp-qlora", "hardware": {"gpu": "rtx3090-24gb", "gpus_per_node": 2},
         "mix": {"method": "qlora"}, "workload": {"micro_batch_size": 1, "seq_len": 512}}
    floor = memory_model(ftscope.load_scenario(d)).reserved_floor / 2**30
    assert 0.9 * 3.72 <= floor <= 3.72


def test_fsdp1_pre_unshard_stream_pool_under_offload_or_a_cast():
    """Under CPU offload (or a param_dtype other than the stored one) FSDP1 copies each unit's shard to the GPU on
    the pre-unshard stream before gathering it: that stream's pool adds the largest copies alive at once (the root's
    shard, or two blocks') to reserved, never to allocated. A unit already stored in bf16 (QLoRA's quant storage, a
    bf16 LoRA base) is not cast under bf16 mixed precision (`_uses_param_mixed_precision` is fwd_bwd dtype != orig
    dtype), nor is anything under pure bf16; fp32 weights are."""
    from ftscope.estimate.reserved_floor import fsdp1_stream_bytes
    base = {"model": "llama-2-70b", "framework": "fsdp-qlora", "hardware": {"gpu": "rtx-4090", "gpus_per_node": 2},
            "mix": {"method": "qlora"}, "workload": {"micro_batch_size": 2, "seq_len": 2048}}
    s = ftscope.load_scenario(base)
    off = ftscope.load_scenario({**base, "mix": {"method": "qlora", "offload": "optimizer+params"}})
    nf4 = 0.5 + 1 / 64 + 4 / 16384
    m = s.model
    root = (m.embedding_params + m.lm_head_params + m.final_norm_params) * 2.0
    blocks = 2 * m.largest_layer_params() * nf4
    assert fsdp1_stream_bytes(off, nf4, 2)[1] - fsdp1_stream_bytes(s, nf4, 2)[1] == pytest.approx(max(root, blocks) / 2)
    mixed = ftscope.load_scenario({**base, "mix": {"method": "qlora", "precision": "bf16-mixed"}})
    assert fsdp1_stream_bytes(mixed, nf4, 2)[1] == fsdp1_stream_bytes(s, nf4, 2)[1]  # bf16 storage: no cast
    fp32_base = ftscope.load_scenario({**base, "framework": "peft-sft-2024",
                                       "mix": {"method": "lora", "precision": "bf16-mixed", "fsdp": "full_shard"}})
    bf16_base = dataclasses.replace(fp32_base, recipe=dataclasses.replace(fp32_base.recipe, lora_base_fp32=False))
    cast = fsdp1_stream_bytes(fp32_base, 2.0, 2)[1] - fsdp1_stream_bytes(bf16_base, 2.0, 2)[1]
    adapters = m.lora_params(fp32_base.mix.lora_rank, fp32_base.mix.lora_targets) / m.num_layers * 2.0
    assert cast == pytest.approx(max(root, 2 * (m.largest_layer_params() * 2.0 + adapters)) / 2)
    assert memory_model(off).stream_pool > memory_model(s).stream_pool
    assert max(memory_model(mixed).breakdown(2, 2048).phases.values()) == pytest.approx(
        max(memory_model(dataclasses.replace(mixed, recipe=dataclasses.replace(
            mixed.recipe, fsdp1_unshard_stream=False))).breakdown(2, 2048).phases.values()))  # allocated unchanged


def test_clone_init_replay_of_one_matrix_and_many_layers():
    """torchtune 0.1's QLoRA init replayed: one matrix's quantization needs its bf16 weight, scaled copy and the
    (n, 16) difference and its abs at once (68 B per weight) and the cache keeps them; the live 4-bit data carves
    into those blocks, so the clone's and the load's quantizations need a segment more, never a second set; more
    cloned layers' data lands in the cached blocks (the cache shrinks by about their size, reserved stays)."""
    from ftscope.estimate.reserved_floor import clone_init_cache
    n = 64 * 2**20
    one = clone_init_cache((((n,), (), 1),), ())
    assert 66 * n <= one < 2 * 68 * n
    eight = clone_init_cache((((n,), (), 8),), ())
    assert one - 8 * n < eight < one


def test_torchtune_01_qlora_init_floor_against_the_tutorial():
    """The QLoRA tutorial reports 9.13 GB (8.50 GiB) reserved after a Llama-2-7B QLoRA init on one GPU; the replayed
    floor (weights + what init left cached) is within 5 % (not fitted to it); the one-matrix closed form gave 6.49."""
    d = {"model": "llama-2-7b", "framework": "torchtune-0.1", "hardware": {"gpu": "rtx-4090"},
         "mix": {"method": "qlora", "lora_targets": "all-linear"}, "workload": {"micro_batch_size": 2, "seq_len": 512}}
    floor = memory_model(ftscope.load_scenario(d)).reserved_floor / 2**30
    assert floor == pytest.approx(9.13e9 / 2**30, rel=0.05)


def test_small_pool_step_bytes_sit_on_top_of_an_init_floor():
    """Adapters' gradients and AdamW states of at most 1 MiB a tensor go to the caching allocator's small pool, which
    cannot use the large blocks an init left cached: with a floor, least_reserved adds them; without one, nothing."""
    from ftscope.estimate.reserved_floor import small_pool_step_bytes
    d = {"model": "llama-2-7b", "framework": "fsdp-qlora", "hardware": {"gpu": "rtx3090-24gb", "gpus_per_node": 2},
         "mix": {"method": "qlora"}, "workload": {"micro_batch_size": 1, "seq_len": 512}}
    s = ftscope.load_scenario(d)
    lora = s.model.lora_params(64, "all-linear")
    # r64 all-linear over two shards: every adapter shard is under 1 MiB; bf16 gradient + two bf16 AdamW states
    assert small_pool_step_bytes(s, 2.0, 4.0, 2) == pytest.approx(lora * (2 + 4) / 2, rel=1e-3)
    # one GPU at fp32 with large matrices: a 4096 x 64 fp32 state is exactly 1 MiB (small), the 11008 x 64 ones not
    one = small_pool_step_bytes(s, 4.0, 8.0, 1)
    assert 0 < one < lora * 12
    mm = memory_model(s)
    # fsdp_qlora's gradients live on FSDP1's post-backward stream (gradient_pool): the small pool keeps the states
    assert mm.small_pool_step == pytest.approx(small_pool_step_bytes(s, 0.0, 4.0, 2), rel=1e-6)
    assert mm.gradient_pool == pytest.approx(mm.gradients)
    assert mm.least_reserved == pytest.approx(mm.reserved_floor + mm.small_pool_step + mm.stream_pool + mm.gradient_pool)
    full = memory_model(ftscope.load_scenario({**d, "mix": {"method": "full"}}))
    assert full.small_pool_step == 0.0
    hf = memory_model(ftscope.load_scenario({**d, "framework": "hf-trainer", "mix": {"method": "qlora", "fsdp": "full_shard"}}))
    assert hf.reserved_floor == 0.0 and hf.small_pool_step == 0.0  # no init floor: the step's own reserved counts them



def test_fsdp1_post_backward_pool_keeps_the_sharded_gradients_reserved_through_forward():
    """torchtune 0.1 (FSDP1): the sharded gradients are blocks of the post-backward stream, which the next forward's
    activations cannot reuse: every phase point before backward adds them; points holding them already do not."""
    d = {"model": "llama-2-7b", "framework": "torchtune-0.1", "hardware": {"gpu": "rtx-4090", "gpus_per_node": 4},
         "mix": {"method": "full", "precision": "bf16", "fsdp": "full_shard", "gradient_checkpointing": True},
         "workload": {"micro_batch_size": 2, "seq_len": 512}}
    s = ftscope.load_scenario(d)
    mm = memory_model(s)
    off = memory_model(dataclasses.replace(s, recipe=dataclasses.replace(s.recipe, fsdp1_post_backward_stream=False)))
    assert mm.gradient_pool == pytest.approx(s.model.total_params * 2 / 4, rel=1e-3)  # bf16, four shards
    plain = dataclasses.replace(mm, gradient_pool=0.0)
    with_pool, without = mm.phase_points(2, 512), plain.phase_points(2, 512)
    for p, r_pool, r_plain in zip(with_pool, mm._reserved_of(with_pool), plain._reserved_of(without)):
        assert r_pool - r_plain == pytest.approx(mm.gradient_pool - min(p.gradients, mm.gradient_pool))
    assert mm._reserved_of(with_pool)[0] - plain._reserved_of(without)[0] == pytest.approx(mm.gradient_pool)
    assert mm.least_reserved - plain.least_reserved == pytest.approx(mm.gradient_pool)
    assert off.gradient_pool == 0.0 and off.gradients == mm.gradients
