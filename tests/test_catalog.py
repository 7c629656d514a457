"""The bundled catalog: model configs, GPU datasheet numbers, dated prices, example scenarios."""
from __future__ import annotations

import datetime as dt
import json
import math
from importlib import resources
from pathlib import Path

import pytest

import ftscope
from ftscope import FtscopeError, catalog
from ftscope.spec.architecture import normalize
from ftscope.spec.hardware import GIB, gpu_from_catalog
from ftscope.spec.resolve import load_model

MODELS_DIR = resources.files("ftscope.catalog").joinpath("models")
EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))

# issue 2: the presets and GPUs the catalog must hold
REQUIRED_MODELS = [
    "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.2-1b", "llama-3.2-3b",
    "mistral-7b", "mixtral-8x7b", "mixtral-8x22b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-72b",
    "qwen1.5-moe-a2.7b", "qwen3-30b-a3b", "olmoe-1b-7b", "deepseek-v2-lite", "phi-2", "falcon-180b",
    "gemma-2-9b", "blackmamba-2.8b",
]
REQUIRED_GPUS = ["a40", "a100-40gb", "a100-80gb", "h100-80gb", "h100-pcie", "h200", "l40s", "l4", "a10g",
                 "rtx-4090", "rtx-3090", "rtx-a6000", "v100-32gb", "t4", "mi300x", "b200"]

# Marketing memory size in GB (vendor spec sheets); the device reports a little less (ECC, reserved).
NOMINAL_MEMORY_GB = {"a40": 48, "a100-40gb": 40, "a100-80gb": 80, "h100-80gb": 80, "h100-pcie": 80, "h200": 141,
                     "l40s": 48, "l4": 24, "a10g": 24, "rtx-4090": 24, "rtx-3090": 24, "rtx-a6000": 48,
                     "v100-32gb": 32, "t4": 16, "mi300x": 192, "b200": 192}
# Dense bf16 tensor TFLOP/s and memory bandwidth GB/s from vendor datasheets (no sparsity).
DATASHEET_BF16_TFLOPS = {"a100-40gb": 312, "a100-80gb": 312, "h100-80gb": 989, "h100-pcie": 756, "h200": 989,
                         "a40": 149.7, "l40s": 362, "l4": 121, "mi300x": 1307}
DATASHEET_BANDWIDTH_GBS = {"a100-40gb": 1555, "a100-80gb": 2039, "h100-80gb": 3350, "h100-pcie": 2000,
                           "h200": 4800, "mi300x": 5300, "b200": 8000, "a40": 696, "l40s": 864, "l4": 300,
                           "t4": 320, "v100-32gb": 900, "rtx-4090": 1008, "rtx-3090": 936, "rtx-a6000": 768}
NO_BF16 = {"v100-32gb", "t4"}  # Volta and Turing have no bf16 tensor cores, and no FlashAttention-2


# ---- models -------------------------------------------------------------------------------------------------

def test_every_required_model_is_a_preset():
    missing = [m for m in REQUIRED_MODELS if catalog.resolve_model_name(m) is None]
    assert not missing


@pytest.mark.parametrize("name", sorted(catalog.model_index()))
def test_preset_loads_with_its_source_and_positive_counts(name):
    spec = load_model(name)
    assert spec.name == name
    assert spec.source.startswith("https://")
    assert spec.total_params > 0
    assert 0 < spec.active_params() <= spec.total_params


@pytest.mark.parametrize("name", sorted(catalog.model_index()))
def test_preset_aliases_and_hf_id_resolve_to_the_same_preset(name):
    entry = catalog.model_index()[name]
    refs = [entry["hf_id"], *entry.get("aliases", [])]
    for ref in refs:
        assert catalog.resolve_model_name(ref) == name, ref
        assert catalog.resolve_model_name(str(ref).upper()) == name, ref  # case-insensitive
        assert load_model(ref).total_params == load_model(name).total_params


def test_no_alias_points_at_two_presets():
    owners: dict[str, str] = {}
    for name, entry in catalog.model_index().items():
        for ref in [name, entry.get("hf_id"), *(entry.get("aliases") or [])]:
            key = str(ref).lower()
            assert owners.setdefault(key, name) == name, f"{ref} names both {owners[key]} and {name}"


def test_every_model_json_parses_and_is_indexed():
    files = {p.name for p in MODELS_DIR.iterdir() if p.name.endswith(".json")}
    indexed = {entry.get("config", f"{name}.json") for name, entry in catalog.model_index().items()}
    assert files == indexed
    for name in files:
        assert isinstance(json.loads(MODELS_DIR.joinpath(name).read_text()), dict), name


@pytest.mark.parametrize("name", sorted(catalog.model_index()))
def test_index_family_matches_the_config_model_type(name):
    entry = catalog.model_index()[name]
    assert entry.get("source") and entry.get("retrieved")
    assert normalize(catalog.model_config(name)).model_type == entry["family"]


def test_unknown_preset_suggests_close_names():
    with pytest.raises(FtscopeError, match=r"unknown model 'llama-2-7'.*did you mean: .*llama-2-7b"):
        load_model("llama-2-7")


# ---- GPUs ---------------------------------------------------------------------------------------------------

