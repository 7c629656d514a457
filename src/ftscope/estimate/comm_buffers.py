"""Device memory NCCL allocates outside PyTorch's caching allocator: what nvidia-smi counts and
torch.cuda.memory_reserved does not.

Every figure is read off NCCL's source (NVIDIA/nccl at 5067397c, 2.30 development, and the release tags named);
nothing is fitted. Per communicator of two or more ranks and per GPU:

- bookkeeping: each channel's device peer tables (channel.cc:44, 48, 60) and the device comm (init.cc:587, 589), each
  a separate allocation; with cuMem (NCCL 2.19+, on where the driver supports it) every one is rounded up to the
  2 MiB allocation granularity (alloc.h:317-318), for max(ring channels, p2p channels) channels (paths.cc:990, 1007);
- ring: one receive and one send connection per channel; the receiver holds the LL, LL128 and SIMPLE buffers
  (p2p.cc:486-491), the sender its ncclSendMem (p2p.cc:407-410), each rounded to CUDA_IPC_MIN (2 MiB): 10 + 2 MiB
  (with P2P read, Ampere NVLink: 6 + 6 MiB, the SIMPLE buffer on the sender: the same 12 MiB);
- tree: the chain's other direction, one more receive and send per channel;
- NVLS (Hopper / Blackwell on NVSwitch, more than two GPUs of the communicator on the node): the unicast buffer each
  GPU binds to the multicast object, per channel two buffers of NCCL_STEPS chunks for every head (nvls.cc:426-430),
  and a 2 MiB peer table per channel (channel.cc:98);
- point-to-point (pipeline sends, all-to-all): per peer and channel a connection like a ring's (NVLink), or the
  network proxy's shared pool (net.cc:646-667).

Which of these exist depends on the NCCL version: up to 2.22 every communicator connects rings and trees and binds
its NVLS buffers at init (init.cc at v2.22.3, the `else` branch at 5067397c init.cc:1559-1574); from 2.23
(NCCL_RUNTIME_CONNECT=1, init.cc:61, 1552) only what an algorithm first uses (enqueue.cc:495-505).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from operator import attrgetter
from typing import Sequence

from ..spec.hardware import GpuSpec
from ..spec.scenario import Scenario

MIB = 2**20

NCCL_STEPS = 8
"""Slots of every connection FIFO (src/include/device.h:26)."""
LL_BYTES = 8 * 512 * NCCL_STEPS * 16
"""DEFAULT_LL_BUFFSIZE (init.cc:810-811): NCCL_LL_LINES_PER_THREAD 8 x NCCL_LL_MAX_NTHREADS 512 (device.h:97-98)
x NCCL_STEPS x a 16-byte ncclLLFifoLine: 512 KiB."""
LL128_BYTES = 120 * 640 * NCCL_STEPS * 8
"""DEFAULT_LL128_BUFFSIZE (init.cc:812): NCCL_LL128_ELEMS_PER_THREAD 120 x NCCL_LL128_MAX_NTHREADS 640
(device.h:114-115) x NCCL_STEPS x 8 bytes: 4,915,200 B (4.69 MiB)."""
SIMPLE_BYTES = 4 * MIB
"""DEFAULT_BUFFSIZE (init.cc:813), NCCL_BUFFSIZE."""
GRANULARITY = 2 * MIB
"""CUDA_IPC_MIN (src/include/comm.h:46), to which p2p.cc:410 and 491 round each connection's buffer; also cuMem's
minimum allocation granularity on these GPUs, to which ncclCuMemAlloc rounds every device allocation
(alloc.h:317-318)."""
NVLS_CHUNK = 128 * 1024
"""NCCL_NVLS_CHUNKSIZE from 2.21 (nvls.cc:160); 2.19-2.20 used the SIMPLE buffer (4 MiB) per step set."""
NVLS_CHANNELS = 16
"""NVLS_NCHANNELS_SM90 (nvls.cc:155); up to 2.22 the buffers were sized by the communicator's ring channels."""
NET_P2P_CHUNK = 128 * 1024
"""NCCL_P2P_NET_CHUNKSIZE (init.cc:818): the network send/recv pools hold 16 of these per channel (net.cc:646, 666)."""
MULTI_NODE_RING_CHANNELS = 16
"""Ring channels of a communicator spanning nodes with several of its GPUs per node: the search finds one channel
per NIC rail (8), doubled (connect.cc:460); NCCL logs show "Channel 00/16" on 3 x 8 H100 (NVIDIA/nccl#1453)."""
CROSS_NODE_SINGLE_RING_CHANNELS = 4
"""With one GPU of the communicator per node: one channel per NIC, duplicated (search.cc:1042) and doubled."""

