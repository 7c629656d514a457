"""ModelSpec parameter counts: published totals, exact parity with what transformers/PEFT build, BlackMamba by hand,
and loading configs from presets, files, folders and the HF cache."""
from __future__ import annotations

import json
import math

import pytest

from ftscope import FtscopeError, catalog
from ftscope.spec.architecture import TRANSFORMERS_FAMILIES
from ftscope.spec.resolve import load_model, model_from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
transformers.logging.set_verbosity_error()

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::RuntimeWarning")  # transformers/peft noise

R = 8  # LoRA rank used throughout

# ---- published totals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, total", [
    ("llama-2-7b", 6_738_415_616),
    ("llama-2-70b", 68_976_648_192),
    ("mixtral-8x7b", 46_702_792_704),
])
def test_preset_total_matches_the_published_count(name, total):
    assert load_model(name).total_params == total


def test_mixtral_active_params_match_the_published_count():
    assert load_model("mixtral-8x7b").active_params() == 12_879_925_248


@pytest.mark.parametrize("name", sorted(n for n in catalog.model_index() if load_model(n).is_moe))
def test_moe_active_with_every_expert_used_is_the_total(name):
    spec = load_model(name)
    assert spec.active_params(top_k=spec.arch.num_experts) == spec.total_params
    assert spec.active_params(top_k=1) < spec.active_params() < spec.total_params or spec.arch.top_k == 1


def test_dense_active_params_equal_total():
    spec = load_model("llama-2-7b")
    assert spec.active_params() == spec.total_params
    assert not spec.is_moe


# ---- building the real thing on the meta device -------------------------------------------------------------

_DROP = ("auto_map", "rope_scaling", "architectures", "bos_token_id", "eos_token_id", "pad_token_id")


def shrink(cfg: dict) -> dict:
    """The bundled config made tiny, structural keys (tie flags, dense-first layers, shared experts, fused QKV,
    new_decoder_architecture, qk-norm families, MoE interleaving, per-layer lists) kept. Multimodal wrappers keep
    their text_config nesting (keys it leaves to the config class's defaults stay absent) and a tiny vision tower."""
    if not isinstance(cfg.get("text_config"), dict):
        return _shrink_text(cfg)
    out = {k: v for k, v in cfg.items() if k not in _DROP}
    out["text_config"] = _shrink_text(cfg["text_config"])
    vision = cfg.get("vision_config")
    if isinstance(vision, dict) and vision.get("model_type") == "siglip_vision_model":
        out["vision_config"] = {**vision, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                                "num_attention_heads": 2, "image_size": 28, "patch_size": 14}
    if isinstance(vision, dict) and vision.get("model_type") == "pixtral":
        out["vision_config"] = {**vision, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                                "num_attention_heads": 2, "head_dim": 16, "image_size": 56, "patch_size": 7}
    return out


def _shrink_text(cfg: dict) -> dict:
    c = {k: v for k, v in cfg.items() if k not in _DROP}
    c.update(hidden_size=64, num_hidden_layers=3, vocab_size=320, max_position_embeddings=256)
    c["pad_token_id"] = None  # some config classes default to an id past the shrunk vocabulary (Phi-3: 32000)
    if "num_attention_heads" in cfg:  # else the config class's defaults stand (Gemma 3's text_config)
        heads = cfg["num_attention_heads"]
        gqa = cfg.get("num_key_value_heads", cfg.get("num_kv_heads", heads)) < heads
        c["num_attention_heads"] = 4
        c["num_kv_heads" if c["model_type"] == "falcon" else "num_key_value_heads"] = 2 if gqa else 4
    if "head_dim" in c:
        c["head_dim"] = 24  # deliberately not hidden / heads
    for key, value in (("intermediate_size", 96), ("intermediate_size_mlp", 112), ("moe_intermediate_size", 48),
                       ("shared_expert_intermediate_size", 80), ("num_experts_per_tok", 2)):
        if key in c:
            c[key] = value
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        if key in c:
            c[key] = 4
    if c["model_type"] in ("deepseek_v2", "deepseek_v3"):
        c.update(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=20)
        if c.get("q_lora_rank"):
            c["q_lora_rank"] = 40
        if c.get("first_k_dense_replace", 0) > 1:
            c["first_k_dense_replace"] = 1  # keep MoE layers among the three
        if "n_group" in c:
            c.update(n_group=2, topk_group=1)
    for key in ("sliding_window", "sliding_window_size"):
        if c.get(key):
            c[key] = 128
    if "max_window_layers" in c:
        c["max_window_layers"] = 3
    for key in ("layer_types", "no_rope_layers"):  # per-layer lists follow the layer count
        if isinstance(c.get(key), list):
            c[key] = c[key][:3]
    return c


