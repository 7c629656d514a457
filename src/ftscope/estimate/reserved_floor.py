"""What the caching allocator keeps reserved beside the step's own tensors, replayed through its model
(caching_allocator.CachingAllocator): the blocks a model's init leaves cached (FSDP1's sync_module_states
broadcast and flatten, torchtune 0.1's per-layer clone-and-quantize of QLoRA weights), FSDP1's unshard-stream
pool of gathered units and its post-backward stream's sharded gradients, and the small-pool segments LoRA's tiny
gradients and states need on top of an init floor. memory.build_memory_models reads them as the model's
reserved_floor, stream_pool, gradient_pool and small_pool_step."""
from __future__ import annotations

import itertools
from functools import lru_cache

from ..spec.scenario import Scenario
from .caching_allocator import SMALL_SIZE, CachingAllocator
from .weight_memory import fp32_lora_base, gathered_unit_bytes, gathered_weight_bytes

BROADCAST_BUCKET_BYTES = 250 * 2**20
"""FSDP1's sync_module_states broadcasts through torch's _broadcast_coalesced in buckets of this size
(PARAM_BROADCAST_BUCKET_SIZE), at most two in flight (c10d comm.cpp broadcast_coalesced: max_in_flight = 2)."""


def broadcast_buckets(sizes: list[int], limit: int = BROADCAST_BUCKET_BYTES) -> list[int]:
    """Bytes of each bucket _broadcast_coalesced flattens: tensors taken in order until the bucket reaches the limit
    (torch/csrc/utils/tensor_flatten.cpp take_tensors: a tensor is added, then the bucket closes at >= limit)."""
    out, cur = [], 0
    for size in sizes:
        cur += size
        if cur >= limit:
            out.append(cur)
            cur = 0
    return out + ([cur] if cur else [])


