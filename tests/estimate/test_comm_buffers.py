"""NCCL's buffers outside the caching allocator (estimate/comm_buffers.py), checked against hand counts from the
constants the module cites."""
from __future__ import annotations

from dataclasses import replace

import pytest

from ftscope.estimate import comm_buffers as cb
from ftscope.errors import FtscopeError
from ftscope.estimate import estimate
from ftscope.spec.hardware import gpu_from_catalog
from ftscope.spec.scenario import scenario_from_dict

MIB = 2**20
H100, H800, A100, A800 = (gpu_from_catalog(k) for k in ("h100-80gb", "h800", "a100-80gb", "a800-80gb"))


def _scn(gpus: int, nodes: int = 1, gpu: str = "h100-80gb", **mix) -> object:
    return scenario_from_dict({"model": "meta-llama/Llama-3.1-8B", "hardware": {"gpu": gpu, "gpus_per_node": gpus,
                                                                                 "nodes": nodes},
                               "mix": {"method": "full", **mix}, "workload": {"seq_len": 2048, "micro_batch_size": 1,
                                                                          "gradient_accumulation": 4}})


def test_protocol_buffers_from_the_cited_constants():
    assert cb.LL_BYTES == 512 * 1024  # 8 lines x 512 threads x 8 steps x 16 B
    assert cb.LL128_BYTES == 4_915_200  # 120 x 640 x 8 x 8 B
    assert cb.SIMPLE_BYTES == 4 * MIB
    # receiver: LL + LL128 + SIMPLE = 9.19 MiB -> 10 MiB; sender: ncclSendMem -> 2 MiB (NVIDIA/nccl#1685's two sizes)
    assert cb.CONNECTION_PAIR_BYTES == 10 * MIB + 2 * MIB


def test_ring_channels_follow_nvlink_count():
    # H100 SXM: 18 x 20.6 GB/s: 6 channels at 60, duplicated to 12, doubled to 24 (NCCL logs "Channel 23")
    assert cb.nvlinks(H100) == 18 and cb.ring_channels(H100) == 24
    # H800 / A800: 8 NVLinks: 4 channels at 40, duplicated, doubled: 16 ("16 coll channels", NVIDIA/nccl#892)
    assert cb.ring_channels(H800) == 16 and cb.ring_channels(A800) == 16
    assert cb.ring_channels(A100) == 24  # 12 x 20 GB/s: 6 at 40, duplicated, doubled
    assert cb.ring_channels(gpu_from_catalog("a40")) == 4  # PCIe Gen4 (24 GB/s): two channels at 12, doubled
    assert cb.ring_channels(H100, nodes=3, local_ranks=8) == 16
    assert cb.p2p_channels_per_peer(H100, 24) == 32  # 2 x 18 -> 64, capped at the 32 p2p channels


def test_h100_node_by_hand():
    """One 8-GPU H100 communicator running large collectives under NCCL 2.27, counted by hand."""
    comm = cb.Communicator("world", 8, 8)
    book = (3 * 32 + 2) * 2 * MIB  # 3 tables x 32 channels (24 rounded up to a power of two) + 2, at 2 MiB each
    ring = 24 * 12 * MIB
    nvls = 16 * 2 * (8 * 128 * 1024) * 8 + 16 * 2 * MIB  # 16 channels x 2 buffers x 1 MiB x 8 heads, + tables
    assert cb.communicator_bytes(comm, H100, cb.nccl_build("2.27")) == book + ring + nvls
    # NCCL 2.20 binds rings, trees and NVLS at init, NVLS sized by the 24 ring channels with 4 + 2 MiB per buffer
    old = book + 2 * ring + 24 * 2 * (4 * MIB + 2 * MIB) * 8 + 24 * 2 * MIB
    assert cb.communicator_bytes(comm, H100, cb.nccl_build("2.20")) == old
    assert old / 2**30 == pytest.approx(3.05, abs=0.01)


