"""layouts: which parallel layouts a candidate can run, its replicas and the pipeline's micro-batch cap."""
from __future__ import annotations

import pytest

import ftscope
from ftscope.errors import FtscopeError
from ftscope.plan.layouts import keep_global_batch, layout_reason, replicas


def _scn(gpus_per_node=8, nodes=1, ga=4, **mix):
    return ftscope.load_scenario({"model": "llama-2-7b", "hardware": {"gpu": "h100-80gb", "gpus_per_node": gpus_per_node,
                                                                      "nodes": nodes},
                                  "mix": {"method": "lora", **mix},
                                  "workload": {"micro_batch_size": 1, "seq_len": 2048, "gradient_accumulation": ga}})


def test_replicas_are_the_gpus_over_the_model_parallel_group():
    assert replicas(_scn()) == 8
    assert replicas(_scn(tensor_parallel=4, sequence_parallel=True)) == 2
    assert replicas(_scn(nodes=2, tensor_parallel=2, pipeline_parallel=2, context_parallel=2)) == 2


@pytest.mark.parametrize("changes,words", [(dict(gpus_per_node=4, nodes=1, tensor_parallel=8), "must divide the 4 GPUs"),
                                           (dict(gpus_per_node=2, nodes=4, tensor_parallel=4), "exceeds the 2 GPUs"),
                                           (dict(pipeline_parallel=8), "at least 8 micro-batches")])
def test_a_layout_the_scenario_would_refuse_is_unsupported_with_the_same_words(changes, words):
    base = _scn()
    scn = base.with_(**changes)
    reason = layout_reason(scn, None)
    assert reason.startswith("unsupported: ") and words in reason
    raw = {"model": "llama-2-7b", "hardware": {"gpu": "h100-80gb", "gpus_per_node": scn.cluster.gpus_per_node,
                                               "nodes": scn.cluster.nodes},
           "mix": {"method": "lora", **{k: v for k, v in changes.items() if k not in ("gpus_per_node", "nodes")}},
           "workload": {"micro_batch_size": 1, "seq_len": 2048, "gradient_accumulation": 4}}
    with pytest.raises(FtscopeError, match=words):
        ftscope.load_scenario(raw)


def test_a_fixed_global_batch_must_give_every_stage_a_micro_batch():
    scn = _scn(pipeline_parallel=4)
    assert layout_reason(scn, 8) is None                # 8 sequences over 2 replicas: 4 per replica, 4 stages: fills
    assert layout_reason(scn, 7) is not None
    assert layout_reason(scn.with_(gpus_per_node=4), 8) is None
    assert layout_reason(scn.with_(gpus_per_node=4), 3) is not None


def test_the_pipeline_caps_the_micro_batch_so_that_accumulation_fills_it():
    assert keep_global_batch(16, 64, 8) == (8, 1)
    mb, ga = keep_global_batch(16, 64, 2, stages=4)
    assert (mb, ga) == (8, 4) and ga >= 4
    for global_batch in range(8, 100):
        mb, ga = keep_global_batch(1000, global_batch, 2, stages=4)
        assert ga >= 4 and mb * ga * 2 >= global_batch
