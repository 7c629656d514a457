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