def test_nvls_buffer_of_an_h200_node_against_a_public_nccl_log(monkeypatch):
    """vllm-project/vllm#9699 (2024-10-25, 8 x H200, torch 2.4's NCCL 2.20.5) logs the NVLS buffer NCCL binds per GPU:
    "NVLS comm ... nHeads 8 buffSize 4194304 memSize 2097152 nvlsPerRankSize 301989888 nvlsTotalSize 2415919104".
    The model's NVLS part (with NVLS minus without) is that total plus one 2 MiB peer
    table per channel, 24 channels (nvlsPerRankSize / (2 x (buffSize + memSize)))."""
    h200, build = gpu_from_catalog("h200"), cb.nccl_build("2.20")
    assert cb.nvls_capable(h200) and cb.ring_channels(h200, 1, 8) == 301989888 // (2 * (4194304 + 2097152))
    comm = cb.Communicator("world", 8, 8)
    with_nvls = cb.communicator_bytes(comm, h200, build)
    monkeypatch.setattr(cb, "nvls_capable", lambda gpu: False)
    nvls = with_nvls - cb.communicator_bytes(comm, h200, build)
    assert nvls == 2415919104 + 24 * 2 * MIB


def test_no_nvls_without_nvswitch_or_on_two_gpus():
    build = cb.nccl_build("2.27")
    two = cb.communicator_bytes(cb.Communicator("world", 2, 2), H100, build)
    assert two == (3 * 32 + 2) * 2 * MIB + 24 * 12 * MIB
    a100 = cb.communicator_bytes(cb.Communicator("world", 8, 8), A100, build)
    assert a100 == (3 * 32 + 2) * 2 * MIB + 24 * 12 * MIB  # Ampere: no NVLS, single node: no trees from 2.23


def test_geforce_without_peer_access_keeps_only_the_tables():
    rtx = gpu_from_catalog("rtx-4090")  # no P2P: the SHM transport's buffers live in host memory
    assert not rtx.peer_to_peer
    c = cb.ring_channels(rtx)
    held = cb.communicator_bytes(cb.Communicator("world", 2, 2), rtx, cb.nccl_build("2.27"))
    assert held == (3 * c + 2) * 2 * MIB
    assert cb.communicator_bytes(cb.Communicator("world", 2, 2), gpu_from_catalog("rtx-a6000"),
                                 cb.nccl_build("2.27")) == held + c * 12 * MIB


def test_single_rank_and_single_gpu_hold_nothing():
    assert cb.communicator_bytes(cb.Communicator("tp", 1, 1), H100, cb.nccl_build("2.19")) == 0.0
    assert cb.comm_buffer_bytes(_scn(1)) == 0.0
    est = estimate(_scn(1))
    mem = est.to_dict()["memory"]
    assert mem["nccl_gib"] == 0.0
    assert mem["device_gib"] == pytest.approx(mem["peak_gib"] + 0.5, abs=0.002)


def test_more_communicators_more_bytes():
    data_parallel = cb.comm_buffer_bytes(_scn(8))
    megatron = cb.comm_buffer_bytes(_scn(8, tensor_parallel=2))
    assert [c.name for c in cb.communicators(_scn(8))] == ["world"]
    assert len(cb.communicators(_scn(8, tensor_parallel=2))) > 1
    assert megatron > data_parallel > 0
    piped = cb.comm_buffer_bytes(_scn(8, tensor_parallel=2, pipeline_parallel=2))
    assert piped > cb.comm_buffer_bytes(_scn(8, tensor_parallel=4))  # the pipeline's send/recv connections


def test_older_nccl_holds_more_and_the_recipe_chooses():
    scn = _scn(8)
    new = cb.comm_buffer_bytes(scn)
    old = cb.comm_buffer_bytes(replace(scn, recipe=replace(scn.recipe, nccl_version="2.19")))
    assert old > new
    assert new / 2**30 == pytest.approx(0.75, abs=0.01)  # 196 + 288 + 256 + 32 MiB


def test_device_gib_adds_nccl_and_reserved_does_not_move():
    one, eight = estimate(_scn(1)).to_dict()["memory"], estimate(_scn(8, zero_stage=3)).to_dict()["memory"]
    assert eight["nccl_gib"] > 0.5
    assert eight["device_gib"] == pytest.approx(eight["peak_gib"] + 0.5 + eight["nccl_gib"], abs=0.002)
    assert one["nccl_gib"] == 0.0


