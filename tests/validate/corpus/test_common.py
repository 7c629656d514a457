"""Corpus mapping helpers (validate/corpus/common.py): numbers as printed, GPUs, memory kinds, LoRA targets."""
from __future__ import annotations

import pytest

from ftscope.validate.corpus.common import (FEATURES, Mapped, Measure, exact_gpu, gpu_key, hardware, lora_targets,
                                            memory_kind, number)


@pytest.mark.parametrize("text, value", [("76/80", 76.0), ("56.9%", 56.9), ("8*64GB", 64.0), ("16*60GiB", 60.0),
                                         ("72-80 (90-98%)", 76.0), (19.6, 19.6), ("none", None), (None, None),
                                         (True, None)])
def test_number(text, value):
    assert number(text) == value


@pytest.mark.parametrize("text, kind", [("peak active (torch.cuda memory_stats active_bytes.all.peak)", "allocated"),
                                        ("reserved", "reserved"), ("nvidia-smi screenshot", "smi"),
                                        ("used/total", "smi"), ("? (not stated)", "unknown"), (None, "unknown")])
def test_memory_kind(text, kind):
    assert memory_kind(text) == kind


def test_gpu_key_reads_the_first_word_and_says_what_it_assumed():
    assert gpu_key("h100-sxm-80gb (DGX-H100)") == ("h100-80gb", "")
    assert gpu_key("rtx3090-24gb (280 W cap, no NVLink, older PCIe board)")[0] == "rtx-3090"
    key, note = gpu_key("a100 (size not stated)")
    assert key == "a100-80gb" and "a100-80gb" in note
    assert not exact_gpu("a100 (size not stated)") and exact_gpu("a800-sxm4-80gb")
    key, note = gpu_key("dgx-gb300")
    assert key is None and "not in the catalog" in note


def test_hardware_fills_nodes_of_eight():
    assert hardware("h100-80gb", 512) == {"gpu": "h100-80gb", "gpus_per_node": 8, "nodes": 64}
    assert hardware("a40", 2) == {"gpu": "a40", "gpus_per_node": 2, "nodes": 1}
    assert hardware("a40", 16, inter_node_gbs=25.0)["inter_node_gbs"] == 25.0
    with pytest.raises(ValueError):
        hardware("a40", 12)


@pytest.mark.parametrize("text, targets", [("q,v", ["q_proj", "v_proj"]),
                                           ("q,k,v,o + mlp", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                              "up_proj", "down_proj"]),
                                           ("all-linear", "all-linear"), ("all (q,k,v,o,mlp,output)", "all-linear"),
                                           (["q_proj", "v_proj"], ["q_proj", "v_proj"])])
def test_lora_targets(text, targets):
    assert lora_targets(text) == targets


def test_why_not_names_every_missing_feature_and_clears_once_modelled():
    m = Mapped("p", "s", "fw", {"model": "x"}, (Measure("tokens_per_s_per_gpu", 1.0),),
               needs=("fp8", "tensor parallelism"))
    assert m.why_not(frozenset()) == f"{FEATURES['fp8']}; {FEATURES['tensor parallelism']}"
    assert m.why_not(frozenset({"fp8"})) == FEATURES["tensor parallelism"]
    assert m.why_not(frozenset({"fp8", "tensor parallelism"})) is None
    assert Mapped("p", "s", "fw", None, (), reason="batch not stated").why_not() == "batch not stated"
    assert Mapped("p", "s", "fw", {"model": "x"}, ()).why_not() == "measured nothing ftscope compares"
