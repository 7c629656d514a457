"""The parallel layout (estimate/layout.py): degrees, data-parallel ranks and the links each group uses."""
from __future__ import annotations

import ftscope
from ftscope.estimate.layout import layout


def scn(gpu="a100-80gb", per=8, nodes=1, inter=25.0, **mix):
    return ftscope.load_scenario({"model": "llama-2-7b", "framework": "hf-trainer",
                                  "hardware": {"gpu": gpu, "gpus_per_node": per, "nodes": nodes, "inter_node_gbs": inter},
                                  "mix": {"method": "full", **mix},
                                  "workload": {"micro_batch_size": 1, "seq_len": 4096, "gradient_accumulation": 8}})


def test_degrees_and_data_parallel_ranks():
    lay = layout(scn(nodes=4, tensor_parallel=2, pipeline_parallel=2, context_parallel=2))
    assert (lay.tp, lay.pp, lay.cp, lay.dp) == (2, 2, 2, 4)
    assert lay.model_parallel == 8
    assert layout(scn()).dp == 8 and layout(scn()).bubble == 0


def test_pipeline_bubble_shrinks_with_virtual_stages():
    one = layout(scn(pipeline_parallel=4))
    inter = layout(scn(pipeline_parallel=4, pipeline_schedule="interleaved", virtual_stages=4))
    assert one.bubble == 3 and inter.bubble == 0.75


def test_links():
    a100 = layout(scn(nodes=2, tensor_parallel=8))
    assert a100.tp_gbs == 300            # NVLink inside the node
    assert a100.dp_gbs == min(300, 8 * 25.0)   # rings over every NIC of a node
    one_node = layout(scn())
    assert one_node.dp_gbs == 300
    pcie = layout(scn(gpu="rtx-4090", per=2))
    assert pcie.dp_gbs == 16             # GeForce: no P2P, through host memory
    pp = layout(scn(nodes=2, pipeline_parallel=2))
    assert pp.pp_gbs == 25.0 and pp.dp_gbs == 300   # stages on different nodes: one NIC per send


def test_pipeline_sends_cross_nodes_only_at_node_boundaries():
    # 16 GPUs in 2 nodes, 4 stages of 4 ranks: half the ranks send to a stage in the other node
    half = layout(scn(nodes=2, pipeline_parallel=4))
    assert half.pp_gbs == 1.0 / (0.5 / 25.0 + 0.5 / 300)
    assert layout(scn(pipeline_parallel=4)).pp_gbs == 300      # one node: every send over NVLink
    assert layout(scn(nodes=8, pipeline_parallel=8)).pp_gbs == 25.0   # a stage per node: every send crosses
