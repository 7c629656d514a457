"""Build the real HF model of a scenario (random weights or a local checkpoint, never a download), with the scenario's mix applied.

The point of ftscope's measurements is to run the code people actually train with, so this module only
assembles real pieces: `AutoModelForCausalLM.from_config` for the architecture, the config keys transformers 5
reads for attention (`attn_implementation`), MoE experts (`experts_implementation`) and top-k
(`num_experts_per_tok`), activation checkpointing (non-reentrant, transformers' default), PEFT `LoraConfig`
for LoRA (fused 3-D expert weights through `target_parameters`), and bitsandbytes `Linear4bit` (NF4, double
quantization) for QLoRA, swapped in where transformers' `load_in_4bit` would: exact nn.Linear modules only, so
transformers 5's fused expert stacks stay unquantized (bitsandbytes issue #1849).

On `device="meta"` nothing is allocated: `trace` swaps the meta tensors for fake ones and runs the step.
Precision follows the estimator's conventions (see estimate/memory.py):
  fp32        fp32 weights, no autocast
  bf16        pure bf16 weights, adapters and optimizer states
  bf16-mixed  full: fp32 weights under bf16 autocast (torch AMP); LoRA/QLoRA: bf16 (or NF4) frozen base, fp32
              adapters (PEFT's default upcast), bf16 autocast
  fp16-mixed  as bf16-mixed with fp16
"""
from __future__ import annotations

import copy
import json
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ... import catalog
from ...errors import FtscopeError
from ...spec.architecture import ALIASES, TRANSFORMERS_FAMILIES
from ...spec.scenario import Scenario
from .. import require_torch

NF4_BLOCKSIZE = 64
"""bitsandbytes' 4-bit block size (HF BitsAndBytesConfig default); absmax is double-quantized in blocks of 256."""


@dataclass
class BuildInfo:
    """What was built, and every place where it differs from the scenario as written."""

    config: dict[str, Any]
    """The HF config dict the model was built from (after shrinking and the mix's overrides)."""
    attention: str
    """HF attention implementation used: eager | sdpa | flash_attention_2."""
    experts_implementation: str | None
    """transformers 5 experts implementation (MoE only): eager | batched_mm | grouped_mm."""
    top_k: int | None
    param_dtype: str
    """Dtype of the (frozen or trained) base weights: float32 | bfloat16 | float16."""
    adapter_dtype: str | None
    """Dtype of the LoRA adapters (None for full fine-tuning)."""
    autocast_dtype: str | None
    """Autocast dtype of the training step (None: no autocast)."""
    gradient_checkpointing: bool
    lora_target_modules: list[str] = field(default_factory=list)
    lora_target_parameters: list[str] = field(default_factory=list)
    quantized_modules: list[str] = field(default_factory=list)
    """QLoRA: the Linear layers replaced by bitsandbytes Linear4bit (NF4, double quant)."""
    total_params: int = 0
    """Parameters of the model as the scenario defines it (4-bit layers counted by their unquantized size)."""
    trainable_params: int = 0
    notes: list[str] = field(default_factory=list)


# ---- configs -------------------------------------------------------------------------------------------------

