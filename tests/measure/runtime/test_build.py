"""build_model: the real transformers/PEFT/bitsandbytes model of a scenario, on meta (no memory) or a real CPU.

Checked against independent counts: ModelSpec (which a separate test proves equal to transformers) for the shrunk
configs, LoRA's A/B sizes from the selected matrices, and what each mix knob must change in the built model.
"""
from __future__ import annotations

import pytest

import ftscope
from ftscope import FtscopeError, catalog
from ftscope.spec.architecture import TRANSFORMERS_FAMILIES, normalize
from ftscope.spec.resolve import load_model, model_from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from ftscope.measure.runtime.build import build_model, count_params, lora_selection, precision_dtypes  # noqa: E402
from ftscope.measure.runtime.configs import scenario_config, shrink_config  # noqa: E402

pytestmark = [pytest.mark.slow,  # every test here builds a real model
              pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::RuntimeWarning", "ignore::UserWarning")]

TINY = {"layers": 2, "hidden": 256, "experts": 4, "vocab": 512}
PRESETS = sorted(n for n in catalog.model_index()
                 if normalize(catalog.model_config(n)).model_type in TRANSFORMERS_FAMILIES)


def scenario(model: str = "llama-2-7b", **mix) -> ftscope.spec.scenario.Scenario:
    return ftscope.load_scenario({"model": model, "mix": mix, "workload": {"micro_batch_size": 1, "seq_len": 64}})


# ---- shrinking -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", PRESETS)
def test_shrunk_preset_builds_and_matches_the_spec_count(name):
    """Every transformers preset shrinks to a config transformers builds, with the parameter count ModelSpec
    computes for that config (so the trace's weight bytes can be checked against the config)."""
    scn = scenario(name, method="full", precision="bf16")
    model, info = build_model(scn, shrink=TINY)
    spec = model_from_config(info.config)
    assert info.total_params == spec.total_params == sum(p.numel() for p in model.parameters())
    arch = spec.arch
    assert arch.num_layers == 2 and arch.num_heads % arch.num_kv_heads == 0
    if arch.num_experts:
        assert arch.num_experts == 4 and 1 <= arch.top_k <= 4 and arch.moe_layers


# ---- the mix ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method, precision, expect", [
    ("full", "bf16-mixed", ("float32", None, "bfloat16")),
    ("lora", "bf16-mixed", ("bfloat16", "float32", "bfloat16")),
    ("lora", "bf16", ("bfloat16", "bfloat16", None)),
    ("full", "fp32", ("float32", None, None)),
    ("qlora", "fp16-mixed", ("float16", "float32", "float16")),
])
def test_precision_dtypes(method, precision, expect):
    assert precision_dtypes(scenario(method=method, precision=precision)) == expect


def test_lora_trainable_count_equals_the_spec_for_dense_models():
    scn = scenario(method="lora", lora_rank=8)
    model, info = build_model(scn, shrink=TINY)
    spec = model_from_config(info.config)
    assert info.trainable_params == spec.lora_params(8, "all-linear")
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters() if not p.requires_grad)


def test_lora_on_fused_experts_uses_target_parameters():
    """transformers 5 fuses gate and up: PEFT puts one adapter on gate_up_proj (A: r x H, B: 2I x r per expert),
    r x H fewer per expert and layer than separate gate/up adapters (what the spec counts)."""
    scn = scenario("mixtral-8x7b", method="lora", lora_rank=8)
    model, info = build_model(scn, shrink=TINY)
    assert info.lora_target_parameters and all(p.endswith(("gate_up_proj", "down_proj"))
                                               for p in info.lora_target_parameters)
    spec = model_from_config(info.config)
    a = spec.arch
    moe_layers = len(a.moe_layers)
    assert info.trainable_params == spec.lora_params(8, "all-linear") - 8 * a.hidden_size * a.num_experts * moe_layers


def test_peft_v4_conversion_does_not_drop_dense_and_shared_mlps():
    """PEFT would remap gate_proj/up_proj/down_proj targets of v4 MoE checkpoints to fused expert parameters and
    so lose the dense first layer's and the shared experts' adapters; ftscope's explicit v5 targets keep them."""
    model, info = build_model(scenario("deepseek-v2-lite", method="lora"), shrink=TINY)
    wrapped = {n for n, m in model.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)}
    assert any(n.endswith("layers.0.mlp.gate_proj") for n in wrapped)
    assert any("shared_experts.down_proj" in n for n in wrapped)


def test_attention_only_targets_skip_the_mlp():
    model, info = build_model(scenario(method="lora", lora_targets="attention"), shrink=TINY)
    assert info.lora_target_modules and all("self_attn" in n for n in info.lora_target_modules)
    assert not info.lora_target_parameters


def test_mix_knobs_reach_the_model():
    scn = scenario("mixtral-8x7b", method="lora", gradient_checkpointing=True, attention="flash",
                   experts_backend="eager", experts_top_k=1)
    model, info = build_model(scn, shrink=TINY)
    cfg = model.base_model.model.config
    assert cfg.num_experts_per_tok == 1 == info.top_k
    assert cfg._experts_implementation == "eager" == info.experts_implementation
    assert info.attention == cfg._attn_implementation == "sdpa" and any("flash" in n for n in info.notes)
    base = model.base_model.model
    assert getattr(base, "is_activation_checkpointing", None) or base.is_gradient_checkpointing
    assert cfg.use_cache is False