def build_hf(cfg: dict):
    """The transformers model of a config dict as a fine-tuning load builds it, on the meta device (no memory).
    AutoModelForCausalLM, else (Mistral3Config, which it refuses) AutoModelForImageTextToText with the lm_head
    tied as the text config says: Mistral3Config's own default ties it, but from_pretrained of a checkpoint that
    holds both matrices (Mistral Small 3.1 / 3.2) keeps them apart (test_mistral3_checkpoint_keeps_its_lm_head)."""
    hf_cfg = transformers.AutoConfig.for_model(**cfg)
    auto = transformers.AutoModelForCausalLM
    if type(hf_cfg) not in auto._model_mapping:
        auto = transformers.AutoModelForImageTextToText
        if "tie_word_embeddings" not in cfg:
            hf_cfg.tie_word_embeddings = hf_cfg.text_config.tie_word_embeddings
    with torch.device("meta"):
        return auto.from_config(hf_cfg)


def numel(model) -> int:
    return sum(p.numel() for p in model.parameters())


HF_PRESETS = sorted(n for n in catalog.model_index() if catalog.model_index()[n]["family"] != "blackmamba")


@pytest.fixture(scope="module")
def shrunk():
    """preset -> (shrunk config, transformers model): built once per module."""
    cache: dict = {}

    def get(name):
        if name not in cache:
            cfg = shrink(catalog.model_config(name))
            cache[name] = (cfg, build_hf(cfg))
        return cache[name]

    return get


def test_parity_covers_every_transformers_family_in_the_catalog():
    families = {catalog.model_index()[n]["family"] for n in HF_PRESETS}
    assert families == TRANSFORMERS_FAMILIES - {"gemma"}  # Gemma 1 is only in a config-variant test below


@pytest.mark.slow  # builds the transformers / PEFT model
@pytest.mark.parametrize("name", HF_PRESETS)
def test_shrunk_preset_total_equals_transformers(name, shrunk):
    cfg, model = shrunk(name)
    assert model_from_config(cfg).total_params == numel(model)


@pytest.mark.slow  # builds the transformers / PEFT model
@pytest.mark.parametrize("name", HF_PRESETS)
def test_shrunk_preset_components_equal_transformers(name, shrunk):
    cfg, model = shrunk(name)
    parts = model_from_config(cfg).params_by_component()
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    hf_head = 0 if head.weight is emb else head.weight.numel() + (head.bias.numel() if head.bias is not None else 0)
    named = dict(model.named_parameters())
    linear_in_attn = sum(m.weight.numel() + (m.bias.numel() if m.bias is not None else 0)
                         for n, m in model.named_modules()
                         if isinstance(m, torch.nn.Linear) and (".self_attn." in n or ".self_attention." in n)
                         and "vision_tower." not in n)
    assert parts["embedding"] == emb.numel()
    assert parts["lm_head"] == hf_head
    assert parts["attention"] == linear_in_attn
    assert parts.get("experts", 0) == sum(p.numel() for n, p in named.items() if ".experts." in n)
    assert parts.get("shared_expert", 0) == sum(p.numel() for n, p in named.items()
                                                if ".shared_expert." in n or ".shared_experts." in n)
    assert parts.get("router", 0) == sum(p.numel() for n, p in named.items()
                                         if n.endswith(("mlp.gate.weight", ".router.weight", ".router.bias"))
                                         or "shared_expert_gate" in n)
    assert parts.get("vision", 0) == sum(p.numel() for n, p in named.items()
                                         if "vision_tower." in n or "multi_modal_projector." in n)