_SPEEDS = {  # search.cc:1051, 1057 (sm90), 1060-1063 (sm100): per-channel bandwidths the ring search tries, GB/s
    80: (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    90: (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
}
_NVLINK_BW = {"volta": 20.0, "ampere": 20.0, "hopper": 20.6, "blackwell": 40.1}
"""NCCL's bandwidth per NVLink, GB/s (src/graph/topo.h:19-24)."""
_LINK_GBS = {"nvlink2": 25.0, "nvlink3": 25.0, "nvlink4": 25.0, "nvlink5": 50.0}
"""The catalog's per-direction GB/s of one link: intra_node_gbs / this = NVLinks per GPU (18 on H100, 8 on H800)."""
_PCIE_BW = {"pcie3": 12.0, "pcie4": 24.0, "pcie5": 48.0}
"""NCCL's PCIe x16 bandwidth by generation (topo.h PCI_BW, 24 for Gen4 as its logs print it)."""


@dataclass(frozen=True)
class NcclBuild:
    """What a NCCL version allocates differently."""

    version: tuple[int, int]
    cumem: bool
    """Device allocations through cuMem, each rounded to the 2 MiB granularity (auto-enabled from 2.19)."""
    runtime_connect: bool
    """Connections and NVLS buffers made when an algorithm is first used (2.23+), not all at init."""
    nvls_step_bytes: int
    """Bytes of one NVLS step: the SIMPLE buffer's slot set (4 MiB) up to 2.20, 8 x 128 KiB from 2.21."""
    nvls_credit_bytes: int
    """Up to 2.22 each NVLS channel buffer carried a 2 MiB-aligned credit block (nvls.cc at v2.22.3: memSize)."""


def nccl_build(version: str) -> NcclBuild:
    """The build facts of a NCCL version string ("2.21", "2.27.5")."""
    major, minor = (int(p) for p in version.split(".")[:2])
    v = (major, minor)
    return NcclBuild(version=v, cumem=v >= (2, 19), runtime_connect=v >= (2, 23),
                     nvls_step_bytes=SIMPLE_BYTES if v < (2, 21) else NVLS_CHUNK * NCCL_STEPS,
                     nvls_credit_bytes=GRANULARITY if v < (2, 23) else 0)


def _align(n: float, to: int = GRANULARITY) -> int:
    return int(math.ceil(n / to) * to)


def _pow2_up(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


CONNECTION_PAIR_BYTES = _align(LL_BYTES + LL128_BYTES + SIMPLE_BYTES + 4096) + _align(4096)
"""One receive plus one send connection over NVLink/PCIe, on one GPU: 10 + 2 MiB (ncclRecvMem / ncclSendMem are
a few KiB, inside the rounding)."""


def nvlinks(gpu: GpuSpec) -> int:
    """NVLinks per GPU (0: PCIe only)."""
    per = _LINK_GBS.get(gpu.intra_node_link)
    return int(round(gpu.intra_node_gbs / per)) if per else 0


def _ring_search(total: float, speeds: tuple[float, ...], cc: int) -> int:
    """Ring channels of one node from its per-GPU bandwidth: the search (search.cc:1166-1240) keeps the speed with
    the most channels x bandwidth (ties: the first), stopping when a speed falls under half the best; then the
    duplication (search.cc:1036-1048) and the doubling into execution channels (connect.cc:460)."""
    best_n, best_s, i = 0, 0.0, 0
    while i < len(speeds) and speeds[i] > total:
        i += 1
    for s in speeds[i:]:
        if best_n and s / best_s <= 0.49:
            break
        n = min(int(total // s), 32)  # ringGraph->maxChannels = MAXCHANNELS / 2 (init.cc:1177)
        if n and n * s > best_n * best_s:
            best_n, best_s = n, s
        if best_n * best_s >= total:
            break
    if not best_n:
        return 2
    if best_s >= 25.0 and not (cc > 80 and best_s < 50.0 and best_n > 4):
        best_n = min(2 * best_n, 32)
    return min(2 * best_n, 64)


def ring_channels(gpu: GpuSpec, nodes: int = 1, local_ranks: int = 2) -> int:
    """Execution channels of a communicator (rings; trees use as many) on this GPU type: 24 on one node of H100 or
    A100 SXM, 16 on H800 / A800 (8 NVLinks), 4 over PCIe Gen4."""
    if nodes > 1:
        return MULTI_NODE_RING_CHANNELS if local_ranks > 1 else CROSS_NODE_SINGLE_RING_CHANNELS
    links = nvlinks(gpu)
    cc = 90 if gpu.architecture in ("hopper", "blackwell") else 80
    if links:
        return _ring_search(links * _NVLINK_BW.get(gpu.architecture, 20.0), _SPEEDS[cc], cc)
    return _ring_search(_PCIE_BW.get(gpu.intra_node_link, 24.0), _SPEEDS[cc], cc)


def p2p_channels_per_peer(gpu: GpuSpec, channels: int) -> int:
    """Channels a send/recv pair uses (paths.cc:961-1003): twice the NVLinks between the two GPUs, rounded up to a
    power of two and capped at the p2p channels (32 on H100: NVIDIA/nccl#1685 logs 32 per pair); 2 over PCIe."""
    links = nvlinks(gpu)
    return min(_pow2_up(2 * links) if links else 2, _pow2_up(channels))


def nvls_capable(gpu: GpuSpec) -> bool:
    """NVLink SHARP: multicast on an NVSwitch (search.cc:1124: an NVS node and compute capability 9.0 or more)."""
    return gpu.architecture in ("hopper", "blackwell") and nvlinks(gpu) > 0


@dataclass(frozen=True)
class Communicator:
    """One process group's NCCL communicator, as one of its GPUs sees it."""

    name: str
    ranks: int
    local_ranks: int
    """Of its ranks, those on this GPU's node."""
    collectives: bool = True
    """All-reduce / all-gather / reduce-scatter (or a barrier) run on it: rings, trees, NVLS."""
    p2p_peers: int = 0
    """Ranks this GPU sends to and receives from point-to-point (pipeline neighbours, all-to-all peers)."""
    bulk: bool = True
    """Large collectives run on it (gradients, parameters, activations: the sizes NCCL's tuner sends through NVLS);
    False: only small ones (barriers, loss averaging, gradient norms), which connect no NVLS from 2.23 on."""

    @property
    def nodes(self) -> int:
        return math.ceil(self.ranks / max(1, self.local_ranks))


def communicator_bytes(comm: Communicator, gpu: GpuSpec, build: NcclBuild) -> float:
    """Device bytes NCCL holds for one communicator on one of its GPUs (0 for a single rank: no peer, no channel)."""
    if comm.ranks <= 1 or gpu.architecture.startswith("cdna"):  # RCCL's buffers are not modelled
        return 0.0
    c = ring_channels(gpu, comm.nodes, comm.local_ranks)
    total = (3 * _pow2_up(c) + 2) * GRANULARITY if build.cumem else 0.0
    # without peer access (GeForce) connections inside a node go through the SHM transport's host memory (shm.cc:102,
    # 135, 332: ncclShmOpen); across nodes they stay on the GPU (GPUDirect RDMA)
    pair = CONNECTION_PAIR_BYTES if gpu.peer_to_peer or comm.nodes > 1 else 0
    if comm.collectives:
        total += c * pair  # rings
        if comm.ranks > 2 and (comm.nodes > 1 or not build.runtime_connect):
            total += c * pair  # trees: the chain's other direction (two ranks: the ring's peer)
        if nvls_capable(gpu) and comm.local_ranks > 2 and (comm.bulk or not build.runtime_connect):
            heads = comm.local_ranks  # one NVLS channel table per channel too (channel.cc:98)
            if build.runtime_connect:
                total += NVLS_CHANNELS * (2 * build.nvls_step_bytes * heads + GRANULARITY)
            else:
                total += c * (2 * (build.nvls_step_bytes + build.nvls_credit_bytes) * heads + GRANULARITY)
    if comm.p2p_peers:
        if comm.local_ranks > 1:  # neighbours on the node (NVLink / PCIe connections)
            total += comm.p2p_peers * p2p_channels_per_peer(gpu, c) * (CONNECTION_PAIR_BYTES if gpu.peer_to_peer else 0)
        else:  # across nodes: the proxy's shared send and receive pools (net.cc:666)
            total += 2 * _pow2_up(c) * 16 * NET_P2P_CHUNK
    return float(total)


def _local(stride: int, size: int, per_node: int) -> int:
    """Ranks of a group of `size` ranks `stride` apart that share a node of `per_node` GPUs."""
    return max(1, min(size, per_node // stride)) if stride < per_node else 1


def communicators(scn: Scenario) -> list[Communicator]:
    """The communicators a run's GPU holds. Data parallelism alone: DDP and FSDP the default group's one; DeepSpeed
    (ZeRO) a second over the same ranks, the data-parallel group it clones from the world group because
    dist.get_global_rank does not take dist.group.WORLD (deepspeed/utils/groups.py at 42b542a2: _clone_world_group,
    _get_data_parallel_group), where gradients are reduced; ZeRO-3 gathers parameters on the default group
    (zero.Init's ds_process_group). A model-parallel layout runs Megatron's groups (megatron/core/parallel_state.py at 00caa53a: rank order
    tp-cp-ep-dp-pp), those it uses: the default group (barriers), dp-cp (gradient reduce-scatter, parameter
    all-gather) and dp (loss averaging) as two communicators even with cp 1, tp, cp (ring attention's send/recv to
    its neighbours, Ulysses' all-to-all), pp (send/recv to the neighbouring stages), tp-pp (gradient norm,
    found-inf), tp-dp-cp under FP8 (amax), ep (the all-to-all token dispatcher; Megatron's allgather dispatcher
    would run collectives there instead)."""
    world, gpn = scn.cluster.world_size, scn.cluster.gpus_per_node
    mix = scn.mix
    tp, pp, cp, ep = mix.tensor_parallel, mix.pipeline_parallel, mix.context_parallel, mix.expert_parallel
    if tp * pp * cp * ep == 1:
        if mix.zero_stage:
            return [Communicator("world", world, min(world, gpn), bulk=mix.zero_stage == 3),
                    Communicator("world-clone", world, min(world, gpn))]
        return [Communicator("world", world, min(world, gpn))]
    dp = max(1, world // (tp * pp * cp))
    out = [Communicator("world", world, min(world, gpn), bulk=False),
           Communicator("dp-cp", dp * cp, _local(tp, dp * cp, gpn)),
           Communicator("dp", dp, _local(tp * cp, dp, gpn), bulk=False),
            Communicator("tp", tp, _local(1, tp, gpn))]
    if cp > 1:  # ring attention sends K/V to the next rank, Ulysses all-to-alls; the loss is averaged over cp
        peers = min(2, cp - 1) if mix.context_parallel_impl == "ring" else cp - 1
        out.append(Communicator("cp", cp, _local(tp, cp, gpn), bulk=False, p2p_peers=peers))
    if pp > 1:
        stride = tp * cp * dp
        out.append(Communicator("pp", pp, _local(stride, pp, gpn), collectives=False, p2p_peers=min(2, pp - 1)))
    if tp * pp > 1:
        local = _local(1, tp, gpn) * _local(tp * cp * dp, pp, gpn)
        out.append(Communicator("tp-pp", tp * pp, min(local, tp * pp), bulk=False))
    if getattr(mix, "fp8", False):
        out.append(Communicator("tp-dp-cp", tp * dp * cp, _local(1, tp * dp * cp, gpn), bulk=False))
    if ep > 1:
        local = _local(tp * cp, ep, gpn)
        out.append(Communicator("ep", ep, local, collectives=False, p2p_peers=ep - 1))
    return out


NCCL_MIX_FIELDS = ("tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel", "zero_stage",
                   "context_parallel_impl", "fp8")
"""The Mix fields comm_buffer_bytes reads: the parallel layout, the sharding stage (DeepSpeed's extra communicator)
and FP8 (its amax group)."""
nccl_mix_key = attrgetter(*NCCL_MIX_FIELDS)
"""A mix's NCCL_MIX_FIELDS values, as a tuple."""


def comm_key(scn: Scenario) -> tuple:
    """What comm_buffer_bytes reads of a scenario: the GPU type, GPUs in all and per node, the mix's
    NCCL_MIX_FIELDS and the NCCL version."""
    cl = scn.cluster
    return (cl.gpu, cl.world_size, cl.gpus_per_node, *nccl_mix_key(scn.mix), scn.recipe.nccl_version)


def comm_buffer_bytes(scn: Scenario) -> float:
    """Bytes NCCL holds on each GPU of this run (the largest stage's view: a middle pipeline stage), outside the
    caching allocator: in what nvidia-smi counts, not in memory_reserved, and out of what torch can reserve. 0 on
    one GPU (no communicator)."""
    global _MEMO
    if scn.cluster.world_size <= 1:
        return 0.0
    if _MEMO.size() >= 1 << 16:
        _MEMO = CommBytes()
    return _MEMO.of(scn.cluster, scn.mix, scn.recipe.nccl_version)


class CommBytes:
    """comm_buffer_bytes of many runs (a search's mixes on its GPU types and counts), with its work shared: the
    communicators built once per GPU count, node size and comm_key's mix fields, each communicator's bytes once per
    GPU type and NCCL version, and their sum once per GPU type, NCCL version and set of communicators (equal sets
    recur: ZeRO's stage once a model-parallel group exists, the context-parallel kind without one). The same
    numbers, summed in the same order."""

    def __init__(self) -> None:
        self._sets: dict[tuple, int] = {}  # cluster shape and mix fields -> the id of its communicators' set
        self._ids: dict[tuple, int] = {}  # a set of communicators (as tuples) -> its id
        self._lists: list[tuple[list[Communicator], tuple]] = []  # per id: its communicators, and them as tuples
        self._sums: dict[tuple, float] = {}  # (GPU, NCCL version, set id) -> bytes
        self._each: dict[tuple, dict[tuple, float]] = {}  # (GPU, NCCL version) -> communicator (as a tuple) -> bytes
        self._gpus: dict[int, GpuSpec] = {}  # the GPUs keyed by id(), kept alive so that no id is reused
        self._builds: dict[str, NcclBuild] = {}

    def size(self) -> int:
        return len(self._sums) + len(self._sets)

    def of(self, cluster, mix, nccl_version: str) -> float:
        """comm_buffer_bytes of a scenario with this cluster, mix and NCCL version (only these it reads)."""
        if cluster.world_size <= 1:
            return 0.0
        return self._sum(cluster.gpu, nccl_version, self._set(cluster, mix))

    def of_clusters(self, clusters: Sequence, mix, nccl_versions: Sequence[str]) -> list[float]:
        """`of` of each cluster and NCCL version with one mix: the set of communicators found once per GPU count and
        node size (a search's capacity of one mix on every block)."""
        sets: dict[tuple[int, int], int] = {}
        out = []
        for cluster, nccl_version in zip(clusters, nccl_versions):
            if cluster.world_size <= 1:
                out.append(0.0)
                continue
            shape = cluster.world_size, cluster.gpus_per_node
            set_id = sets.get(shape)
            if set_id is None:
                set_id = sets[shape] = self._set(cluster, mix)
            out.append(self._sum(cluster.gpu, nccl_version, set_id))
        return out

    def _set(self, cluster, mix) -> int:
        """The id of the set of communicators of this cluster and mix."""
        key = (cluster.world_size, cluster.gpus_per_node, *nccl_mix_key(mix))
        set_id = self._sets.get(key)
        if set_id is None:
            comms = communicators(_Run(cluster, mix))
            shape = tuple((c.ranks, c.local_ranks, c.collectives, c.p2p_peers, c.bulk) for c in comms)
            set_id = self._sets[key] = self._ids.setdefault(shape, len(self._ids))
            if set_id == len(self._lists):
                self._lists.append((comms, shape))
        return set_id

    def _sum(self, gpu, nccl_version: str, set_id: int) -> float:
        """The bytes of a set of communicators on this GPU type and NCCL version."""
        at = (id(gpu), nccl_version, set_id)
        value = self._sums.get(at)
        if value is None:
            self._gpus.setdefault(id(gpu), gpu)
            build = self._builds.get(nccl_version)
            if build is None:
                build = self._builds[nccl_version] = nccl_build(nccl_version)
            each = self._each.get((id(gpu), nccl_version))
            if each is None:
                each = self._each[id(gpu), nccl_version] = {}
            value = 0  # sum()'s start: the communicators' bytes added in order
            for comm, key in zip(*self._lists[set_id]):
                one = each.get(key)
                if one is None:
                    one = each[key] = communicator_bytes(comm, gpu, build)
                value += one
            self._sums[at] = value
        return value


class _Run:
    """What communicators reads of a scenario: its cluster and mix."""

    __slots__ = ("cluster", "mix")

    def __init__(self, cluster, mix) -> None:
        self.cluster, self.mix = cluster, mix


_MEMO = CommBytes()
"""comm_buffer_bytes' shared work, cleared when it grows large."""
