"""Build the real HF model of a scenario (random weights or a local checkpoint, never a download), with the scenario's mix applied.

The point of ftscope's measurements is to run the code people actually train with, so this module only
assembles real pieces: `AutoModelForCausalLM.from_config` for the architecture (`AutoModelForImageTextToText` for
a multimodal wrapper it refuses: Mistral 3), the config keys transformers 5
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

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ...errors import FtscopeError
from ...spec.scenario import Scenario
from .. import require_torch
from .checkpoint import auto_model_class, check_weights, from_pretrained
from .configs import apply_shrink, first_key, scenario_config, text_config

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
    """QLoRA: the Linear layers replaced by bitsandbytes Linear4bit (NF4; double quant unless mix.nested_quant)."""
    total_params: int = 0
    """Parameters of the model as the scenario defines it (4-bit layers counted by their unquantized size)."""
    trainable_params: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def vocab_size(self) -> int | None:
        """The language model's vocabulary (multimodal configs keep it in text_config)."""
        vocab = text_config(self.config).get("vocab_size")
        return None if vocab is None else int(vocab)


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


def _quantize_linears(model: Any, compute_dtype: Any, device: str, nested: bool = True) -> list[str]:
    """QLoRA: swap nn.Linear layers for bitsandbytes Linear4bit (NF4, double quant when `nested`: the scenario's
    mix.nested_quant, transformers' bnb_4bit_use_double_quant) the way transformers' `load_in_4bit` does (every
    Linear but lm_head and the model's keep-in-fp32 modules). On meta the 4-bit weights are placeholders (trace
    fills them with fake packed tensors); on cpu/cuda the weights are quantized."""
    import torch
    import bitsandbytes as bnb

    skip = ["lm_head", *(getattr(model, "_keep_in_fp32_modules", None) or [])]
    replaced: list[str] = []
    for fqn, mod in list(model.named_modules()):
        if type(mod) is not torch.nn.Linear or any(fqn == s or fqn.endswith("." + s) or s in fqn.split(".") for s in skip):
            continue
        new_dev = "meta" if device == "meta" else "cpu"
        new = bnb.nn.Linear4bit(mod.in_features, mod.out_features, bias=mod.bias is not None, compute_dtype=compute_dtype,
                                compress_statistics=nested, quant_type="nf4", quant_storage=torch.uint8, device=new_dev)
        if device != "meta":
            w = mod.weight.data.to(torch.bfloat16 if compute_dtype == torch.float32 else compute_dtype).cpu()
            new.weight = bnb.nn.Params4bit(w, requires_grad=False, blocksize=NF4_BLOCKSIZE, compress_statistics=nested,
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


def _attention(mix: Any, device: str, notes: list[str]) -> str:
    """The HF attention implementation for the mix: flash runs FlashAttention-2 where its kernel exists."""
    if mix.attention != "flash":
        return mix.attention
    import importlib.util
    if device.startswith("cuda") and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    notes.append("attention flash runs as sdpa here (no FlashAttention-2 kernel on this device); both keep "
                 "q, k, v, the output and a log-sum-exp for backward")
    return "sdpa"


def _moe_config(scn: Scenario, cfg: dict[str, Any], kwargs: dict[str, Any], notes: list[str]) -> tuple[str, int | None]:
    """MoE: the experts implementation (into kwargs) and the top-k (written into the config); (experts, top-k)."""
    mix, spec = scn.mix, scn.model
    experts_impl = mix.experts_backend
    if experts_impl == "modules":  # transformers 5 stores experts fused; no per-expert nn.Linear layout
        experts_impl = "eager"
        notes.append("experts_backend modules (transformers 4.x per-expert nn.Linear) does not exist in "
                     "transformers 5: built the eager loop over fused experts instead")
    kwargs["experts_implementation"] = experts_impl
    text = text_config(cfg)
    k_key = first_key(text, "top_k")
    if mix.experts_top_k:
        if k_key is None:
            raise FtscopeError(f"{spec.name}: the config has no top-k key to override")
        e_key = first_key(text, "num_experts")
        if e_key is not None and mix.experts_top_k > int(text[e_key]):
            raise FtscopeError(f"experts_top_k {mix.experts_top_k} exceeds the {text[e_key]} experts of the model "
                               "as built (did --shrink reduce the experts?)")
        text[k_key] = mix.experts_top_k
    return experts_impl, int(text[k_key]) if k_key else None


def _instantiate(scn: Scenario, cfg: dict[str, Any], folder: Path | None, dtype: Any, device: str,
                 kwargs: dict[str, Any], notes: list[str]) -> Any:
    """transformers builds the model (random weights, or the local checkpoint); a family without sdpa falls back
    to eager attention, as transformers does when the implementation is not forced."""
    import torch
    import transformers

    try:
        hf_cfg = transformers.AutoConfig.for_model(**cfg)
    except (ValueError, TypeError, KeyError) as exc:
        raise FtscopeError(f"transformers cannot build a config for {scn.model.name}: {exc}") from None

    auto = auto_model_class(transformers, hf_cfg, cfg)

    def instantiate() -> Any:
        if folder is not None:
            return from_pretrained(folder, hf_cfg, dtype, device, kwargs, auto)
        with torch.device(device):
            return auto.from_config(hf_cfg, dtype=dtype, **kwargs)

    for _ in range(3):  # at most twice more: without an experts backend, then with eager attention
        try:
            return instantiate()
        except ValueError as exc:
            message, family = str(exc), type(hf_cfg).__name__.replace("Config", "")
            if "experts implementation" in message and "experts_implementation" in kwargs:
                chosen = kwargs.pop("experts_implementation")  # Llama 4: one batched matmul over all experts
                for c in (hf_cfg, hf_cfg.get_text_config()):  # the failed call left its choice on the config
                    c._experts_implementation = None
                notes.append(f"{family} has one experts implementation in transformers; experts_backend "
                             f"{chosen} not applied")
            elif kwargs["attn_implementation"] == "sdpa" and "scaled_dot_product_attention" in message:
                kwargs["attn_implementation"] = "eager"  # what transformers falls back to when not forced
                notes.append(f"{family} has no sdpa attention in transformers; traced eager")
            else:
                raise FtscopeError(f"transformers cannot build {scn.model.name}: {exc}") from None
    raise FtscopeError(f"transformers cannot build {scn.model.name}")


def _train_mode(model: Any, scn: Scenario, base_name: str, auto_name: str | None, device: str,
                notes: list[str]) -> list[str]:
    """What trains (all, or nothing of the base), QLoRA's 4-bit layers, checkpointing; the quantized layers."""
    import torch

    mix, spec = scn.mix, scn.model
    model.train()
    model.requires_grad_(mix.method == "full")
    quantized: list[str] = []
    if mix.method == "qlora":
        quantized = _quantize_linears(model, getattr(torch, auto_name or "bfloat16"), device, mix.nested_quant)
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
    return quantized


def _add_lora(model: Any, scn: Scenario, adapter_name: str | None, notes: list[str]) -> tuple[Any, list[str], list[str]]:
    """PEFT LoRA on exactly the matrices the scenario's targets name; (model, target modules, target parameters)."""
    import peft
    import torch

    mix = scn.mix
    modules, params = lora_selection(model, scn)
    lcfg = peft.LoraConfig(r=mix.lora_rank, lora_alpha=2 * mix.lora_rank, lora_dropout=0.0, bias="none",
                           target_modules=modules or None, target_parameters=params or None, task_type="CAUSAL_LM")
    with _v5_native_targets():
        model = peft.get_peft_model(model, lcfg, autocast_adapter_dtype=False)
    adapter_dtype = getattr(torch, adapter_name or "float32")
    for p in model.parameters():
        if p.requires_grad and p.dtype != adapter_dtype:
            p.data = p.data.to(adapter_dtype)
    if params:
        notes.append("PEFT LoRA on fused experts: one adapter per expert on gate_up_proj (rank r over 2 x "
                     "intermediate) and down_proj; the merged W + BA of the whole stack is materialized each forward")
    return model, modules, params


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
    kwargs: dict[str, Any] = {"attn_implementation": _attention(mix, str(device), notes)}
    experts_impl, top_k = _moe_config(scn, cfg, kwargs, notes) if spec.is_moe else (None, None)
    cfg["use_cache"] = False  # training: no KV cache (HF Trainer recipes set this; GC forces it)
    model = _instantiate(scn, cfg, folder, base_dtype, str(device), kwargs, notes)
    if folder is not None:
        notes.append(f"weights loaded from {folder}")
    if spec.is_moe:
        experts_impl = getattr(model.config, "_experts_implementation", experts_impl)
    quantized = _train_mode(model, scn, base_name, auto_name, str(device), notes)
    modules: list[str] = []
    params: list[str] = []
    if mix.trains_lora:
        model, modules, params = _add_lora(model, scn, adapter_name, notes)
    total, trainable = count_params(model)
    if mix.trains_lora:
        total -= trainable  # the scenario's model size: the base weights, adapters counted as trainable only
    info = BuildInfo(config=cfg, attention=kwargs["attn_implementation"], experts_implementation=experts_impl,
                     top_k=top_k, param_dtype=str(base_dtype).replace("torch.", ""), adapter_dtype=adapter_name,
                     autocast_dtype=auto_name, gradient_checkpointing=mix.gradient_checkpointing,
                     lora_target_modules=modules, lora_target_parameters=params, quantized_modules=quantized,
                     total_params=total, trainable_params=trainable, notes=notes)
    return model, info
