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
