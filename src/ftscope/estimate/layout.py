"""The parallel layout of a run: how one model replica is split over GPUs and what crosses which link.

Megatron's order, innermost first: tensor parallel (TP) ranks share a node, then context parallel (CP), then
data parallel (DP, with expert parallel carved out of it), pipeline stages (PP) outermost. A group of ranks talks
over NVLink / PCIe while it fits in one node, over the network once it spans nodes.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..spec.scenario import Scenario


@dataclass(frozen=True)
class Layout:
    """Degrees of parallelism and the link bandwidth each group's collectives see (GB/s per direction)."""

    tp: int
    pp: int
    cp: int
    ep: int
    dp: int
    """Data-parallel replicas: world / (tp x pp x cp). ZeRO and FSDP shard over these."""
    virtual_stages: int
    sequence_parallel: bool
    tp_gbs: float
    cp_gbs: float
    dp_gbs: float
    ep_gbs: float
    pp_gbs: float

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def bubble(self) -> float:
        """Idle fraction of a pipeline step, relative to its busy time: (p - 1) / (m x v) for m micro-batches
        (1F1B; interleaved divides by the virtual stages). Times the gradient accumulation it is applied to."""
        return 0.0 if self.pp == 1 else (self.pp - 1) / self.virtual_stages


def _link(scn: Scenario, span: int) -> float:
    """Bus bandwidth of a collective over `span` consecutive ranks: the node's link, or, once it spans nodes,
    the network too. NCCL runs one ring per NIC, and a node forwards what one of its GPUs received to the others
    over its own links, so a collective crossing nodes sees every NIC of a node at once: g GPUs x the
    per-GPU network rate (8 x 25 GB/s = 200 GB/s on an 8-GPU node with a 200 Gb/s NIC per GPU). GPUs without
    peer-to-peer stage every transfer through host memory: half the PCIe bandwidth."""
    cl = scn.cluster
    gpu = cl.gpu
    intra = gpu.intra_node_gbs * (1.0 if gpu.peer_to_peer else 0.5)
    if span > cl.gpus_per_node and cl.nodes > 1:
        network = cl.inter_node_gbs * cl.gpus_per_node
        return min(intra, network) if cl.gpus_per_node > 1 else network
    return intra


def _stage_link(scn: Scenario, ranks_per_stage: int) -> float:
    """Bandwidth of one pipeline send between neighbouring stages, averaged over the stage boundaries. Stages
    are outermost (`ranks_per_stage` = world / pp consecutive ranks each): a rank sends to the rank
    `ranks_per_stage` above it, which sits in another node for a share min(1, ranks_per_stage / gpus_per_node)
    of the ranks (one NIC each) and in the same node for the rest (its NVLink / PCIe). Averaged in time per byte."""
    cl = scn.cluster
    intra = _link(scn, 1)
    if cl.nodes <= 1:
        return intra
    network = cl.inter_node_gbs
    if cl.gpus_per_node <= 1:
        return network
    crossing = min(1.0, ranks_per_stage / cl.gpus_per_node)
    return 1.0 / (crossing / min(intra, network) + (1.0 - crossing) / intra)


def layout(scn: Scenario) -> Layout:
    """The layout of a scenario."""
    mix, cl = scn.mix, scn.cluster
    tp, pp, cp, ep = mix.tensor_parallel, mix.pipeline_parallel, mix.context_parallel, mix.expert_parallel
    world = cl.world_size
    dp = max(world // (tp * pp * cp), 1)
    return Layout(tp=tp, pp=pp, cp=cp, ep=ep, dp=dp, virtual_stages=mix.virtual_stages,
                  sequence_parallel=mix.sequence_parallel,
                  tp_gbs=_link(scn, tp), cp_gbs=_link(scn, tp * cp), dp_gbs=_link(scn, world // pp),
                  ep_gbs=_link(scn, tp * cp * ep), pp_gbs=_stage_link(scn, max(world // pp, 1)))