def test_gemma2_falls_back_to_eager_with_a_note():
    model, info = build_model(scenario("gemma-2-9b", method="lora"), shrink=TINY)
    assert info.attention == "eager" and any("no sdpa" in n for n in info.notes)


def test_qlora_on_meta_swaps_linears_for_4bit_but_keeps_lm_head():
    bnb = pytest.importorskip("bitsandbytes")
    model, info = build_model(scenario(method="qlora"), shrink=TINY)
    fourbit = [n for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(fourbit) == 2 * 7 == len(info.quantized_modules)
    assert not any("lm_head" in n for n in fourbit)
    assert info.total_params == model_from_config(info.config).total_params


def test_real_cpu_qlora_step_runs():
    """device=cpu builds real weights, quantizes them with bitsandbytes and trains: one step changes the adapters."""
    pytest.importorskip("bitsandbytes")
    scn = scenario(method="qlora", lora_rank=4)
    model, info = build_model(scn, device="cpu", shrink={"layers": 1, "hidden": 128, "vocab": 256})
    total, trainable = count_params(model)
    assert total - trainable == model_from_config(info.config).total_params
    ids = torch.randint(0, 256, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads)


def test_lora_selection_names_exist_in_the_model():
    scn = scenario("qwen1.5-moe-a2.7b", method="lora")
    model, _ = build_model(scenario("qwen1.5-moe-a2.7b", method="full", precision="bf16"), shrink=TINY)
    modules, params = lora_selection(model, scn)
    names = {n for n, _ in model.named_modules()}
    pnames = {n for n, _ in model.named_parameters()}
    assert set(modules) <= names and set(params) <= pnames
    assert any("shared_expert." in m for m in modules) and not any(m.endswith("shared_expert_gate") for m in modules)


# ---- errors ------------------------------------------------------------------------------------------------------

def test_blackmamba_is_not_traceable():
    with pytest.raises(FtscopeError, match="not traceable: no transformers implementation"):
        build_model(scenario("blackmamba-2.8b", method="lora", lora_targets="all-linear"))


def test_config_comes_from_a_local_file(tmp_path):
    path = tmp_path / "config.json"
    import json
    path.write_text(json.dumps(shrink_config(catalog.model_config("llama-3.2-1b"), layers=1, hidden=128)))
    scn = ftscope.load_scenario({"model": str(path), "mix": {"method": "full"}, "workload": {"seq_len": 32}})
    assert scenario_config(scn)["num_hidden_layers"] == 1
    _, info = build_model(scn)
    assert info.total_params == load_model(str(path)).total_params


# ---- local weights -----------------------------------------------------------------------------------------------

def test_local_weights_are_loaded_under_every_method(checkpoint):
    folder, saved = checkpoint
    for method in ("full", "lora"):
        scn = ftscope.load_scenario({"model": str(folder / "config.json"), "mix": {"method": method, "precision": "bf16"},
                                     "workload": {"micro_batch_size": 1, "seq_len": 16}})
        torch.manual_seed(7)  # a different seed: random init would not reproduce the saved weights
        model, info = build_model(scn, device="cpu", weights=folder)
        assert any("weights loaded from" in n for n in info.notes)
        state = {k.replace("base_model.model.", "").replace(".base_layer", ""): v for k, v in model.state_dict().items()}
        for key in ("model.embed_tokens.weight", "model.layers.0.mlp.experts.gate_up_proj", "lm_head.weight"):
            match = [v for k, v in state.items() if k == key or k.endswith(key.split("model.", 1)[-1])]
            assert match and torch.equal(match[0], saved[key]), key


@pytest.mark.parametrize("change, message", [
    ("missing", "is not a folder"), ("empty", "no \\*.safetensors"), ("other", "different model than the scenario's"),
])
def test_bad_weight_folders_are_one_line_errors(checkpoint, tmp_path, change, message):
    import json
    import shutil
    folder, _ = checkpoint
    target = tmp_path / "w"
    if change != "missing":
        target.mkdir()
        shutil.copy(folder / "config.json", target / "config.json")
    if change == "other":
        for f in folder.glob("*.safetensors"):
            shutil.copy(f, target / f.name)
        cfg = json.loads((target / "config.json").read_text())
        cfg["hidden_size"] *= 2
        (target / "config.json").write_text(json.dumps(cfg))
    scn = ftscope.load_scenario({"model": str(folder / "config.json"), "mix": {"method": "lora"}, "workload": {"seq_len": 16}})
    with pytest.raises(FtscopeError, match=message):
        build_model(scn, device="cpu", weights=target)


def test_weights_do_not_mix_with_shrink_or_trace(checkpoint):
    folder, _ = checkpoint
    scn = ftscope.load_scenario({"model": str(folder / "config.json"), "mix": {"method": "lora"}, "workload": {"seq_len": 16}})
    with pytest.raises(FtscopeError, match="cannot be combined"):
        build_model(scn, device="cpu", shrink={"layers": 1}, weights=folder)
    with pytest.raises(FtscopeError, match="trace needs no weights"):
        build_model(scn, device="meta", weights=folder)