@pytest.mark.slow  # builds and saves a tiny transformers model
def test_mistral3_checkpoint_keeps_its_lm_head(tmp_path):
    """A from_config build of a Mistral 3 config ties lm_head to the embedding (Mistral3Config's default,
    transformers 5); the published checkpoints hold both, and from_pretrained then leaves them apart ("both are
    present in the checkpoints with different values, so we will NOT tie them"). ftscope counts that model."""
    cfg = shrink(catalog.model_config("mistral-small-3.1-24b"))
    hf_cfg = transformers.AutoConfig.for_model(**cfg)
    assert hf_cfg.tie_word_embeddings and "tie_word_embeddings" not in cfg  # the default ties
    hf_cfg.tie_word_embeddings = False
    transformers.AutoModelForImageTextToText.from_config(hf_cfg).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    saved.pop("tie_word_embeddings", None)  # as published: the config.json states no tie flag
    saved["text_config"].pop("tie_word_embeddings", None)
    (tmp_path / "config.json").write_text(json.dumps(saved))
    loaded = transformers.AutoModelForImageTextToText.from_pretrained(tmp_path)
    assert loaded.lm_head.weight is not loaded.get_input_embeddings().weight
    spec = model_from_config(saved)
    assert numel(loaded) == spec.total_params == numel(build_hf(cfg))
    with torch.device("meta"):  # the config alone, built as its class's default says
        tied = transformers.AutoModelForImageTextToText.from_config(transformers.AutoConfig.for_model(**cfg))
    assert spec.total_params - numel(tied) == spec.lm_head_params > 0


BASE = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, vocab_size=256, max_position_embeddings=128,
            pad_token_id=None)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48)
VARIANTS = {
    "llama-bias-tied-headdim": dict(model_type="llama", num_key_value_heads=2, intermediate_size=96,
                                    attention_bias=True, mlp_bias=True, tie_word_embeddings=True, head_dim=24),
    "qwen2-tied": dict(model_type="qwen2", num_key_value_heads=2, intermediate_size=96, tie_word_embeddings=True),
    "qwen2_moe-sparse-step-2": dict(model_type="qwen2_moe", num_key_value_heads=2, intermediate_size=96, **MOE,
                                    shared_expert_intermediate_size=80, decoder_sparse_step=2,
                                    tie_word_embeddings=False),
    "qwen2_moe-mlp-only-layer": dict(model_type="qwen2_moe", num_key_value_heads=2, intermediate_size=96, **MOE,
                                     shared_expert_intermediate_size=80, mlp_only_layers=[0],
                                     tie_word_embeddings=False),
    "qwen3_moe-mlp-only-layer": dict(model_type="qwen3_moe", num_key_value_heads=2, head_dim=16,
                                     intermediate_size=96, **MOE, mlp_only_layers=[1], tie_word_embeddings=False),
    "olmoe-gqa": dict(model_type="olmoe", num_key_value_heads=2, intermediate_size=48, num_experts=4,
                      num_experts_per_tok=2, tie_word_embeddings=False),
    "deepseek_v2-q-lora": dict(model_type="deepseek_v2", num_key_value_heads=4, intermediate_size=96,
                               moe_intermediate_size=48, n_routed_experts=4, num_experts_per_tok=2,
                               n_shared_experts=2, first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=48,
                               qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, tie_word_embeddings=False),
    "phi-tied": dict(model_type="phi", num_key_value_heads=4, intermediate_size=96, tie_word_embeddings=True),
    "falcon-40b-style": dict(model_type="falcon", num_kv_heads=2, new_decoder_architecture=True,
                             parallel_attn=True, bias=False),
    "falcon-one-ln-in-parallel-attn": dict(model_type="falcon", num_kv_heads=2, new_decoder_architecture=True,
                                           parallel_attn=True, bias=False, num_ln_in_parallel_attn=1),
    "falcon-7b-style-multi-query": dict(model_type="falcon", new_decoder_architecture=False, multi_query=True,
                                        parallel_attn=True, bias=False),
    "falcon-ffn-hidden-size-untied": dict(model_type="falcon", num_kv_heads=2, new_decoder_architecture=True,
                                          ffn_hidden_size=96, tie_word_embeddings=False),
    "gemma2-wide-heads": dict(model_type="gemma2", num_key_value_heads=2, head_dim=32, intermediate_size=96),
    "falcon-rw-sequential-attn": dict(model_type="falcon", new_decoder_architecture=False, multi_query=False,
                                      parallel_attn=False, bias=True, alibi=True),
    "phi-qk-layernorm": dict(model_type="phi", num_key_value_heads=4, intermediate_size=96, qk_layernorm=True,
                             tie_word_embeddings=False),
    # no tie_word_embeddings key: each config class's own default decides (transformers 5: untied but for a few)
    "gemma-tie-default": dict(model_type="gemma", num_key_value_heads=1, intermediate_size=96, head_dim=16),
    "llama-tie-default": dict(model_type="llama", num_key_value_heads=2, intermediate_size=96),
    "smollm3-tie-default": dict(model_type="smollm3", num_key_value_heads=2, intermediate_size=96),
    "gpt_oss-tie-default": dict(model_type="gpt_oss", num_key_value_heads=2, intermediate_size=48, head_dim=16,
                                num_local_experts=4, num_experts_per_tok=2),
    "llama4_text-listed-moe-layers": dict(model_type="llama4_text", num_key_value_heads=2, intermediate_size=48,
                                          intermediate_size_mlp=96, num_local_experts=4, num_experts_per_tok=1,
                                          moe_layers=[0, 2], tie_word_embeddings=False),
    # keys left to the config class's defaults (head_dim, kv heads, attention bias)
    "qwen3-class-defaults": dict(model_type="qwen3", num_attention_heads=32, intermediate_size=96,
                                 tie_word_embeddings=False),
    "mistral-class-defaults": dict(model_type="mistral", num_attention_heads=8, intermediate_size=96),
    "llama4_text-class-defaults": dict(model_type="llama4_text", num_attention_heads=8, intermediate_size=48,
                                       num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2),
    "gpt_oss-class-defaults": dict(model_type="gpt_oss", num_attention_heads=8, intermediate_size=48,
                                   num_local_experts=4, num_experts_per_tok=2),
    "phi3-gqa": dict(model_type="phi3", num_key_value_heads=2, intermediate_size=96, tie_word_embeddings=False,
                     pad_token_id=None),
}
SOURCE_BUGS: dict[str, str] = {}  # variant id -> reason, for strict xfails of known source bugs


