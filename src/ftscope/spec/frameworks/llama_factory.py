"""LLaMA-Factory: a `llamafactory-cli train` YAML (model, method, dataset and TrainingArguments keys in one file).

Defaults are LLaMA-Factory's own (src/llamafactory/hparams/*.py at ff6d4d12): cutoff_len 2048, lora_rank 8,
lora_target all, gradient checkpointing on, packing only for pre-training."""
from __future__ import annotations

from typing import Any

from .base import (FrameworkConfig, Keys, attention, is_set, key_table, dataset_lengths, liger_loss, listed, model,
                   nested_quant)
from .hf_args import checkpoint_variant, read_training_args

DETECT_KEYS = {"stage", "finetuning_type", "template", "cutoff_len", "lora_target", "quantization_bit", "dataset_dir"}
"""Keys only a LLaMA-Factory file has (beside model_name_or_path)."""
STAGES = ("sft", "pt")


def read(data: dict[str, Any], cfg: FrameworkConfig) -> None:
    cfg.scenario["framework"] = "llama-factory"
    keys = Keys(data, key_table("hf-training-args", "llama-factory"), cfg)
    model(keys.get("model_name_or_path", ""), "model_name_or_path", cfg)
    stage = str(keys.get("stage", "sft"))
    if stage not in STAGES:
        raise cfg.fail("stage", f"{stage} (a reward model, PPO or preference training) is not modelled; sft and pt are")
    read_training_args(keys, cfg, checkpointing=True, bf16=False)
    if keys.get("pure_bf16", False):
        cfg.set("mix.precision", "bf16")
    # LLaMA-Factory turns checkpointing on itself unless told not to (model/model_utils/checkpointing.py)
    cfg.set("mix.gradient_checkpointing", not keys.get("disable_gradient_checkpointing", False))
    checkpoint_variant(keys, cfg, "use_reentrant_gc", keys.get("use_reentrant_gc", True))
    _method(keys, cfg)
    cfg.set("mix.attention", attention(keys.get("flash_attn", "auto"), "flash_attn", cfg))
    cfg.set("workload.seq_len", int(keys.get("cutoff_len", 2048)))
    packing = keys.get("packing")
    if keys.get("neat_packing", False) or (stage == "pt" if packing is None else packing):
        cfg.set("workload.padding", "packed")
    if is_set(keys.get("max_samples")):
        cfg.set("workload.num_samples", int(keys.get("max_samples")))
    if keys.get("enable_liger_kernel", False):
        liger_loss(cfg, "enable_liger_kernel")
    if keys.get("dataset"):
        dataset_lengths(cfg, "dataset", keys.get("dataset"), "cutoff_len")
    cfg.unmapped += keys.unmapped()


def _method(keys: Keys, cfg: FrameworkConfig) -> None:
    kind = str(keys.get("finetuning_type", "lora"))
    if kind not in ("lora", "full"):
        raise cfg.fail("finetuning_type", f"{kind} tuning is not modelled (lora and full are)")
    bits = keys.get("quantization_bit")
    double = keys.get("double_quantization", True)  # read either way: without quantization_bit it does nothing
    if is_set(bits):
        method = str(keys.get("quantization_method", "bnb"))
        if int(bits) != 4 or method != "bnb":
            raise cfg.fail("quantization_bit", f"{bits}-bit {method} quantization is not modelled "
                           "(4-bit bitsandbytes NF4 is)")
        if kind != "lora":
            raise cfg.fail("quantization_bit", "a quantized base trains only through adapters (finetuning_type: lora)")
        nested_quant(double, "double_quantization", cfg)
    cfg.set("mix.method", "full" if kind == "full" else ("qlora" if is_set(bits) else "lora"))
    if kind == "lora":
        cfg.set("mix.lora_rank", int(keys.get("lora_rank", 8)))
        cfg.set("mix.lora_dropout", float(keys.get("lora_dropout", 0.0)))
        targets = listed(keys.get("lora_target", "all"))
        cfg.set("mix.lora_targets", "all-linear" if targets == ["all"] else targets)
