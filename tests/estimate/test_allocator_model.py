"""estimate/allocator_model.py: the allocator's overhead and the capacity it leaves."""
import pytest

from ftscope.estimate import memory
from ftscope.estimate.allocator_model import DEFAULT_ALLOCATOR, AllocatorModel, usable_bytes
from ftscope.spec.hardware import GIB, gpu_from_catalog


def test_checkpointed_steps_fragment_more_by_default():
    assert DEFAULT_ALLOCATOR.fragmentation_checkpointed > DEFAULT_ALLOCATOR.fragmentation


def test_what_releasing_the_cache_leaves_is_at_most_either_steps_fraction():
    assert 0 < DEFAULT_ALLOCATOR.pinned <= min(DEFAULT_ALLOCATOR.fragmentation_checkpointed, 0.5)


@pytest.mark.parametrize("gpu", ["h100-80gb", "t4", "rtx-4090"])
def test_usable_memory_is_the_card_less_the_cuda_context(gpu):
    spec = gpu_from_catalog(gpu)
    assert usable_bytes(spec) == spec.memory_bytes - DEFAULT_ALLOCATOR.cuda_context_gib * GIB
    bigger = AllocatorModel(cuda_context_gib=DEFAULT_ALLOCATOR.cuda_context_gib + 1.0)
    assert usable_bytes(spec, bigger) == pytest.approx(usable_bytes(spec) - GIB)


def test_memory_re_exports_the_same_objects():
    assert memory.AllocatorModel is AllocatorModel and memory.usable_bytes is usable_bytes
    assert memory.DEFAULT_ALLOCATOR is DEFAULT_ALLOCATOR


def _run(gpus: int, nodes: int = 1, seq: int = 2048, **mix):
    from ftscope.spec.scenario import scenario_from_dict
    return scenario_from_dict({"model": "meta-llama/Llama-3.1-8B", "hardware": {"gpu": "h100-80gb",
                                                                                 "gpus_per_node": gpus, "nodes": nodes},
                               "mix": {"method": "full", "zero_stage": 3, **mix},
                               "workload": {"seq_len": seq, "micro_batch_size": 1, "gradient_accumulation": 4}})


def test_the_capacity_is_the_usable_memory_less_nccls_buffers():
    from ftscope.estimate import estimate
    from ftscope.estimate.allocator_model import device_capacity
    from ftscope.estimate.comm_buffers import comm_buffer_bytes
    one, eight = _run(1), _run(8)
    usable = usable_bytes(eight.cluster.gpu)
    assert comm_buffer_bytes(one) == 0.0 and device_capacity(one) == usable  # no communicator on one GPU
    nccl = comm_buffer_bytes(eight)
    assert nccl > 0.5 * GIB
    assert device_capacity(eight) == usable - nccl
    est = estimate(eight)
    assert est.model_memory.capacity_bytes == usable - nccl
    assert est.to_dict()["memory"]["capacity_gib"] == pytest.approx((usable - nccl) / GIB, abs=0.01)
    assert estimate(one).model_memory.capacity_bytes == usable
    # the node layout and the mix's communicators move it: two nodes of four, a tensor-parallel layout
    assert device_capacity(_run(4, nodes=2)) == usable - comm_buffer_bytes(_run(4, nodes=2)) != device_capacity(eight)
    assert device_capacity(_run(8, tensor_parallel=2, zero_stage=0)) < device_capacity(_run(8, zero_stage=0))


def test_a_run_that_fits_only_in_nccls_share_does_not_fit():
    """A sequence length whose fit_bytes lies between the capacity and the usable memory (found by bisection, fit_bytes
    growing with it): out of memory now, where the usable memory alone said it fits."""
    from ftscope.estimate import estimate
    usable = usable_bytes(_run(8).cluster.gpu)
    lo, hi = 512, 1 << 20  # fits, and does not fit even in the usable memory
    assert estimate(_run(8, seq=lo)).fits
    while hi - lo > 1:
        mid = (lo + hi) // 2
        est = estimate(_run(8, seq=mid))
        if est.memory.fit_bytes <= est.model_memory.capacity_bytes:
            lo = mid
        else:
            hi = mid
    est = estimate(_run(8, seq=hi))
    cap = est.model_memory.capacity_bytes
    assert cap < est.memory.fit_bytes <= usable
    assert not est.fits and est.status == "does_not_fit"