def scenario_config(scn: Scenario) -> dict[str, Any]:
    """The HF config.json dict of the scenario's model: a bundled preset, or the config file it was read from."""
    spec = scn.model
    if spec.arch.model_type not in TRANSFORMERS_FAMILIES:
        raise FtscopeError(f"{spec.name} ({spec.arch.model_type}) is not traceable: no transformers implementation")
    for ref in (scn.model_ref, spec.name):
        preset = catalog.resolve_model_name(ref) if ref else None
        if preset is not None:
            return copy.deepcopy(catalog.model_config(preset))
    for ref in (spec.source, spec.name, scn.model_ref):
        path = Path(ref).expanduser() if ref else None
        if path is not None and path.exists():
            path = path / "config.json" if path.is_dir() else path
            try:
                return json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise FtscopeError(f"cannot read the model config {path}: {exc}") from None
    raise FtscopeError(f"cannot find the config.json of model '{spec.name}' to build it")


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (multimodal wrappers keep it in text_config), not a copy."""
    return cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg


def _first_key(cfg: dict[str, Any], field_name: str) -> str | None:
    return next((k for k in ALIASES[field_name] if cfg.get(k) is not None), None)


def _round_to(x: float, multiple: int, minimum: int) -> int:
    return max(minimum, int(round(x / multiple)) * multiple)


def shrink_config(cfg: dict[str, Any], layers: int | None = None, hidden: int | None = None,
                  experts: int | None = None, vocab: int | None = None,
                  intermediate: int | None = None) -> dict[str, Any]:
    """A smaller copy of an HF config that transformers still builds: heads, KV heads, head_dim, MLP/expert
    widths and MLA ranks are scaled with `hidden`; top-k stays <= experts; layer lists stay in range.

    Keeps the grouping of query heads per KV head and the per-family structure (shared experts, dense first
    layers, parallel blocks), so a shrunk model exercises the same code paths as the full one.
    """
    if isinstance(cfg.get("text_config"), dict):
        out = copy.deepcopy(cfg)
        out["text_config"] = shrink_config(cfg["text_config"], layers, hidden, experts, vocab, intermediate)
        return out
    c = copy.deepcopy(cfg)
    h_key = _first_key(c, "hidden_size") or "hidden_size"
    old_h = int(c[h_key])
    if hidden is not None and hidden != old_h:
        ratio = hidden / old_h
        heads_key = _first_key(c, "num_heads")
        kv_key = _first_key(c, "num_kv_heads")
        heads = int(c[heads_key]) if heads_key else 1
        kv = int(c[kv_key]) if kv_key else (1 if c.get("multi_query") and not c.get("new_decoder_architecture") else heads)
        group = max(1, heads // max(kv, 1))
        old_hd = int(c.get("head_dim") or old_h // heads)
        new_heads = max(group, (hidden // old_hd) // group * group)
        while new_heads > group and hidden % new_heads:   # hidden must split evenly into heads
            new_heads -= group
        hd = max(2, hidden // new_heads // 2 * 2)         # even: RoPE rotates pairs
        hidden = new_heads * hd                            # rounded when no head count divides it (Falcon-180B)
        prf = c.get("partial_rotary_factor")
        if prf:                                            # phi: the rotary part must be even as well
            c["partial_rotary_factor"] = max(2, int(hd * prf) // 2 * 2) / hd
        c[h_key] = hidden
        if heads_key:
            c[heads_key] = new_heads
        if kv_key:
            c[kv_key] = max(1, new_heads // group)
        if "head_dim" in c and c["head_dim"] is not None:
            c["head_dim"] = hd
        if c.get("query_pre_attn_scalar"):
            c["query_pre_attn_scalar"] = hd
        for key in ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim", "moe_intermediate_size",
                    "shared_expert_intermediate_size", "expert_intermediate_size"):
            if c.get(key):
                c[key] = _round_to(c[key] * ratio, 16, 32)
        for key in ("q_lora_rank", "kv_lora_rank"):
            if c.get(key):
                c[key] = _round_to(c[key] * ratio, 16, 16)
        for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if c.get(key):
                c[key] = _round_to(c[key] * min(1.0, 4 * ratio), 8, 8)
    if intermediate is not None:
        for key in ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim"):
            if c.get(key):
                c[key] = intermediate
    if experts is not None:
        e_key = _first_key(c, "num_experts")
        if e_key is not None:
            c[e_key] = experts
            k_key = _first_key(c, "top_k")
            if k_key is not None:
                c[k_key] = min(int(c[k_key]), experts)
            if c.get("n_group"):  # DeepSeek group-limited routing: groups must divide the experts
                c["n_group"], c["topk_group"] = 1, 1
    if layers is not None:
        l_key = _first_key(c, "num_layers") or "num_hidden_layers"
        c[l_key] = layers
        if c.get("first_k_dense_replace"):
            c["first_k_dense_replace"] = min(int(c["first_k_dense_replace"]), max(layers - 1, 0))
        if c.get("mlp_only_layers"):
            c["mlp_only_layers"] = [i for i in c["mlp_only_layers"] if i < layers]
        if c.get("decoder_sparse_step") and int(c["decoder_sparse_step"]) > layers:
            c["decoder_sparse_step"] = 1
        if c.get("max_window_layers"):
            c["max_window_layers"] = min(int(c["max_window_layers"]), layers)
        for key in ("layer_types", "mamba_moe_layers"):
            if isinstance(c.get(key), list):
                c[key] = c[key][:layers]
    if vocab is not None:
        v_key = _first_key(c, "vocab_size") or "vocab_size"
        c[v_key] = vocab
        for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
            tok = c.get(key)
            if isinstance(tok, int) and tok >= vocab:
                c[key] = vocab - 1
            elif isinstance(tok, list):
                c[key] = [min(t, vocab - 1) for t in tok]
    return c


_SHRINK_ARGS = {"layers", "hidden", "experts", "vocab", "intermediate"}
_SHRINK_ALIASES = {"num_layers": "layers", "hidden_size": "hidden", "num_experts": "experts", "vocab_size": "vocab"}


def apply_shrink(cfg: dict[str, Any], shrink: dict[str, Any] | None) -> dict[str, Any]:
    """`shrink` as shrink_config keywords (layers=, hidden=, ...) or config keys; config keys that name a size
    (num_hidden_layers, hidden_size, num_local_experts, vocab_size, ...) go through shrink_config so the rest of
    the config follows; any other key overrides the config verbatim."""
    if not shrink:
        return copy.deepcopy(cfg)
    args: dict[str, Any] = {}
    raw: dict[str, Any] = {}
    for key, value in shrink.items():
        if key in _SHRINK_ARGS:
            args[key] = value
            continue
        field_name = next((f for f, keys in ALIASES.items() if key in keys and f in _SHRINK_ALIASES), None)
        if field_name is not None:
            args[_SHRINK_ALIASES[field_name]] = value
        else:
            raw[key] = value
    out = shrink_config(cfg, **args)
    out.update(raw)
    return out


# ---- the mix ---------------------------------------------------------------------------------------------------

def precision_dtypes(scn: Scenario) -> tuple[str, str | None, str | None]:
    """(base weight dtype, adapter dtype, autocast dtype) of the scenario's precision and method."""
    mix = scn.mix
    low = "float16" if mix.precision == "fp16-mixed" else "bfloat16"
    adapter = None
    if mix.precision == "fp32":
        base, auto = "float32", None
    elif mix.precision == "bf16":
        base, auto = "bfloat16", None
    else:  # mixed
        base, auto = ("float32" if mix.method == "full" else low), low
    if mix.trains_lora:
        adapter = "bfloat16" if mix.precision == "bf16" else "float32"
    return base, adapter, auto