@pytest.mark.slow  # builds the transformers / PEFT model
@pytest.mark.parametrize("cfg", [
    pytest.param(v, id=k, marks=[pytest.mark.xfail(strict=True, reason=SOURCE_BUGS[k])] if k in SOURCE_BUGS else [])
    for k, v in VARIANTS.items()])
def test_config_variant_total_equals_transformers(cfg):
    cfg = {**BASE, **cfg}
    assert model_from_config(cfg).total_params == numel(build_hf(cfg))


# ---- LoRA parity with PEFT ----------------------------------------------------------------------------------

def peft_trainable(model, **lora_kwargs) -> int:
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=R, lora_alpha=16, **lora_kwargs))
    return sum(p.numel() for p in wrapped.parameters() if p.requires_grad)


def hf_name(lin) -> str:
    return lin.names[0]


@pytest.mark.slow  # builds the transformers / PEFT model
@pytest.mark.parametrize("name", HF_PRESETS)
def test_lora_on_attention_equals_peft(name):
    cfg = shrink(catalog.model_config(name))
    spec = model_from_config(cfg)
    names = sorted({hf_name(lin) for lin, _ in spec.lora_targets("attention")})
    # module names also reach a vision tower's q/k/v (Gemma 3), in PEFT as here; "attention" is the LM's only
    vision = sum(R * (lin.in_features + lin.out_features) * n for lin, n in spec.vision_linears if lin.names[0] in names)
    assert spec.lora_params(R, names) == spec.lora_params(R, "attention") + vision
    assert vision == 0 or spec.vision_params
    assert spec.lora_params(R, names) == peft_trainable(build_hf(cfg), target_modules=names)


@pytest.mark.slow  # builds the transformers / PEFT model
@pytest.mark.parametrize("name", [n for n in HF_PRESETS if {"q_proj", "v_proj"} <= {
    nm for lin, _ in load_model(n).linears() for nm in lin.names}])
def test_lora_on_q_and_v_equals_peft(name):
    cfg = shrink(catalog.model_config(name))
    expected = peft_trainable(build_hf(cfg), target_modules=["q_proj", "v_proj"])
    assert model_from_config(cfg).lora_params(R, ["q_proj", "v_proj"]) == expected


@pytest.mark.slow  # builds the transformers / PEFT model
@pytest.mark.parametrize("name", [n for n in HF_PRESETS if not load_model(n).is_moe])
def test_lora_all_linear_on_dense_models_equals_peft(name):
    cfg = shrink(catalog.model_config(name))
    expected = peft_trainable(build_hf(cfg), target_modules="all-linear")
    assert model_from_config(cfg).lora_params(R, "all-linear") == expected


