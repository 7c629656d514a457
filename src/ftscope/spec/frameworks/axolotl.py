"""Axolotl: an `axolotl train config.yml` file.

Defaults are Axolotl's own schema defaults (src/axolotl/utils/schemas/*.py at 067b021c): sequence_len 512,
micro_batch_size 1, num_epochs 1, optimizer adamw_torch_fused, bf16 auto, no checkpointing, lora_dropout 0."""
from __future__ import annotations

from typing import Any

from .base import (FrameworkConfig, Keys, attention, dataset_lengths, deepspeed, fsdp, is_set, key_table, listed, model,
                   nested_quant, optimizer, precision)
from .hf_args import checkpoint_variant

# Axolotl's boolean attention switches, in the order its loader checks them
_ATTENTION_FLAGS = (("flash_attention", "flash"), ("sdp_attention", "sdpa"), ("eager_attention", "eager"),
                    ("xformers_attention", "xformers"), ("flex_attention", "flex_attention"))
_PLUGIN_LOSSES = {"liger_fused_linear_cross_entropy": "fused_linear", "cut_cross_entropy": "fused_linear"}


def read(data: dict[str, Any], cfg: FrameworkConfig) -> None:
    cfg.scenario["framework"] = "axolotl"
    keys = Keys(data, key_table("axolotl"), cfg)
    model(keys.get("base_model"), "base_model", cfg)
    if is_set(keys.get("rl")):
        raise cfg.fail("rl", f"{keys.get('rl')} (preference or RL training) is not modelled; supervised fine-tuning is")
    _method(keys, cfg)
    _workload(keys, cfg)
    cfg.set("mix.optimizer", optimizer(keys.get("optimizer", "adamw_torch_fused"), "optimizer", cfg))
    cfg.set("mix.precision", precision(keys.get("bf16", "auto"), keys.get("fp16", False)))
    ckpt = keys.get("gradient_checkpointing", False)
    cfg.set("mix.gradient_checkpointing", bool(ckpt))
    if isinstance(ckpt, str):  # offload / offload_disk: block inputs go to CPU RAM (or disk)
        cfg.unmapped.append(f"gradient_checkpointing={ckpt} (checkpointed block inputs offloaded: counted on the GPU)")
    kwargs = keys.get("gradient_checkpointing_kwargs") or {}
    checkpoint_variant(keys, cfg, "gradient_checkpointing_kwargs", kwargs.get("use_reentrant") if isinstance(kwargs, dict) else None)
    cfg.set("mix.attention", _attention(keys, cfg))
    if is_set(keys.get("deepspeed")):
        deepspeed(keys.get("deepspeed"), "deepspeed", cfg)
    if is_set(keys.get("fsdp")) or is_set(keys.get("fsdp_config")):
        fsdp(keys.get("fsdp") or "full_shard", keys.get("fsdp_config"), "fsdp", cfg)
        keys.get("fsdp_version")
    if is_set(keys.get("experts_implementation")):
        cfg.set("mix.experts_backend", str(keys.get("experts_implementation")))
    for key, loss in _PLUGIN_LOSSES.items():
        if keys.get(key, False):
            cfg.set("mix.loss", loss)
    if keys.get("chunked_cross_entropy", False):
        cfg.set("mix.loss", "chunked")
    if keys.get("datasets"):
        dataset_lengths(cfg, "datasets", [d.get("path") if isinstance(d, dict) else d for d in keys.get("datasets")],
                        "sequence_len")
    cfg.unmapped += keys.unmapped()


def _method(keys: Keys, cfg: FrameworkConfig) -> None:
    adapter = keys.get("adapter")
    if keys.get("load_in_8bit", False):
        raise cfg.fail("load_in_8bit", "an 8-bit (LLM.int8) base is not modelled (a bf16 base or 4-bit NF4 is)")
    four = bool(keys.get("load_in_4bit", False))
    if adapter not in (None, "lora", "qlora"):
        raise cfg.fail("adapter", f"{adapter} is not modelled (lora and qlora are)")
    if adapter is None and four:
        raise cfg.fail("load_in_4bit", "a 4-bit base trains only through adapters (adapter: qlora)")
    cfg.set("mix.method", "full" if adapter is None else ("qlora" if four or adapter == "qlora" else "lora"))
    _bnb_kwargs(keys, cfg, adapter is not None and (four or adapter == "qlora"))
    if adapter is None:
        return
    cfg.set("mix.lora_rank", int(keys.get("lora_r", 8)))
    cfg.set("mix.lora_dropout", float(keys.get("lora_dropout", 0.0)))
    modules = keys.get("lora_target_modules")
    if keys.get("lora_target_linear", False) or not modules:
        cfg.set("mix.lora_targets", "all-linear")
    else:
        cfg.set("mix.lora_targets", listed(modules))


BNB_KWARGS_NO_EFFECT = {"bnb_4bit_compute_dtype", "bnb_4bit_quant_type", "bnb_4bit_quant_storage", "llm_int8_threshold",
                        "llm_int8_has_fp16_weight"}
"""bnb_config_kwargs keys that leave the 4-bit bytes alone (fp4 and nf4 pack the same; quant storage is a view)."""


def _bnb_kwargs(keys: Keys, cfg: FrameworkConfig, quantized: bool) -> None:
    """bnb_config_kwargs: merged over the loader's BitsAndBytesConfig (bnb_4bit_use_double_quant True) when
    adapter is qlora with load_in_4bit (src/axolotl/loaders/model.py lines 712-738 at 067b021c); else unused."""
    kwargs = keys.get("bnb_config_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise cfg.fail("bnb_config_kwargs", f"must be a mapping; got {kwargs!r:.40}")
    if not quantized:
        return
    if "bnb_4bit_use_double_quant" in kwargs:
        nested_quant(kwargs["bnb_4bit_use_double_quant"], "bnb_config_kwargs.bnb_4bit_use_double_quant", cfg)
    for key, value in kwargs.items():
        if key != "bnb_4bit_use_double_quant" and key not in BNB_KWARGS_NO_EFFECT:
            cfg.unmapped.append(f"bnb_config_kwargs.{key}={value} (not read by ftscope)")


def _workload(keys: Keys, cfg: FrameworkConfig) -> None:
    micro = int(keys.get("micro_batch_size", 1))
    accum = int(keys.get("gradient_accumulation_steps", 1))
    cfg.set("workload.seq_len", int(keys.get("sequence_len", 512)))
    cfg.set("workload.micro_batch_size", micro)
    cfg.set("workload.gradient_accumulation", accum)
    if keys.get("sample_packing", False):
        cfg.set("workload.padding", "packed")
    elif keys.get("pad_to_sequence_len", False):
        cfg.set("workload.padding", "max_length")
    steps = int(keys.get("max_steps", 0) or 0)
    if steps > 0:
        cfg.set("workload.num_samples", steps * micro * accum)
        cfg.notes.append(f"max_steps {steps}: {steps * micro * accum:,} samples on one GPU, as one epoch")
        cfg.set("workload.epochs", 1.0)
    else:
        cfg.set("workload.epochs", float(keys.get("num_epochs", 1.0)))


def _attention(keys: Keys, cfg: FrameworkConfig) -> str:
    impl = keys.get("attn_implementation")
    if impl:
        return attention(impl, "attn_implementation", cfg)
    for key, name in _ATTENTION_FLAGS:
        if keys.get(key, False):
            return attention(name, key, cfg)
    return "sdpa"