def _group_of(fqn: str) -> str | None:
    """The ftscope group (spec.model.Linear.group) of a Linear module's dotted name, None outside the blocks."""
    parts = fqn.split(".")
    leaf = parts[-1]
    if leaf == "lm_head" or "embed" in leaf or leaf == "wte":
        return None
    if leaf in ("shared_expert_gate", "gate", "router"):
        return "router"
    if any(p in ("shared_expert", "shared_experts") for p in parts):
        return "shared_expert"
    if "experts" in parts:
        return "experts"
    if any(p in ("self_attn", "self_attention", "attn", "attention") for p in parts):
        return "attention"
    return "mlp"


def lora_selection(model: Any, scn: Scenario) -> tuple[list[str], list[str]]:
    """(target_modules, target_parameters) for PEFT that select exactly the matrices ftscope's target spec means:
    Linear modules by (group, name) and fused 3-D expert weights (gate_up_proj / down_proj) as parameters."""
    import torch

    chosen = scn.model.lora_targets(scn.mix.lora_targets)
    wanted = {(lin.group, name) for lin, _ in chosen for name in lin.names}
    modules: list[str] = []
    params: list[str] = []
    for fqn, mod in model.named_modules():
        group = _group_of(fqn) if fqn else None
        if group is None:
            continue
        if isinstance(mod, torch.nn.Linear):
            if (group, fqn.rsplit(".", 1)[-1]) in wanted:
                modules.append(fqn)
        elif group == "experts" and fqn.rsplit(".", 1)[-1] == "experts":
            for pname, p in mod.named_parameters(recurse=False):
                if p.dim() == 3 and ("experts", pname) in wanted:
                    params.append(f"{fqn}.{pname}")
    if not modules and not params:
        raise FtscopeError(f"LoRA targets {scn.mix.lora_targets!r} select no weight of the built {scn.model.name}")
    return modules, params


