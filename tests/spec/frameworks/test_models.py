"""Model ids in framework configs: presets, same-architecture variants (said in a note), torchtune builders."""
import pytest

from ftscope.spec.frameworks.models import model_ref, prequantized, torchtune_builder, torchtune_model


@pytest.mark.parametrize("name,preset,noted", [
    ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-hf", False),
    ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3.1-8b", True),
    ("NousResearch/Meta-Llama-3-8B", "llama-3.1-8b", True),
    ("casperhansen/llama-3-70b-fp16", "llama-3.1-70b", True),
    # fine-tuned variants the scenario's own model resolution matches by name go through unchanged (it notes them)
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct", False),
    ("someone/unknown-model", "someone/unknown-model", False),
])
def test_model_ref(name, preset, noted):
    ref, note = model_ref(name)
    assert ref == preset and bool(note) == noted


def test_prequantized_and_torchtune_names():
    assert prequantized("TechxGenus/Meta-Llama-3-8B-Instruct-AWQ") == "AWQ" and prequantized("llama-2-7b") is None
    assert torchtune_model("torchtune.models.llama3_1.qlora_llama3_1_8b") == ("qlora", "llama-3.1-8b", "llama3_1_8b")
    assert torchtune_model("torchtune.models.llama3.llama3_8b")[:2] == ("full", "llama-3-8b")
    assert torchtune_builder("qwen2.5-7b") == "qwen2_5_7b_base" and torchtune_builder("mixtral-8x7b") is None
