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


def test_layout_reason_reads_only_the_layout_fields_of_the_mix():
    """classify.py checks one mix per distinct LAYOUT_FIELDS value and GPU count: every other Mix field, changed
    alone, leaves the answer (reason or None) as it was, on layouts that run and layouts that do not."""
    from dataclasses import fields

    from ftscope.plan.layouts import LAYOUT_FIELDS
    from ftscope.spec.mix import Mix
    from ftscope.spec.scenario import fast_replace
    others = dict(method="full", lora_rank=64, lora_targets="attention", gradient_checkpointing=True,
                  attention="eager", zero_stage=3, fsdp="full_shard", offload="optimizer+params", precision="bf16",
                  optimizer="adamw_8bit", experts_top_k=1, experts_backend="modules", loss="chunked",
                  fused_elementwise=True, lora_dropout=0.1, checkpointing="selective", checkpoint_every=2,
                  sequence_parallel=True, tp_comm_overlap=True, pipeline_schedule="interleaved", fp8=True,
                  compile=True, activation_offload=True, nested_quant=False)
    assert set(others) | set(LAYOUT_FIELDS) == {f.name for f in fields(Mix)}
    layouts = [dict(), dict(tensor_parallel=2), dict(tensor_parallel=16), dict(pipeline_parallel=8),
               dict(pipeline_parallel=2, context_parallel=2), dict(context_parallel=4, context_parallel_impl="all_to_all"),
               dict(expert_parallel=2), dict(optimizer_in_backward=True), dict(pipeline_parallel=64)]
    for nodes in (1, 2):
        for layout in layouts:
            scn = _scn(nodes=nodes)
            scn = fast_replace(scn, mix=fast_replace(scn.mix, **layout))
            for global_batch in (None, 8):
                want = layout_reason(scn, global_batch)
                for name, value in others.items():
                    changed = fast_replace(scn, mix=fast_replace(scn.mix, **{name: value}))
                    assert layout_reason(changed, global_batch) == want, (layout, name)
