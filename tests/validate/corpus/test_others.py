"""Headline-only sources (validate/corpus/others.py)."""
from __future__ import annotations

import pytest

from ftscope import load_scenario
from ftscope.estimate.memory import memory_model
from ftscope.validate.corpus.others import hf_4bit, hf_fsdp_70b, llamafactory, misc, ms_swift, peft


def test_llamafactory_rows_are_listed_with_why(point):
    m = llamafactory(*point("llamafactory-wiki-performance-comparison", "llamafactory-wiki-llama2-7b-hf+fa2-16bit"))
    assert "dataset not stated" in m.reason and len(m.measures) == 2
    m = llamafactory(*point("llamafactory-wiki-performance-comparison", "llamafactory-wiki-llama2-7b-unsloth+fa2-4bit"))
    assert "Unsloth" in m.reason and m.framework == "unsloth" and len(m.measures) == 2


def test_hf_4bit_rows_are_oom_outcomes(point):
    m = hf_4bit(*point("hf-blog-4bit-bitsandbytes", "hfblog-bnb4-llama-7b-4bit-nf4-gc1-bf16-s1024-g1"))
    s = load_scenario(m.scenario)
    assert s.cluster.gpu.key == "t4" and s.mix.method == "qlora" and s.mix.gradient_checkpointing
    assert [(x.metric, x.value) for x in m.measures] == [("oom", 0.0)]
    m = hf_4bit(*point("hf-blog-4bit-bitsandbytes", "hfblog-bnb4-llama-7b-8bit-llm.int8-gc1-na-s1024-g1"))
    assert "8-bit" in m.reason and m.measures[0].value == 1.0


def test_hf_4bit_notes_tell_nested_rows_and_the_unexplained_oom(point):
    plain = hf_4bit(*point("hf-blog-4bit-bitsandbytes", "hfblog-bnb4-llama-13b-4bit-nf4-gc1-fp16-s1024-g1")).notes
    nested = hf_4bit(*point("hf-blog-4bit-bitsandbytes", "hfblog-bnb4-llama-13b-4bit-nf4+nested-gc1-fp16-s1024-g1")).notes
    assert any("without nested" in n for n in plain) and not any("without nested" in n for n in nested)
    assert any("unexplained" in n and "hf2023_qlora_step_trace" in n for n in plain)
    assert not any("unexplained" in n for n in nested)


def test_hf_4bit_rows_say_whether_quantization_is_nested(point):
    """The T4 table's rows name nf4+nested, nf4 or fp4: only the first double-quantizes (fp4 packs as nf4 does);
    the 13B pair at 1,024 tokens differs by 0.5625 - 0.516 B on each of its 12.7B 4-bit weights."""
    def scn(case):
        return load_scenario(hf_4bit(*point("hf-blog-4bit-bitsandbytes", case)).scenario)
    plain = scn("hfblog-bnb4-llama-13b-4bit-nf4-gc1-fp16-s1024-g1")
    nested = scn("hfblog-bnb4-llama-13b-4bit-nf4+nested-gc1-fp16-s1024-g1")
    fp4 = scn("hfblog-bnb4-llama-13b-4bit-fp4-gc0-bf16-s512-g1")
    assert (plain.mix.nested_quant, nested.mix.nested_quant, fp4.mix.nested_quant) == (False, True, False)
    grown = memory_model(plain).weights - memory_model(nested).weights
    assert grown == pytest.approx(plain.model.quantizable_params() * (4 / 64 - 1 / 64 - 4 / 16384))
    assert 0.54 < grown / 2**30 < 0.56


def test_peft_rows(point):
    m = peft(*point("peft-docs-and-readme-memory", "peft-doc-zero3-lora-llama2-70b-8xh100"))
    assert load_scenario(m.scenario).mix.zero_stage == 3
    assert m.measures[0].metric == "peak_gib:smi" and m.measures[0].value == 64
    fsdp = load_scenario(peft(*point("peft-docs-and-readme-memory", "peft-doc-fsdp-lora-llama2-70b-8xh100")).scenario)
    assert fsdp.recipe.name == "peft-sft-2024" and fsdp.recipe.lora_base_fp32  # the script's fp32 load
    assert fsdp.mix.precision == "bf16-mixed" and fsdp.mix.lora_dropout == 0.1  # --bf16 True, --lora_dropout 0.1
    qlora = peft(*point("peft-docs-and-readme-memory", "peft-doc-zero3-qlora-llama2-70b-2x40gb")).scenario
    assert qlora["mix"]["nested_quant"] is True  # "bnb nf4 + double quant"
    m = peft(*point("peft-docs-and-readme-memory", "peft-readme-bloomz-7b1-full"))
    assert "no architecture" in m.reason and m.measures[0].metric == "oom"


def test_headline_sources_are_listed_with_their_numbers(point):
    m = ms_swift(*point("ms-swift-megatron-benchmark", "msswift-qwen3-30b-a3b-deepspeed-zero2"))
    assert m.reason and m.measures[0].metric == "oom" and m.framework == "ms-swift"
    assert hf_fsdp_70b(*point("hf-blog-fsdp-llama2-70b", "hfblog-fsdp-llama2-70b-chat-16xa100")).reason
    m = misc(*point("misc-single-points", "galore-llama-7b-4090-8bit-per-layer"))
    assert "GaLore" in m.reason and m.framework == "galore"