@lru_cache(maxsize=256)
def fsdp1_init_cache(units: tuple[tuple[int, ...], ...], shards: int) -> float:
    """Bytes FSDP1's init with sync_module_states leaves cached beyond the live shards, by replaying its allocations
    through the caching-allocator model, unit by unit in wrapping order (`units`: each unit's tensor sizes). Per
    unit (torch/distributed/fsdp/_init_utils.py, _flat_param.py): each parameter moved to the GPU, the broadcast
    buckets (two in flight, c10d broadcast_coalesced), the flattened copy of the unit (torch.cat), the parameters
    freed (now views of it), the rank's shard cloned out of it, the flat copy freed. The live shards carve into the
    cached blocks, so later units need segments of their own: more than the largest unit's three copies."""
    alloc, key, live = CachingAllocator(), 0, 0
    for sizes in units:
        params = list(range(key, key + len(sizes)))
        for k, size in zip(params, sizes):
            alloc.malloc(k, size)
        key += len(sizes)
        flight: list[int] = []
        for size in broadcast_buckets(list(sizes)):
            if len(flight) == 2:
                alloc.free(flight.pop(0))
            alloc.malloc(key, size)
            flight.append(key)
            key += 1
        for k in flight + params:
            alloc.free(k)
        unit = sum(sizes)
        alloc.malloc(key, unit)
        alloc.malloc(key + 1, -(-unit // shards))
        alloc.free(key)
        key, live = key + 2, live + -(-unit // shards)
    return float(alloc.reserved - live)


def fsdp1_units(scn: Scenario, per_param: float) -> tuple[tuple[int, ...], ...]:
    """Each FSDP1 unit's tensor sizes in bytes, in wrapping order (the blocks, then the root: embeddings, final norm,
    LM head in the working dtype); a block's matrices at `per_param` bytes, its norms in the working dtype."""
    m = scn.model
    work = 4 if scn.mix.precision == "fp32" else 2
    units = []
    for layer, n in m.layer_groups:
        sizes = [int(lin.in_features * lin.out_features * per_param) for lin in layer.linears for _ in range(lin.count)]
        units += [tuple(sizes + ([layer.other_params * work] if layer.other_params else []))] * n
    root = (m.embedding_params, m.final_norm_params, m.lm_head_params)
    return tuple(units) + (tuple(p * work for p in root if p),)


def fsdp1_stream_bytes(scn: Scenario, per_param: float, shards: int) -> tuple[float, float, float]:
    """(init cache, unshard-stream pool, gathered bytes the step counts) of an FSDP1 recipe, per GPU.

    shard_grad_op, in every recipe: every unit, unsharded from its forward to its backward, on the unshard stream.
    Init: fsdp1_init_cache's replay of every unit. In the step the gathered units live on the unshard stream: the
    root (when the recipe keeps it gathered) and two blocks in flight (unsharded bytes). Under CPU offload or a
    mixed-precision param_dtype each unit's shard is first copied to the GPU on a third stream (the pre-unshard
    stream), whose pool holds the largest copies alive at once: the root's shard, or two blocks' (prefetched). FSDP1
    casts only a unit stored in another dtype than param_dtype (`_uses_param_mixed_precision`: fwd_bwd dtype !=
    orig dtype): fp32 weights, not a bf16 LoRA base or QLoRA's bf16 quant storage."""
    m, rec = scn.model, scn.recipe
    root_bytes = (m.embedding_params + m.lm_head_params + m.final_norm_params) * (4.0 if scn.mix.precision == "fp32" else 2.0)
    block_bytes = gathered_unit_bytes(scn)
    init = fsdp1_init_cache(fsdp1_units(scn, per_param), shards) if rec.fsdp1_sync_init else 0.0
    pool = gathered = 0.0
    if scn.mix.fsdp == "shard_grad_op" and shards > 1:
        # every unit stays unsharded from its forward to its backward (weight_memory.forward_transients): allocated
        # once a step at the same sizes on the all-gather's own stream (FSDP1's unshard stream, in every recipe), so
        # the compute stream's fragmentation share never applies to them, and after backward reshards them their
        # blocks stay in that stream's pool through the optimizer step
        pool = gathered = gathered_weight_bytes(scn)
    elif rec.fsdp1_unshard_stream and shards > 1 and scn.mix.shard_stage == 3:
        root = root_bytes if rec.fsdp_root_gathered else 0.0
        pool = root + 2 * block_bytes
        gathered = pool  # what forward_transients counts for the same gathers
        # FSDP1's _unshard runs pre_unshard on the pre-unshard stream: flat_param_to(device) copies an offloaded shard
        # from the host, _use_low_precision_shard casts one into _mp_shard; either copy is dropped once all-gathered
        # (torch/distributed/fsdp/_runtime_utils.py _unshard, _flat_param.py pre_unshard / unshard), so the stream's
        # cache keeps the largest of them: the root's shard, or two prefetched blocks' carved from it
        mixed = scn.mix.precision in ("bf16-mixed", "fp16-mixed")
        blocks_fp32 = mixed and (scn.mix.method == "full" or fp32_lora_base(scn))
        root_fp32 = blocks_fp32 or (mixed and any(rec.kbit_fp32(g) for g in ("embeddings", "lm_head")))
        if scn.mix.offload == "optimizer+params":
            pool += max(root_bytes, 2 * block_bytes) / shards
        elif root_fp32 or blocks_fp32:
            pool += max(root_bytes * root_fp32, 2 * block_bytes * blocks_fp32) / shards
    return init, pool, gathered


def fsdp1_gradient_pool(scn: Scenario, sharded_gradient_bytes: float, shards: int) -> float:
    """Bytes of FSDP1's post-backward-stream pool: every unit's sharded gradient (Recipe.fsdp1_post_backward_stream),
    for a recipe that says so and a sharded run. Not counted: a reduce-dtype copy FSDP1 casts there when the
    gradient's dtype differs from the parameter's (no recipe here runs one)."""
    if not scn.recipe.fsdp1_post_backward_stream or shards <= 1:
        return 0.0
    return sharded_gradient_bytes


def _to_nf4(alloc: CachingAllocator, keys: "itertools.count[int]", n: int) -> list[int]:
    """torchao 0.1's NF4Tensor.from_tensor on an n-element bf16 weight on the GPU (torchao/dtypes/nf4tensor.py at
    v0.1, lines 292-446), through `alloc`: the keys of the NF4 tensors it keeps (4-bit data, int8 scalers, factors).
    Per block of 64: abs and max twice (double_quantize_scalers, then convert_to_norm_float_weight); the scaled
    blocks (2 n bytes); quantize_tensor_nearest's (n, 16) bf16 difference and its abs at once (32 n + 32 n), min's
    values and int64 indices (2 n + 8 n); the int64 nibble shift and or (4 n + 4 n) before the uint8 result."""
    def m(nbytes: float) -> int:
        key = next(keys)
        alloc.malloc(key, max(int(nbytes), 1))
        return key

    def f(*ks: int) -> None:
        for key in ks:
            alloc.free(key)

    a1, v, i = m(2 * n), m(2 * n / 64), m(8 * n / 64)
    f(a1, i)
    s1 = m(2 * n / 64)
    f(v)
    qs, qf = m(n / 64), m(2 * n / 64 / 256)
    f(s1)
    a2, v2, i2 = m(2 * n), m(2 * n / 64), m(8 * n / 64)
    f(a2, i2)
    scaled = m(2 * n)
    f(v2)
    diff = m(32 * n)
    diff_abs = m(32 * n)
    f(diff)
    values, indices = m(2 * n), m(8 * n)
    f(diff_abs, values)
    shift = m(4 * n)
    both = m(4 * n)
    f(shift)
    data = m(n / 2)
    f(both, indices, scaled)
    return [data, qs, qf]


def _nf4_to_bf16(alloc: CachingAllocator, keys: "itertools.count[int]", n: int) -> int:
    """torchao 0.1's NF4Tensor.get_original_weight (nf4tensor.py lines 409-432): each nibble as int64 (4 n + 4 n),
    looked up in bf16 (n + n), the repeated scalers flattened per multiply (n), the scaled halves (n + n) and
    their stack (2 n, the key returned); the rest is freed on return."""
    def m(nbytes: float) -> int:
        key = next(keys)
        alloc.malloc(key, max(int(nbytes), 1))
        return key

    t1 = m(n / 2)
    first = m(4 * n)
    alloc.free(t1)
    t2 = m(n / 2)
    second = m(4 * n)
    alloc.free(t2)
    dq1, dq2, scalers = m(n), m(n), m(2 * n / 64)
    r1 = m(n)
    s1 = m(n)
    alloc.free(r1)
    r2 = m(n)
    s2 = m(n)
    alloc.free(r2)
    out = m(2 * n)
    for key in (first, second, dq1, dq2, scalers, s1, s2):
        alloc.free(key)
    return out


@lru_cache(maxsize=64)
def clone_init_cache(groups: tuple[tuple[tuple[int, ...], tuple[int, ...], int], ...], head: tuple[int, ...]) -> float:
    """Bytes a torchtune-0.1-style QLoRA init leaves cached beyond the live weights, replayed through the
    caching-allocator model. `groups`: per layer layout, (the 4-bit matrices' element counts in build order, the
    other tensors' bytes (norms, adapters), number of layers); `head`: the embedding's and LM head's bytes.

    In order (torchtune 0914d5cf): one layer built, each base Linear's bf16 weight quantized and dropped
    (modules/peft/lora.py _create_weight_and_bias); the embedding and LM head; the layer deep-copied for every
    layer, each 4-bit clone dequantized and quantized again (utils/_register_nf4_dispatch_ops.py clone), the
    original dropped; then load_state_dict, whose copy_ moves each checkpoint matrix to the GPU and quantizes it
    there, replacing the old 4-bit data (the same file, inplace_copy). The live 4-bit tensors carve into the
    quantization temporaries' cached blocks, so later quantizations need segments of their own."""
    alloc, keys = CachingAllocator(), itertools.count()
    models = []
    for sizes, others, count in groups:
        built = []
        for n in sizes:
            w = next(keys)
            alloc.malloc(w, 2 * n)
            built.append((n, _to_nf4(alloc, keys, n)))
            alloc.free(w)
        small = [next(keys) for _ in others]
        for key, nbytes in zip(small, others):
            alloc.malloc(key, nbytes)
        models.append((built, small, sizes, others, count))
    for nbytes in head:
        alloc.malloc(next(keys), nbytes)
    layers = []
    for built, small, sizes, others, count in models:
        for _ in range(count):
            copy = []
            for n in sizes:
                w = _nf4_to_bf16(alloc, keys, n)
                copy.append((n, _to_nf4(alloc, keys, n)))
                alloc.free(w)
            for nbytes in others:
                alloc.malloc(next(keys), nbytes)
            layers.append(copy)
        for _, kept in built:
            for key in kept:
                alloc.free(key)
        for key in small:
            alloc.free(key)
    for copy in layers:
        for j, (n, kept) in enumerate(copy):
            src = next(keys)
            alloc.malloc(src, 2 * n)
            new = _to_nf4(alloc, keys, n)
            for key in kept:
                alloc.free(key)
            copy[j] = (n, new)
            alloc.free(src)
    return float(alloc.reserved - alloc.allocated)


def clone_init_groups(scn: Scenario) -> tuple[tuple[tuple[tuple[int, ...], tuple[int, ...], int], ...], tuple[int, ...]]:
    """clone_init_cache's arguments for a scenario: each layer group's 4-bit matrices (elements, in the model's
    order), its norms and bf16 adapters (bytes); the embedding and LM head in bf16."""
    m, mix = scn.model, scn.mix
    r = mix.lora_rank
    lora = {id(lin) for lin, _ in m.lora_targets(mix.lora_targets)}
    groups = []
    for layer, n in m.layer_groups:
        sizes = tuple(lin.in_features * lin.out_features for lin in layer.linears for _ in range(lin.count))
        adapters = tuple(2 * r * d for lin in layer.linears if id(lin) in lora for _ in range(lin.count)
                         for d in (lin.in_features, lin.out_features))
        groups.append((sizes, adapters + ((2 * layer.other_params,) if layer.other_params else ()), n))
    head = tuple(2 * p for p in (m.embedding_params, m.lm_head_params) if p)
    return tuple(groups), head


def small_pool_step_bytes(scn: Scenario, gradient_bytes: float, optimizer_bytes: float, shards: int) -> float:
    """Bytes the step allocates in requests of at most 1 MiB: each adapter's gradient and optimizer states (A: r x in,
    B: out x r elements, split over `shards` where FSDP shards them), counted where one tensor is that small.

    The caching allocator serves requests up to 1 MiB from its small pool (2 MiB segments) and never from the large
    pool's blocks (c10/cuda/CUDACachingAllocator.cpp get_pool), so what a model's init left cached in large blocks
    cannot hold them: on top of an init floor they need segments of their own. AdamW's two states are one tensor
    each (half of `optimizer_bytes` per element)."""
    m, mix = scn.model, scn.mix
    if not mix.trains_lora:
        return 0.0
    r, total = mix.lora_rank, 0.0
    for lin, n in m.lora_targets(mix.lora_targets):
        for size in (r * lin.in_features, r * lin.out_features):
            elems = -(-size // shards)
            for per_elem, tensors in ((gradient_bytes, 1), (optimizer_bytes / 2, 2)):
                if 0 < elems * per_elem <= SMALL_SIZE:
                    total += elems * per_elem * tensors * lin.count * n
    return total