def test_every_required_gpu_is_in_the_catalog():
    assert not [g for g in REQUIRED_GPUS if g not in catalog.gpu_table()]


@pytest.mark.parametrize("key", sorted(catalog.gpu_table()))
def test_gpu_builds_with_positive_numbers_and_a_source(key):
    gpu = gpu_from_catalog(key)
    assert gpu.key == key
    assert gpu.source.startswith("http")
    for value in (gpu.memory_bytes, gpu.fp16_tflops, gpu.fp32_tflops, gpu.memory_bandwidth_gbs,
                  gpu.intra_node_gbs, gpu.host_link_gbs):
        assert value > 0 and math.isfinite(value)
    assert gpu.fp16_tflops > gpu.fp32_tflops  # tensor cores beat plain FP32 on every listed part
    assert gpu.bf16 == (gpu.bf16_tflops is not None)


@pytest.mark.parametrize("key", REQUIRED_GPUS)
def test_gpu_memory_is_what_the_device_reports_not_the_marketing_size(key):
    reported = gpu_from_catalog(key).memory_bytes
    nominal = NOMINAL_MEMORY_GB[key]
    # at most the marketing GB read as GiB, and no more than ~7% below it
    assert 0.92 * nominal * GIB <= reported <= nominal * GIB


@pytest.mark.parametrize("key", sorted(DATASHEET_BF16_TFLOPS))
def test_gpu_bf16_peak_matches_the_datasheet(key):
    assert gpu_from_catalog(key).bf16_tflops == pytest.approx(DATASHEET_BF16_TFLOPS[key], rel=0.01)


@pytest.mark.parametrize("key", sorted(DATASHEET_BANDWIDTH_GBS))
def test_gpu_memory_bandwidth_matches_the_datasheet(key):
    assert gpu_from_catalog(key).memory_bandwidth_gbs == pytest.approx(DATASHEET_BANDWIDTH_GBS[key], rel=0.02)


@pytest.mark.parametrize("key", REQUIRED_GPUS)
def test_bf16_and_flash_attention_flags(key):
    gpu = gpu_from_catalog(key)
    assert gpu.bf16 == (key not in NO_BF16)
    assert gpu.flash_attention == (key not in NO_BF16)


@pytest.mark.parametrize("ref, key", [("A100-80GB", "a100-80gb"), ("NVIDIA H100 80GB HBM3", "h100-80gb"),
                                      ("4090", "rtx-4090"), (" t4 ", "t4"), ("Tesla V100-SXM2-32GB", "v100-32gb")])
def test_gpu_names_resolve_case_insensitively_through_aliases(ref, key):
    assert gpu_from_catalog(ref).key == key


def test_unknown_gpu_suggests_the_nearest():
    with pytest.raises(FtscopeError, match=r"unknown GPU 'a100-80'.*did you mean: a100-80gb"):
        gpu_from_catalog("a100-80")


# ---- prices -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("i", range(len(catalog.price_list())))
def test_price_row_names_a_known_gpu_with_date_source_and_positive_price(i):
    row = catalog.price_list()[i]
    assert row["gpu"] in catalog.gpu_table()
    assert row.get("provider")
    assert len(str(row.get("source") or "").strip()) >= 10  # a URL or a paper citation
    date = row["date"]
    if not isinstance(date, dt.date):
        date = dt.date.fromisoformat(str(date))
    assert dt.date(2015, 1, 1) <= date <= dt.date.today()
    price = row["usd_per_gpu_hour"]
    assert isinstance(price, (int, float)) and 0.05 <= price <= 50  # per single GPU, not per 8-GPU instance


@pytest.mark.parametrize("key", REQUIRED_GPUS)
def test_every_required_gpu_has_a_price(key):
    assert catalog.prices_for(key)


def test_prices_come_from_at_least_two_providers():
    assert len({row["provider"] for row in catalog.price_list()}) >= 2


def test_prices_for_keeps_each_providers_newest_row_cheapest_first():
    for key in catalog.gpu_table():
        rows = catalog.prices_for(key)
        assert len({r["provider"] for r in rows}) == len(rows)
        assert [r["usd_per_gpu_hour"] for r in rows] == sorted(r["usd_per_gpu_hour"] for r in rows)
        for r in rows:
            same = [p for p in catalog.price_list() if p["gpu"] == key and p["provider"] == r["provider"]]
            assert str(r["date"]) == max(str(p["date"]) for p in same)


# ---- examples -----------------------------------------------------------------------------------------------

def test_examples_folder_is_not_empty():
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_scenario_loads_and_estimates(path):
    scn = ftscope.load_scenario(path)
    est = ftscope.estimate(scn, strict=False)
    json.dumps(est.to_dict())


def test_every_bundled_yaml_reads_the_same_with_libyaml_and_pure_python():
    # the catalog loads with libyaml's safe loader when PyYAML has it; its data must equal the reference parser's
    import yaml
    from importlib import resources
    root = resources.files("ftscope.catalog")
    files = [p for p in _walk(root) if p.name.endswith(".yaml")]
    assert len(files) >= 10
    for path in files:
        text = path.read_text()
        assert yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) == yaml.safe_load(text), path.name


def _walk(folder):
    for entry in folder.iterdir():
        if entry.is_dir():
            yield from _walk(entry)
        else:
            yield entry
