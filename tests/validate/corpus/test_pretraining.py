"""Pre-training-style sources (validate/corpus/pretraining.py): layouts, precision and needs per point."""
from __future__ import annotations

import pytest

from ftscope import load_scenario
from ftscope.validate.corpus.pretraining import _flagperf_layout, flagperf, foundry, nemo, xtuner

FOUNDRY = "llm-foundry-mpt-benchmarks"
FLAGPERF = "flagperf-training-nvidia"


def test_foundry_point_is_packed_fsdp_with_its_layout(point):
    m = foundry(*point(FOUNDRY, "foundry-h100ls-70b-s2048-g512-mb8-amp_bf16"))
    s = load_scenario(m.scenario)
    assert (s.cluster.gpu.key, s.cluster.gpus_per_node, s.cluster.nodes) == ("h100-80gb", 8, 64)
    assert s.mix.fsdp == "full_shard" and s.mix.gradient_checkpointing and s.mix.method == "full"
    assert s.workload.padding == "packed" and s.workload.seq_len == 2048 and s.workload.micro_batch_size == 8
    assert m.needs == () and m.framework == "llm-foundry"
    assert s.mix.loss == "fused" and s.mix.fused_elementwise   # flash-attn's cross-entropy; MPT's fused blocks
    metrics = {x.metric: x.value for x in m.measures}
    assert metrics == {"tokens_per_s_per_gpu": 1007, "mfu": pytest.approx(0.4125)}


def test_foundry_attention_kernel_follows_the_table(point):
    assert foundry(*point(FOUNDRY, "foundry-h100ls-70b-s2048-g512-mb8-amp_bf16")).scenario["mix"]["attention"] == "flash"
    assert foundry(*point(FOUNDRY, "foundry-a10080-7b-s1024-g8-mb64-amp_bf16")).scenario["mix"]["attention"] == "flash1"


def test_foundry_fp8_rows_need_fp8(point):
    m = foundry(*point(FOUNDRY, "foundry-h100fp8-3b-s2048-g8-mb10-amp_fp8"))
    assert m.needs == ("fp8",) and m.scenario["mix"]["fp8"] is True


def test_flagperf_layout_parsing():
    assert _flagperf_layout("PP2 DP4 TP1") == {"pp": 2, "dp": 4, "tp": 1, "ep": 1}
    assert _flagperf_layout("PP2 DP2 EP1 TP8") == {"pp": 2, "dp": 2, "tp": 8, "ep": 1}
    assert _flagperf_layout("single GPU") == {"pp": 1, "dp": 1, "tp": 1, "ep": 1}


def test_flagperf_megatron_rows_need_their_layout_and_selective_recompute(point):
    m = flagperf(*point(FLAGPERF, "flagperf-llama3-8b-a800-pp2dp2tp2"))
    assert set(m.needs) == {"selective checkpointing", "tensor parallelism", "pipeline parallelism"}
    assert m.scenario["mix"]["tensor_parallel"] == 2 and m.scenario["mix"]["pipeline_parallel"] == 2
    assert m.scenario["workload"]["gradient_accumulation"] == 512 // 2
    assert m.framework == "megatron-core"


def test_flagperf_zero3_row_maps_and_reads_smi_memory(point):
    m = flagperf(*point(FLAGPERF, "flagperf-llama2-7b-a800-zero3"))
    assert m.why_not() is None
    s = load_scenario(m.scenario)
    assert s.mix.zero_stage == 3 and s.cluster.gpu.key == "a800-80gb" and s.cluster.world_size == 8
    metrics = {x.metric: x.value for x in m.measures}
    assert metrics["peak_gib:smi"] == 57 and metrics["mfu"] == pytest.approx(0.479)


def test_flagperf_fp8_mfu_ranges_are_not_compared(point):
    m = flagperf(*point(FLAGPERF, "flagperf-llama3-8b-h100-pp1dp4tp2-fp8"))
    assert "mfu" not in {x.metric for x in m.measures} and "fp8" in m.needs


def test_xtuner_sequence_parallel_rows_need_context_parallelism(point):
    m = xtuner(*point("xtuner-speed-benchmark", "xtuner-llama-2-7b-s131072-sp8-g8"))
    assert m.needs == ("context parallelism",) and m.scenario["mix"]["context_parallel"] == 8
    m = xtuner(*point("xtuner-speed-benchmark", "xtuner-llama-2-7b-s8192-sp1-g8"))
    assert m.needs == () and load_scenario(m.scenario).mix.zero_stage == 3


def test_nemo_rows_without_an_architecture_are_listed(point):
    m = nemo(*point("nvidia-nemo-megatron-bridge-perf", "nemo2407-pretrain-gpt3-5b-g64"))
    assert m.scenario is None and "gpt3-5b" in m.reason
    assert m.measures[0].metric == "tokens_per_s_per_gpu"


def test_nemo_layout_maps_to_mix_keys(point):
    m = nemo(*point("nvidia-nemo-megatron-bridge-perf", "nemo2407-pretrain-llama-3-70b-g64"))
    s = load_scenario(m.scenario)
    assert (s.mix.tensor_parallel, s.mix.pipeline_parallel, s.mix.context_parallel) == (4, 4, 2)
    assert s.mix.pipeline_schedule == "interleaved" and s.mix.virtual_stages == 5 and s.mix.fp8
    assert s.workload.gradient_accumulation == 128 // (64 // 32)
    assert set(m.needs) == {"tensor parallelism", "pipeline parallelism", "context parallelism", "fp8"}