MOE_PRESETS = [n for n in HF_PRESETS if load_model(n).is_moe]


def moe_parameter(model, *endings: str) -> str:
    """The block-relative name of an MoE parameter (mlp.gate.weight, mlp.router.weight, feed_forward.router.weight,
    mlp.experts.down_proj, ...), as PEFT's target_parameters takes it."""
    for n, _ in model.named_parameters():
        if n.endswith(endings) and ".layers." in n:
            return n.split(".layers.", 1)[1].split(".", 1)[1]
    raise AssertionError(f"no parameter ending in {endings}")


@pytest.mark.slow  # builds the transformers / PEFT model
@pytest.mark.parametrize("name", MOE_PRESETS)
def test_lora_on_router_equals_peft_target_parameters(name):
    cfg = shrink(catalog.model_config(name))
    model = build_hf(cfg)
    router = moe_parameter(model, "mlp.gate.weight", "router.weight")
    expected = peft_trainable(model, target_modules=[], target_parameters=[router])
    assert model_from_config(cfg).lora_params(R, [router.split(".")[-2]]) == expected


@pytest.mark.slow  # builds the transformers / PEFT model
@pytest.mark.parametrize("name", MOE_PRESETS)
def test_lora_on_expert_down_proj_equals_peft_target_parameters(name):
    cfg = shrink(catalog.model_config(name))
    spec = model_from_config(cfg)
    ours = sum(R * (lin.in_features + lin.out_features) * lin.count * n
               for lin, n in spec.lora_targets("experts") if lin.role == "down")
    model = build_hf(cfg)
    target = moe_parameter(model, "experts.down_proj")
    assert ours == peft_trainable(model, target_modules=[], target_parameters=[target])


@pytest.mark.slow  # builds the transformers / PEFT model
@pytest.mark.parametrize("name", MOE_PRESETS)
def test_fused_gate_up_expert_lora_in_peft_shares_one_A_matrix(name):
    """transformers 5 fuses each expert's gate and up into one (E, 2I, H) parameter; PEFT's target_parameters
    LoRA gives it one A (r x H) and one B (2I x r) per expert. ftscope counts gate and up as two matrices
    (A and B each, as in transformers 4 / torchtune w1, w3), so it counts r*H more per expert per MoE layer."""
    cfg = shrink(catalog.model_config(name))
    spec = model_from_config(cfg)
    a = spec.arch
    n_moe = len(a.moe_layers)
    model = build_hf(cfg)
    peft_count = peft_trainable(model, target_modules=[], target_parameters=[moe_parameter(model, "experts.gate_up_proj")])
    assert peft_count == R * a.num_experts * (a.hidden_size + 2 * a.moe_intermediate_size) * n_moe
    ours = sum(R * (lin.in_features + lin.out_features) * lin.count * n
               for lin, n in spec.lora_targets("experts") if lin.role in ("gate", "up"))
    assert ours - peft_count == R * a.num_experts * a.hidden_size * n_moe


@pytest.mark.slow  # builds the transformers / PEFT model
@pytest.mark.parametrize("name", HF_PRESETS)
def test_every_lora_target_ftscope_offers_exists_in_the_transformers_model(name, shrunk):
    cfg, model = shrunk(name)
    leaves = {part for n, _ in model.named_parameters() for part in n.split(".")}
    for lin, _ in model_from_config(cfg).linears():
        assert set(lin.names) & leaves, f"{lin.role}: none of {lin.names} in the real model"


# ---- BlackMamba (no transformers implementation): counted by hand from the published architecture ------------

def test_blackmamba_matches_a_hand_count_of_the_published_architecture():
    h, vocab, ffn, experts, blocks = 1472, 50304, 3872, 8, 18
    d_inner, d_state, d_conv = 2 * h, 16, 4
    dt_rank = math.ceil(h / 16)
    norm = h  # RMSNorm weight
    mamba = (h * 2 * d_inner                       # in_proj (x and z)
             + d_inner * d_conv + d_inner          # depthwise conv1d weight + bias
             + d_inner * (dt_rank + 2 * d_state)   # x_proj -> dt, B, C
             + dt_rank * d_inner + d_inner         # dt_proj with bias
             + d_inner * d_state + d_inner         # A_log, D
             + d_inner * h                         # out_proj
             + norm)
    expert = h * 2 * ffn + ffn * h                 # SwiGLU fc1 (gate and up fused), fc2
    moe = h * experts + experts * expert + norm    # router, experts, norm
    embedding = vocab * h                          # tied with the output layer
    total = blocks * (mamba + moe) + embedding + norm
    active = blocks * (mamba + h * experts + expert + norm) + embedding + norm  # top-1 routing

    spec = load_model("blackmamba-2.8b")
    assert spec.total_params == total
    assert spec.active_params() == active
    assert 2.75e9 < total < 2.82e9 and 0.6e9 < active < 0.66e9  # "BlackMamba-630M/2.8B"


