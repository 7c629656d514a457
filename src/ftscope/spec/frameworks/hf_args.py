"""transformers.TrainingArguments keys (TRL's SFTConfig and LLaMA-Factory's train YAML are built on them)."""
from __future__ import annotations

from typing import Any

from ..recipe import load_recipe
from .base import FrameworkConfig, Keys, deepspeed, fsdp, is_set, liger_loss, optimizer, precision


def checkpoint_variant(keys: Keys, cfg: FrameworkConfig, key: str, use_reentrant: Any) -> None:
    """A use_reentrant choice that differs from what the framework's recipe models is listed, not ignored."""
    if use_reentrant is None:
        return
    want = "reentrant" if use_reentrant else "non_reentrant"
    have = load_recipe(cfg.scenario["framework"]).checkpoint_impl
    if have != "offload" and want != have:
        cfg.unmapped.append(f"{key}: use_reentrant={bool(use_reentrant)} ({cfg.scenario['framework']} is modelled "
                            f"with {have.replace('_', '-')} checkpointing)")


def read_training_args(keys: Keys, cfg: FrameworkConfig, checkpointing: bool, bf16: bool) -> None:
    """Batch, accumulation, epochs (or max_steps), checkpointing, precision, optimizer, DeepSpeed / FSDP and the
    Liger loss from TrainingArguments keys; `checkpointing` and `bf16` are the framework's own defaults
    (SFTConfig turns both on, the plain Trainer neither)."""
    micro = int(keys.get("per_device_train_batch_size", 8))
    accum = int(keys.get("gradient_accumulation_steps", 1))
    cfg.set("workload.micro_batch_size", micro)
    cfg.set("workload.gradient_accumulation", accum)
    epochs = float(keys.get("num_train_epochs", 3.0))
    steps = int(keys.get("max_steps", -1))
    if steps > 0:  # the run stops after max_steps optimizer steps, whatever the epochs say
        cfg.set("workload.num_samples", steps * micro * accum)
        cfg.notes.append(f"max_steps {steps}: {steps * micro * accum:,} samples on one GPU, as one epoch")
        epochs = 1.0
    cfg.set("workload.epochs", epochs)

    ckpt = keys.get("activation_checkpointing", keys.get("gradient_checkpointing"))
    cfg.set("mix.gradient_checkpointing", bool(checkpointing if ckpt is None else ckpt))
    ck_kwargs = keys.get("activation_checkpointing_kwargs", keys.get("gradient_checkpointing_kwargs")) or {}
    if isinstance(ck_kwargs, dict):
        checkpoint_variant(keys, cfg, "gradient_checkpointing_kwargs", ck_kwargs.get("use_reentrant"))

    fp16 = keys.get("fp16", False)
    bf16_flag = keys.get("bf16")
    cfg.set("mix.precision", precision(bf16 and not is_set(fp16) if bf16_flag is None else bf16_flag, fp16))
    cfg.set("mix.optimizer", optimizer(keys.get("optim", "adamw_torch_fused"), "optim", cfg))
    if is_set(keys.get("deepspeed")):
        deepspeed(keys.get("deepspeed"), "deepspeed", cfg)
    if is_set(keys.get("fsdp")):
        fsdp(keys.get("fsdp"), keys.get("fsdp_config"), "fsdp", cfg)
    if is_set(keys.get("use_liger_kernel")):
        liger_loss(cfg, "use_liger_kernel")
