"""Model references: presets, config files, the local HF cache, the name rule for fine-tuned variants, the config
fingerprint, the unknown-model error, and where the resolution is shown (stderr note, --json scenario)."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

import ftscope
from ftscope import FtscopeError, catalog
from ftscope.spec.resolve import name_words, preset_by_name, presets_like, resolve_model
from ftscope.spec.scenario import scenario_from_dict

_SCRIPT = Path(sys.executable).parent / "ftscope"
FTSCOPE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "ftscope.cli"]


@pytest.mark.parametrize("ref, preset", [
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b-v0.3"),
    ("mistralai/Mistral-7B-Instruct-v0.2", "mistral-7b"),           # v0.1's layout: "mistral-7b" inside the name
    ("microsoft/Phi-3-mini-128k-instruct", "phi-3-mini-4k"),        # alias phi-3-mini inside the name
    ("NousResearch/Hermes-3-Llama-3.1-8B", "llama-3.1-8b"),         # a community fine-tune
    ("unsloth/Llama-3.2-1B-Instruct-bnb-4bit", "llama-3.2-1b"),
    ("allenai/OLMo-2-1124-7B-SFT", "olmo-2-7b"),
    ("deepseek-ai/DeepSeek-R1-0528", "deepseek-v3"),
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
    ("google/gemma-2-9b-it", "gemma-2-9b"),
])
def test_name_rule_maps_fine_tuned_variants_to_their_preset(ref, preset):
    assert catalog.resolve_model_name(ref) is None  # not an alias: the rule does the work
    assert preset_by_name(ref) == preset
    model = resolve_model(ref)
    assert model.name == preset and model.total_params == resolve_model(preset).total_params
    assert preset in model.resolution and "by name" in model.resolution and ref in model.resolution


def test_name_words_drop_variant_words_and_the_org():
    assert name_words("meta-llama/Llama-3.3-70B-Instruct") == ("llama", "3.3", "70b")
    assert name_words("google/gemma-3-4b-it") == ("gemma", "3", "4b")
    assert name_words("org/Qwen3_8B_AWQ") == ("qwen3", "8b")


@pytest.mark.parametrize("preset", sorted(catalog.model_index()))
def test_every_preset_reference_maps_to_itself_under_the_name_rule(preset):
    entry = catalog.model_index()[preset]
    for ref in (preset, entry["hf_id"], *(entry.get("aliases") or [])):
        assert preset_by_name(ref) in (preset, None), ref  # None only where two presets share the words


def test_missing_paths_are_errors_not_names_to_guess_from(tmp_path):
    for ref in (str(tmp_path / "llama-3.1-8b-sft"), "./llama-3.1-8b-sft", "~/models/llama-3.1-8b-sft"):
        with pytest.raises(FtscopeError, match="unknown model"):
            resolve_model(ref)


def test_names_that_match_two_presets_equally_are_not_guessed():
    assert preset_by_name("someone/llama-3.1-8b-qwen3-8b-merge") is None
    with pytest.raises(FtscopeError, match="unknown model"):
        resolve_model("someone/llama-3.1-8b-qwen3-8b-merge")


def test_exact_presets_need_no_resolution_note():
    for ref in ("llama-3.1-8b", "meta-llama/Llama-3.1-8B", "microsoft/Phi-3-mini-4k-instruct", "google/gemma-3-4b-it"):
        assert resolve_model(ref).resolution == ""


def _write(folder: Path, cfg: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_a_present_config_is_counted_and_its_preset_named_by_fingerprint(tmp_path):
    cfg = {**catalog.model_config("llama-3.1-8b"), "_name_or_path": "my-sft", "torch_dtype": "float32"}
    model = resolve_model(str(_write(tmp_path / "my-sft", cfg) / "config.json"))
    assert model.total_params == resolve_model("llama-3.1-8b").total_params
    assert "llama-3.1-8b" in model.resolution and "fingerprint" in model.resolution
    grown = resolve_model(str(_write(tmp_path / "grown", {**cfg, "vocab_size": 128_264})))  # added tokens
    assert grown.resolution == "" and grown.total_params == model.total_params + 2 * 8 * 4096
    assert presets_like(resolve_model("llama-3.3-70b")) == ("llama-3.1-70b", "llama-3.3-70b")  # same layout


def test_hf_cache_prefers_the_snapshot_refs_main_names(tmp_path, monkeypatch):
    repo = tmp_path / "models--someorg--Llama-3.1-8B-Instruct"
    _write(repo / "snapshots" / "zzz-old", {**catalog.model_config("llama-3.2-1b")})
    _write(repo / "snapshots" / "aaa-main", {**catalog.model_config("llama-3.1-8b")})
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("aaa-main\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    model = resolve_model("someorg/Llama-3.1-8B-Instruct")
    assert model.total_params == resolve_model("llama-3.1-8b").total_params
    assert "llama-3.1-8b" in model.resolution and model.source.endswith("aaa-main")


def test_unknown_model_error_says_how_to_fetch_just_the_config():
    with pytest.raises(FtscopeError) as info:
        resolve_model("someorg/Brand-New-9B")
    text = str(info.value)
    assert "\n" not in text
    assert "hf download someorg/Brand-New-9B config.json --local-dir DIR" in text
    assert "huggingface-cli download someorg/Brand-New-9B config.json" in text
    assert "model: DIR/config.json" in text
    with pytest.raises(FtscopeError, match=r"did you mean: .*qwen3-8b.*hf download ORG/NAME config.json"):
        resolve_model("qwen3-8")


def test_the_resolution_is_logged_once_and_kept_in_the_json_scenario(caplog):
    ref = "meta-llama/Llama-3.2-3B-Instruct"
    with caplog.at_level(logging.INFO, logger="ftscope"):
        scn = ftscope.load_scenario({"model": ref, "workload": {"micro_batch_size": 1, "seq_len": 128}})
        ftscope.load_scenario({"model": ref, "workload": {"micro_batch_size": 2, "seq_len": 128}})
    notes = [r.getMessage() for r in caplog.records if "llama-3.2-3b" in r.getMessage()]
    assert len(notes) == 1
    out = scn.to_dict()
    assert out["model"] == ref and "llama-3.2-3b" in out["model_resolution"]
    assert scenario_from_dict(out).model.total_params == scn.model.total_params  # the output reads back in


def test_cli_prints_the_note_on_stderr_and_only_json_on_stdout():
    r = subprocess.run([*FTSCOPE, "show", "mistralai/Mistral-7B-Instruct-v0.3", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("ftscope: note: mistralai/Mistral-7B-Instruct-v0.3") and r.stderr.count("\n") == 1
    data = json.loads(r.stdout)
    assert data["name"] == "mistral-7b-v0.3" and "mistral-7b-v0.3" in data["resolution"]


# issue 19: the published Instruct / chat / -it (or other training-stage) model of every preset that has one
PUBLISHED_VARIANTS = {
    "llama-2-7b": ["meta-llama/Llama-2-7b-chat-hf"], "llama-2-13b": ["meta-llama/Llama-2-13b-chat-hf"],
    "llama-2-70b": ["meta-llama/Llama-2-70b-chat-hf"],
    "llama-3.1-8b": ["meta-llama/Llama-3.1-8B-Instruct"], "llama-3.1-70b": ["meta-llama/Llama-3.1-70B-Instruct"],
    "llama-3.1-405b": ["meta-llama/Llama-3.1-405B-Instruct", "meta-llama/Llama-3.1-405B-Instruct-FP8"],
    "llama-3.2-1b": ["meta-llama/Llama-3.2-1B-Instruct"], "llama-3.2-3b": ["meta-llama/Llama-3.2-3B-Instruct"],
    "llama-3.3-70b": ["meta-llama/Llama-3.3-70B-Instruct"],
    "llama-4-scout": ["meta-llama/Llama-4-Scout-17B-16E", "meta-llama/Llama-4-Scout-17B-16E-Instruct"],
    "llama-4-maverick": ["meta-llama/Llama-4-Maverick-17B-128E", "meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8"],
    "mistral-7b": ["mistralai/Mistral-7B-Instruct-v0.1"], "mistral-7b-v0.3": ["mistralai/Mistral-7B-Instruct-v0.3"],
    "mixtral-8x7b": ["mistralai/Mixtral-8x7B-Instruct-v0.1"],
    "mixtral-8x22b": ["mistralai/Mixtral-8x22B-Instruct-v0.1"],
    "mistral-small-24b": ["mistralai/Mistral-Small-24B-Instruct-2501"],
    "mistral-small-3.1-24b": ["mistralai/Mistral-Small-3.1-24B-Base-2503", "mistralai/Mistral-Small-3.2-24B-Instruct-2506",
                              "unsloth/Mistral-Small-3.1-24B-Instruct-2503-bnb-4bit"],
    "qwen2.5-7b": ["Qwen/Qwen2.5-7B-Instruct"], "qwen2.5-14b": ["Qwen/Qwen2.5-14B-Instruct"],
    "qwen2.5-72b": ["Qwen/Qwen2.5-72B-Instruct", "Qwen/Qwen2.5-72B-Instruct-AWQ"],
    "qwen1.5-moe-a2.7b": ["Qwen/Qwen1.5-MoE-A2.7B-Chat"],
    "qwen3-30b-a3b": ["Qwen/Qwen3-30B-A3B-Base", "Qwen/Qwen3-30B-A3B-Instruct-2507"],
    "qwen3-0.6b": ["Qwen/Qwen3-0.6B-Base"], "qwen3-8b": ["Qwen/Qwen3-8B-Base"], "qwen3-32b": ["Qwen/Qwen3-32B-FP8"],
    "olmoe-1b-7b": ["allenai/OLMoE-1B-7B-0924-Instruct"], "deepseek-v2-lite": ["deepseek-ai/DeepSeek-V2-Lite-Chat"],
    "deepseek-v3": ["deepseek-ai/DeepSeek-V3-Base", "deepseek-ai/DeepSeek-V3-0324"],
    "falcon-180b": ["tiiuae/falcon-180B-chat"], "gemma-2-9b": ["google/gemma-2-9b-it"],
    "gemma-3-1b": ["google/gemma-3-1b-pt"], "gemma-3-4b": ["google/gemma-3-4b-pt"],
    "gemma-3-27b": ["google/gemma-3-27b-pt"],
    "phi-3-mini-4k": ["microsoft/Phi-3-mini-4k-instruct"], "phi-4": ["unsloth/phi-4-bnb-4bit"],
    "olmo-2-7b": ["allenai/OLMo-2-1124-7B-Instruct"], "olmo-2-13b": ["allenai/OLMo-2-1124-13B-Instruct"],
    "smollm3-3b": ["HuggingFaceTB/SmolLM3-3B-Base"],
}
NO_PUBLISHED_VARIANT = {"phi-2", "blackmamba-2.8b", "gpt-oss-20b", "gpt-oss-120b"}  # one training stage published


def test_every_preset_is_listed_with_its_published_variants_or_as_having_none():
    assert set(PUBLISHED_VARIANTS) | NO_PUBLISHED_VARIANT == set(catalog.model_index())


@pytest.mark.parametrize("ref, preset", [(ref, p) for p, refs in PUBLISHED_VARIANTS.items() for ref in refs])
def test_published_variants_of_every_preset_resolve_to_it_without_a_config(ref, preset):
    assert (catalog.resolve_model_name(ref) or preset_by_name(ref)) == preset  # an alias, else the name rule