def _quantize_linears(model: Any, compute_dtype: Any, device: str) -> list[str]:
    """QLoRA: swap nn.Linear layers for bitsandbytes Linear4bit (NF4, double quant) the way transformers'
    `load_in_4bit` does (every Linear but lm_head and the model's keep-in-fp32 modules). On meta the 4-bit
    weights are placeholders (trace fills them with fake packed tensors); on cpu/cuda the weights are quantized."""
    import torch
    import bitsandbytes as bnb

    skip = ["lm_head", *(getattr(model, "_keep_in_fp32_modules", None) or [])]
    replaced: list[str] = []
    for fqn, mod in list(model.named_modules()):
        if type(mod) is not torch.nn.Linear or any(fqn == s or fqn.endswith("." + s) or s in fqn.split(".") for s in skip):
            continue
        new_dev = "meta" if device == "meta" else "cpu"
        new = bnb.nn.Linear4bit(mod.in_features, mod.out_features, bias=mod.bias is not None, compute_dtype=compute_dtype,
                                compress_statistics=True, quant_type="nf4", quant_storage=torch.uint8, device=new_dev)
        if device != "meta":
            w = mod.weight.data.to(torch.bfloat16 if compute_dtype == torch.float32 else compute_dtype).cpu()
            new.weight = bnb.nn.Params4bit(w, requires_grad=False, blocksize=NF4_BLOCKSIZE, compress_statistics=True,
                                           quant_type="nf4", quant_storage=torch.uint8, module=new).to(device)
            if mod.bias is not None:
                new.bias = torch.nn.Parameter(mod.bias.data.to(device), requires_grad=False)
        new.requires_grad_(False)
        model.set_submodule(fqn, new)
        replaced.append(fqn)
    return replaced


@contextmanager
def _v5_native_targets() -> Iterator[None]:
    """Turn off PEFT's transformers-v4 -> v5 target conversion while wrapping.

    PEFT rewrites target_modules of MoE families (Mixtral, Qwen-MoE, DeepSeek, ...) written for transformers 4:
    every `gate_proj`/`up_proj`/`down_proj`/`w1`... becomes a fused-expert target_parameter (with gate_up's rank
    doubled), which also drops LoRA from the dense and shared-expert MLPs that still carry those names. ftscope
    already names v5 modules and fused parameters exactly, so the conversion would only change what is selected.
    """
    from peft.tuners import tuners_utils

    saved = tuners_utils.is_transformers_ge_v5
    tuners_utils.is_transformers_ge_v5 = False
    try:
        yield
    finally:
        tuners_utils.is_transformers_ge_v5 = saved


def count_params(model: Any) -> tuple[int, int]:
    """(total, trainable) parameters, counting each tied tensor once and a 4-bit packed weight by the number of
    values it stores (2 per byte), the way the scenario's ModelSpec counts it."""
    total = trainable = 0
    seen: set[int] = set()
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        n = p.numel()
        q = getattr(p, "quant_state", None)
        if q is not None and getattr(q, "shape", None) is not None:
            n = math.prod(q.shape)
        total += n
        if p.requires_grad:
            trainable += n
    return total, trainable


WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")
CONFIG_MATCH = ("hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size", "num_attention_heads")