def test_bad_nccl_version_is_refused():
    from ftscope.errors import FtscopeError
    from ftscope.spec.recipe import recipe_from_dict
    with pytest.raises(FtscopeError, match="nccl_version"):
        recipe_from_dict({"name": "x", "title": "x", "version": "x", "nccl_version": "new"})


def test_context_parallel_sends_to_its_neighbours():
    ring = {c.name: c for c in cb.communicators(_scn(8, context_parallel=4))}["cp"]
    assert ring.p2p_peers == 2 and not ring.bulk
    ulysses = {c.name: c for c in cb.communicators(_scn(8, context_parallel=4, context_parallel_impl="all_to_all"))}
    assert ulysses["cp"].p2p_peers == 3
    assert cb.comm_buffer_bytes(_scn(8, context_parallel=4, context_parallel_impl="all_to_all")) > \
        cb.comm_buffer_bytes(_scn(8, context_parallel=4))


def test_shared_work_gives_each_runs_own_sum():
    """CommBytes (what comm_buffer_bytes and the search's scan read) shares communicators, their bytes and sums across
    runs: each run's number is still the sum of its own communicators' bytes, in order, on every GPU type, count,
    node size and layout, whichever runs came before it."""
    memo = cb.CommBytes()
    seen = set()
    for gpu in ("h100-80gb", "a100-80gb", "h800", "a40", "rtx-4090"):
        for gpus, nodes in ((1, 1), (2, 1), (8, 1), (8, 2), (4, 4), (1, 8)):
            for mix in ({}, {"zero_stage": 2}, {"zero_stage": 3}, {"tensor_parallel": 2, "sequence_parallel": True},
                        {"tensor_parallel": 2, "pipeline_parallel": 2, "sequence_parallel": True},
                        {"context_parallel": 2}, {"context_parallel": 2, "context_parallel_impl": "all_to_all"},
                        {"tensor_parallel": 2, "sequence_parallel": True, "fp8": True}):
                try:
                    scn = _scn(gpus, nodes, gpu, **mix)
                except FtscopeError:  # a layout this count cannot hold
                    continue
                build = cb.nccl_build(scn.recipe.nccl_version)
                want = (0.0 if scn.cluster.world_size <= 1 else
                        sum(cb.communicator_bytes(c, scn.cluster.gpu, build) for c in cb.communicators(scn)))
                got = memo.of(scn.cluster, scn.mix, scn.recipe.nccl_version)
                assert got == want and type(got) is type(want), (gpu, gpus, nodes, mix)
                assert cb.comm_buffer_bytes(scn) == want
                seen.add(want)
    assert len(seen) > 20


def test_one_mix_on_many_clusters_gives_each_clusters_own_bytes():
    """CommBytes.of_clusters (the scan's capacities of one mix on every block: the communicators found once per GPU
    count and node size) answers `of` of each cluster and NCCL version, on several GPU types, counts, node sizes,
    layouts and two NCCL versions, in any order."""
    clusters, versions = [], []
    for gpu in ("h100-80gb", "a100-80gb", "a40"):
        for gpus, nodes in ((1, 1), (2, 1), (8, 1), (8, 2), (4, 4), (1, 8)):
            for version in ("2.21", "2.19"):
                clusters.append(_scn(gpus, nodes, gpu).cluster)
                versions.append(version)
    clusters, versions = clusters[::-1] + clusters, versions[::-1] + versions
    checked = 0
    for mix in ({}, {"zero_stage": 3}, {"tensor_parallel": 2, "sequence_parallel": True},
                {"tensor_parallel": 2, "pipeline_parallel": 2, "sequence_parallel": True, "fp8": True},
                {"context_parallel": 2, "context_parallel_impl": "all_to_all"}):
        mix = _scn(8, **mix).mix
        got = cb.CommBytes().of_clusters(clusters, mix, versions)
        want = [cb.CommBytes().of(c, mix, v) for c, v in zip(clusters, versions)]
        assert got == want and all(type(g) is float for g in got)
        checked += sum(w > 0 for w in want)
    assert checked > 100