def test_blackmamba_lora_targets_are_its_own_module_names():
    spec = load_model("blackmamba-2.8b")
    assert spec.lora_params(R, ["in_proj", "out_proj"]) == R * 18 * ((1472 + 2 * 2944) + (2944 + 1472))
    with pytest.raises(FtscopeError, match="q_proj"):
        spec.lora_targets(["q_proj"])


# ---- LoRA target errors -------------------------------------------------------------------------------------

def test_lora_target_that_matches_nothing_suggests_names_that_exist():
    with pytest.raises(FtscopeError, match=r"'q_prj' matches no weight.*did you mean: q_proj") as info:
        load_model("llama-2-7b").lora_targets(["q_prj"])
    assert "\n" not in str(info.value)


def test_mixtral_accepts_torchtune_and_hf_expert_names_alike():
    spec = load_model("mixtral-8x7b")
    assert spec.lora_params(16, ["w1", "w2", "w3"]) == spec.lora_params(16, "experts")
    assert spec.lora_params(16, "mlp") == spec.lora_params(16, "experts")


def test_all_linear_is_attention_plus_mlp_for_dense_models():
    spec = load_model("llama-3.1-8b")
    assert spec.lora_params(16, "all-linear") == spec.lora_params(16, "attention") + spec.lora_params(16, "mlp")



@pytest.mark.parametrize("name,fused", [("llama-3.1-8b", False), ("mixtral-8x7b", False), ("mixtral-8x7b", True),
                                        ("deepseek-v3", True), ("olmoe-1b-7b", True)])
def test_lora_layer_params_are_lora_params_block_by_block(name, fused):
    """One block of each layer group, times its count, adds up to lora_params (a fused gate_up stack's shared A
    included): what ZeRO-3 / FSDP gather with each block."""
    spec = load_model(name)
    for targets in ("all-linear", "mlp", "attention"):
        per_layer = spec.lora_layer_params(16, targets, fused)
        assert len(per_layer) == len(spec.layer_groups)
        assert sum(p * n for p, (_, n) in zip(per_layer, spec.layer_groups)) == spec.lora_params(16, targets, fused)

# ---- loading from files -------------------------------------------------------------------------------------

TINY = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, vocab_size=256, tie_word_embeddings=False)


def test_config_json_path_and_model_folder_load_the_same_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    by_file = load_model(str(tmp_path / "config.json"))
    by_dir = load_model(str(tmp_path))
    assert by_file.total_params == by_dir.total_params == model_from_config(TINY).total_params


def test_hf_id_found_in_the_local_hf_cache(tmp_path, monkeypatch):
    snap = tmp_path / "models--someorg--tiny-llama" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(TINY))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert load_model("someorg/tiny-llama").total_params == model_from_config(TINY).total_params


def test_malformed_config_json_is_a_one_line_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "hidden_size": ')
    with pytest.raises(FtscopeError, match="malformed JSON in config.json at") as info:
        load_model(str(path))
    assert "\n" not in str(info.value)


def test_config_without_hidden_size_names_the_missing_key(tmp_path):
    cfg = {k: v for k, v in TINY.items() if k != "hidden_size"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FtscopeError, match="hidden_size"):
        load_model(str(tmp_path / "config.json"))


def test_missing_json_path_and_empty_folder_are_errors(tmp_path):
    with pytest.raises(FtscopeError, match="no config.json"):
        load_model(str(tmp_path / "nope.json"))
    with pytest.raises(FtscopeError, match="no config.json"):
        load_model(str(tmp_path))


def test_unknown_model_suggests_presets():
    with pytest.raises(FtscopeError, match=r"did you mean: llama-2-7b"):
        load_model("llama-2-7")
