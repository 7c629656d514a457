"""What turns allocated bytes into reserved ones, and reserved into what nvidia-smi shows: the CUDA context, the
caching allocator's workspace and fragmentation, and what releasing its cache leaves (memory.MemoryModel reads it;
caching_allocator.py is the allocator's own rules, replayed where a recipe's allocations are known)."""
from __future__ import annotations

from dataclasses import dataclass

from ..spec.hardware import GIB, GpuSpec
from ..spec.scenario import Scenario
from .comm_buffers import comm_buffer_bytes


@dataclass(frozen=True)
class AllocatorModel:
    """Bytes outside tensors: what turns allocated into reserved and reserved into nvidia-smi."""

    cuda_context_gib: float = 0.5
    """CUDA context, cuBLAS/cuDNN kernels: visible in nvidia-smi, not in torch's reserved."""
    workspace_gib: float = 0.03
    """cuBLAS workspaces and small buffers the caching allocator holds."""
    fragmentation: float = 0.12
    """Reserved exceeds allocated by this fraction of the memory that churns (activations, temporaries), in a step
    without activation checkpointing. Fitted on the 37 such H200 profile points, checked on 24 others
    (benchmarks/allocator_fit.py): median 3.3 % held out; the real ratio spreads from 0.05 to 0.4 by model and mix."""
    fragmentation_checkpointed: float = 0.41
    """The same with activation checkpointing, where it is higher: each block's kept input is carved out of a block
    freed by the block's larger transients (the MLP's intermediate), so every layer pins a segment of transient size
    that the next block's transients cannot reuse (the traced steps' allocations replayed through
    caching_allocator.py show it). Fitted on 12 H200 points, checked on 11: median 5.1 % held out (one fraction for
    both kinds, 0.17, read 13.6 % under on those 11); a recipe whose step was replayed sets its own
    (Recipe.allocator_fragmentation_checkpointed)."""
    pinned: float = 0.15
    """Of the churning bytes, what stays reserved when the allocator releases its cache: on a failed cudaMalloc torch
    frees every cached segment that holds no live tensor and retries (release_cached_blocks), and only the free space
    inside segments that still hold one stays. A run fits while allocated + workspace + this share (at most the
    step's own fraction) fits, and its max_memory_reserved then reads at most the capacity. Traced steps replayed
    (benchmarks/recipe_fragmentation.py: CachingAllocator.pinned_free at the peak of allocated bytes over the
    activations): 0.12-0.23 for fsdp_qlora's Llama-2-7B and PEFT's 70B shapes, 0.04-0.05 for Llama-3.1-8B LoRA at
    4 x 1024; median 0.15 over 11 shapes."""


DEFAULT_ALLOCATOR = AllocatorModel()


def usable_bytes(gpu: GpuSpec, allocator: AllocatorModel = DEFAULT_ALLOCATOR) -> float:
    """Device memory the caching allocator can reserve on this GPU (total minus the CUDA context)."""
    return gpu.memory_bytes - allocator.cuda_context_gib * GIB


def device_capacity(scn: Scenario, allocator: AllocatorModel = DEFAULT_ALLOCATOR) -> float:
    """What the caching allocator can reserve on each GPU of this run, which every fit decision reads: the usable
    memory less NCCL's communicator buffers, which NCCL allocates outside the allocator (comm_buffers.py; 0 on one
    GPU)."""
    return usable_bytes(scn.cluster.gpu, allocator) - comm_buffer_bytes(scn)