def check_weights(weights: str | Path, cfg: dict[str, Any], shrink: dict[str, Any] | None, device: str) -> Path:
    """A local Hugging Face model folder whose config matches the scenario's model (one-line errors)."""
    folder = Path(weights).expanduser()
    if device == "meta":
        raise FtscopeError("--weights: trace needs no weights (it allocates nothing); drop --weights")
    if shrink:
        raise FtscopeError("--weights and --shrink cannot be combined: shrinking changes every weight's shape")
    if not folder.is_dir():
        raise FtscopeError(f"--weights: {folder} is not a folder (a local Hugging Face model: config.json + *.safetensors)")
    if not any(any(folder.glob(pattern)) for pattern in WEIGHT_FILES):
        raise FtscopeError(f"--weights: no *.safetensors or pytorch_model*.bin in {folder}")
    try:
        theirs = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        raise FtscopeError(f"--weights: {folder} has no config.json") from None
    except json.JSONDecodeError as exc:
        raise FtscopeError(f"--weights: {folder / 'config.json'} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    ours_text, theirs_text = _text_config(cfg), _text_config(theirs)
    for key in CONFIG_MATCH:
        if key in ours_text and key in theirs_text and ours_text[key] != theirs_text[key]:
            raise FtscopeError(f"--weights: {folder} holds a different model than the scenario's ({key} "
                               f"{theirs_text[key]} there, {ours_text[key]} in the scenario; point `model:` at "
                               f"{folder / 'config.json'})")
    return folder


def _from_pretrained(transformers: Any, folder: Path, hf_cfg: Any, dtype: Any, device: str, kwargs: dict[str, Any]) -> Any:
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(
            str(folder), config=hf_cfg, dtype=dtype, device_map=device if device.startswith("cuda") else None,
            local_files_only=True, **kwargs)
    except (OSError, RuntimeError) as exc:
        raise FtscopeError(f"--weights: transformers cannot load {folder}: {str(exc).splitlines()[0][:300]}") from None


def build_model(scn: Scenario, device: str = "meta", shrink: dict[str, Any] | None = None,
                dtype: Any = None, weights: str | Path | None = None) -> tuple[Any, BuildInfo]:
    """The scenario's model with its mix applied, in training mode: random weights, or the local Hugging Face
    checkpoint in `weights` (loaded by transformers, so older per-expert layouts are converted as usual).

    device: meta (no memory; what `trace` uses) | cpu | cuda. shrink: smaller sizes for tests and CPU
    profiles (see apply_shrink). dtype: override the base weight dtype the precision implies.
    """
    require_torch(("bitsandbytes",) if scn.mix.method == "qlora" else ())
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    if device not in ("meta", "cpu", "cuda") and not str(device).startswith("cuda:"):
        raise FtscopeError(f"device must be meta, cpu or cuda; got {device!r}")
    mix, spec = scn.mix, scn.model
    cfg = apply_shrink(scenario_config(scn), shrink)
    folder = check_weights(weights, cfg, shrink, str(device)) if weights is not None else None
    notes: list[str] = []
    base_name, adapter_name, auto_name = precision_dtypes(scn)
    base_dtype = dtype if dtype is not None else getattr(torch, base_name)

    attention = mix.attention
    if attention == "flash":
        import importlib.util
        if str(device).startswith("cuda") and importlib.util.find_spec("flash_attn") is not None:
            attention = "flash_attention_2"
        else:
            attention = "sdpa"
            notes.append("attention flash runs as sdpa here (no FlashAttention-2 kernel on this device); both keep "
                         "q, k, v, the output and a log-sum-exp for backward")
    kwargs: dict[str, Any] = {"attn_implementation": attention}
    experts_impl = None
    top_k = None
    if spec.is_moe:
        experts_impl = mix.experts_backend
        if experts_impl == "modules":  # transformers 5 stores experts fused; no per-expert nn.Linear layout
            experts_impl = "eager"
            notes.append("experts_backend modules (transformers 4.x per-expert nn.Linear) does not exist in "
                         "transformers 5: built the eager loop over fused experts instead")
        kwargs["experts_implementation"] = experts_impl
        text = _text_config(cfg)
        k_key = _first_key(text, "top_k")
        if mix.experts_top_k:
            if k_key is None:
                raise FtscopeError(f"{spec.name}: the config has no top-k key to override")
            e_key = _first_key(text, "num_experts")
            if e_key is not None and mix.experts_top_k > int(text[e_key]):
                raise FtscopeError(f"experts_top_k {mix.experts_top_k} exceeds the {text[e_key]} experts of the model "
                                   "as built (did --shrink reduce the experts?)")
            text[k_key] = mix.experts_top_k
        top_k = int(text[k_key]) if k_key else None
    cfg["use_cache"] = False  # training: no KV cache (HF Trainer recipes set this; GC forces it)
    try:
        hf_cfg = transformers.AutoConfig.for_model(**cfg)
    except (ValueError, TypeError, KeyError) as exc:
        raise FtscopeError(f"transformers cannot build a config for {spec.name}: {exc}") from None
    def instantiate() -> Any:
        if folder is not None:
            return _from_pretrained(transformers, folder, hf_cfg, base_dtype, str(device), kwargs)
        with torch.device(device):
            return transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=base_dtype, **kwargs)

    try:
        model = instantiate()
    except ValueError as exc:
        if attention != "sdpa" or "scaled_dot_product_attention" not in str(exc):
            raise FtscopeError(f"transformers cannot build {spec.name}: {exc}") from None
        attention = kwargs["attn_implementation"] = "eager"  # what transformers falls back to when not forced
        notes.append(f"{type(hf_cfg).__name__.replace('Config', '')} has no sdpa attention in transformers; traced eager")
        model = instantiate()
    if folder is not None:
        notes.append(f"weights loaded from {folder}")
    if spec.is_moe:
        experts_impl = getattr(model.config, "_experts_implementation", experts_impl)
    model.train()

    if mix.method == "full":
        model.requires_grad_(True)
    else:
        model.requires_grad_(False)
    quantized: list[str] = []
    if mix.method == "qlora":
        quantized = _quantize_linears(model, getattr(torch, auto_name or "bfloat16"), str(device))
        if not quantized:
            notes.append("QLoRA: transformers' bitsandbytes integration replaces exact nn.Linear modules only; this "
                         f"model's layers subclass it and stay in {base_name}")
        elif spec.is_moe:
            notes.append("QLoRA: bitsandbytes quantizes nn.Linear layers only; the fused 3-D expert weights stay in "
                         f"{base_name}")
    if mix.gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name warns
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    modules: list[str] = []
    params: list[str] = []
    if mix.trains_lora:
        import peft

        modules, params = lora_selection(model, scn)
        lcfg = peft.LoraConfig(r=mix.lora_rank, lora_alpha=2 * mix.lora_rank, lora_dropout=0.0, bias="none",
                               target_modules=modules or None, target_parameters=params or None,
                               task_type="CAUSAL_LM")
        with _v5_native_targets():
            model = peft.get_peft_model(model, lcfg, autocast_adapter_dtype=False)
        adapter_dtype = getattr(torch, adapter_name or "float32")
        for p in model.parameters():
            if p.requires_grad and p.dtype != adapter_dtype:
                p.data = p.data.to(adapter_dtype)
        if params:
            notes.append("PEFT LoRA on fused experts: one adapter per expert on gate_up_proj (rank r over 2 x "
                         "intermediate) and down_proj; the merged W + BA of the whole stack is materialized each "
                         "forward")
    total, trainable = count_params(model)
    if mix.trains_lora:
        total -= trainable  # the scenario's model size: the base weights, adapters counted as trainable only
    info = BuildInfo(config=cfg, attention=attention, experts_implementation=experts_impl, top_k=top_k,
                     param_dtype=str(base_dtype).replace("torch.", ""), adapter_dtype=adapter_name,
                     autocast_dtype=auto_name, gradient_checkpointing=mix.gradient_checkpointing,
                     lora_target_modules=modules, lora_target_parameters=params, quantized_modules=quantized,
                     total_params=total, trainable_params=trainable, notes=notes)
    return model, info
