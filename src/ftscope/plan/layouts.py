"""Which parallel layouts a candidate can run, and how it splits a global batch, for recommend's search.

A layout (tensor x pipeline x context parallel degrees, expert parallel within the data-parallel ranks) is valid
on a GPU count when spec/rules.layout_problem says so: the degrees divide the GPUs, the heads, the layers and the
experts, and tensor parallelism stays within a node. Its validity depends on the GPU count, so classify.py checks
it per count, not per GPU type. A tensor, pipeline or context group shares one micro-batch: a step covers
micro-batch x accumulation x data-parallel replicas sequences, and a pipeline needs at least as many
micro-batches per step as it has stages (`keep_global_batch` caps the micro-batch to keep it filled).
"""
from __future__ import annotations

import math

from ..spec.rules import layout_problem
from ..spec.scenario import Scenario


LAYOUT_FIELDS = ("tensor_parallel", "pipeline_parallel", "context_parallel", "context_parallel_impl", "expert_parallel",
                 "virtual_stages", "optimizer_in_backward")
"""The Mix fields layout_reason reads (with the scenario's model, workload and cluster): classify.py checks one mix
of each distinct value per GPU count (tests/plan/test_layouts.py varies the others)."""


def replicas(scn: Scenario) -> int:
    """Data-parallel replicas: GPUs over the model-parallel group (what ZeRO shards over and a step multiplies)."""
    return max(scn.cluster.world_size // scn.mix.model_parallel, 1)


def layout_reason(scn: Scenario, global_batch: int | None) -> str | None:
    """Why this candidate's layout cannot run on its GPUs ("unsupported: ..."), or None. With a fixed global
    batch, recommend picks the accumulation per candidate, so a pipeline is checked against the global batch
    instead: it needs at least one sequence per stage and replica."""
    mix, a, wl, cl = scn.mix, scn.model.arch, scn.workload, scn.cluster
    ga = wl.gradient_accumulation if global_batch is None else None
    reason = layout_problem(mix, heads=a.num_heads, kv_heads=a.num_kv_heads, layers=scn.model.num_layers,
                            experts=a.num_experts, world=cl.world_size, gpus_per_node=cl.gpus_per_node,
                            gradient_accumulation=ga, seq_len=wl.seq_len)
    pp = mix.pipeline_parallel
    if reason is None and global_batch is not None and pp > 1 and global_batch < pp * replicas(scn):
        reason = (f"pipeline_parallel {pp} needs at least {pp} micro-batches per step: the global batch of "
                  f"{global_batch} over {replicas(scn)} data-parallel replicas gives fewer")
    return f"unsupported: {reason}" if reason else None


def keep_global_batch(max_batch: int, global_batch: int, replicas: int, stages: int = 1) -> tuple[int, int]:
    """(micro-batch, accumulation) that keep a global batch on `replicas` data-parallel replicas: the largest
    micro-batch that fits, up to the global batch over the replicas (and over the pipeline's stages, so that
    the accumulation fills the pipeline), and accumulation for the rest."""
    mb = max(1, min(max_batch, global_batch // (replicas * stages)))
    return mb, max(1, math.ceil(global_batch / (mb * replicas)))
