"""GpuSpec from the catalog or inline, and the Cluster a run uses."""
from __future__ import annotations

import pytest

from ftscope import FtscopeError
from ftscope.spec.hardware import GIB, MIB, Cluster, gpu_from_catalog, gpu_from_inline


def test_catalog_gpu_memory_is_the_catalog_mib_in_bytes():
    gpu = gpu_from_catalog("a100-80gb")
    assert gpu.memory_bytes % MIB == 0
    assert gpu.memory_gib == gpu.memory_bytes / GIB
    assert 79 < gpu.memory_gib <= 80


def test_matmul_peak_follows_the_precision():
    gpu = gpu_from_catalog("h100-80gb")
    assert gpu.matmul_tflops("bf16-mixed") == gpu.matmul_tflops("bf16") == gpu.bf16_tflops
    assert gpu.matmul_tflops("fp16-mixed") == gpu.fp16_tflops
    assert gpu.matmul_tflops("fp32") == gpu.tf32_tflops  # fp32 matmuls run on TF32 tensor cores
    assert gpu.matmul_tflops("fp32") < gpu.matmul_tflops("bf16-mixed")


def test_gpu_without_bf16_falls_back_to_fp16_peak():
    gpu = gpu_from_catalog("v100-32gb")
    assert gpu.bf16_tflops is None and not gpu.bf16
    assert gpu.matmul_tflops("bf16-mixed") == gpu.fp16_tflops


def test_inline_gpu_with_base_overrides_only_what_it_names():
    base = gpu_from_catalog("a100-80gb")
    gpu = gpu_from_inline({"base": "a100-80gb", "memory_gib": 96})
    assert gpu.memory_bytes == 96 * GIB
    assert gpu.bf16_tflops == base.bf16_tflops and gpu.memory_bandwidth_gbs == base.memory_bandwidth_gbs
    assert gpu.key == "a100-80gb*"


def test_inline_gpu_memory_mib_is_read_in_mib():
    assert gpu_from_inline({"base": "l4", "memory_mib": 2000}).memory_bytes == 2000 * MIB


def test_inline_gpu_without_base_needs_the_rates():
    full = {"name": "MyGPU", "memory_gib": 24, "fp16_tflops": 100, "fp32_tflops": 10, "memory_bandwidth_gbs": 900}
    gpu = gpu_from_inline(full)
    assert gpu.key == "custom" and gpu.memory_bytes == 24 * GIB
    assert gpu.bf16_tflops == 100  # bf16 assumed at the fp16 rate unless said otherwise
    with pytest.raises(FtscopeError, match="fp32_tflops"):
        gpu_from_inline({k: v for k, v in full.items() if k != "fp32_tflops"})


def test_inline_gpu_unknown_key_suggests_the_nearest():
    with pytest.raises(FtscopeError, match=r"hardware.gpu.memory_gb.*did you mean: memory_gib"):
        gpu_from_inline({"base": "a100-80gb", "memory_gb": 96})


@pytest.mark.parametrize("key, value", [("memory_gib", 0), ("memory_gib", -8), ("fp32_tflops", 0),
                                        ("memory_bandwidth_gbs", -1), ("fp16_tflops", True),
                                        ("intra_node_gbs", "fast")])
def test_inline_gpu_rejects_non_positive_or_non_numeric_values(key, value):
    with pytest.raises(FtscopeError, match=rf"hardware.gpu.{key} must be a finite number from"):
        gpu_from_inline({"base": "a100-80gb", key: value})


@pytest.mark.parametrize("value", ["lots", float("nan"), float("inf")])
def test_inline_gpu_bad_memory_value_is_an_ftscope_error(value):
    with pytest.raises(FtscopeError):
        gpu_from_inline({"base": "a100-80gb", "memory_gib": value})


@pytest.mark.parametrize("key, value", [("bf16_tflops", "x"), ("bf16_tflops", -5), ("tf32_tflops", -1)])
def test_inline_gpu_bad_peak_rate_is_an_ftscope_error(key, value):
    with pytest.raises(FtscopeError):
        gpu_from_inline({"base": "a100-80gb", key: value})


def test_cluster_world_size_is_gpus_per_node_times_nodes():
    assert Cluster(gpu_from_catalog("h100-80gb"), gpus_per_node=8, nodes=4).world_size == 32
