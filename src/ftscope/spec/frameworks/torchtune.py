"""torchtune: a recipe config (`tune run lora_finetune_single_device --config ...`), components named by
`_component_` paths. Defaults are the recipes' own (recipes/*.py at bd2a0fc7): gradient accumulation 1, no
checkpointing unless enable_activation_checkpointing, dtype bf16; compile, enable_activation_offloading and
optimizer_in_bwd map to mix.compile, mix.activation_offload and mix.optimizer_in_backward."""
from __future__ import annotations

from typing import Any, Mapping

from .base import FrameworkConfig, Keys, is_set, key_table, model, optimizer
from .models import torchtune_model

_LOSSES = {"linearcrossentropyloss": "chunked", "cewithchunkedoutputloss": "chunked",
           "crossentropyloss": "standard"}
_MODEL_KEYS = {"_component_", "lora_attn_modules", "apply_lora_to_mlp", "apply_lora_to_output", "lora_rank",
               "lora_alpha", "lora_dropout", "quantize_base"}


def component(value: Any) -> str:
    """The `_component_` of a config node (a string node is its own component)."""
    return str(value.get("_component_", "")) if isinstance(value, Mapping) else str(value or "")


def read(data: dict[str, Any], cfg: FrameworkConfig) -> None:
    cfg.scenario["framework"] = "torchtune"
    keys = Keys(data, key_table("torchtune"), cfg)
    _model(keys.get("model") or {}, cfg)
    cfg.set("workload.micro_batch_size", int(keys.get("batch_size", 1)))
    cfg.set("workload.gradient_accumulation", int(keys.get("gradient_accumulation_steps", 1)))
    cfg.set("workload.epochs", float(keys.get("epochs", 1)))
    _data(keys.get("tokenizer") or {}, keys.get("dataset") or {}, cfg)
    steps = keys.get("max_steps_per_epoch")
    if is_set(steps):
        samples = int(steps) * cfg.scenario["workload"]["micro_batch_size"] * cfg.scenario["workload"]["gradient_accumulation"]
        cfg.set("workload.num_samples", samples)
        cfg.notes.append(f"max_steps_per_epoch {steps}: {samples:,} samples per epoch on one GPU")
    cfg.set("mix.optimizer", optimizer(component(keys.get("optimizer")) or "torch.optim.AdamW", "optimizer", cfg))
    loss = component(keys.get("loss")).rsplit(".", 1)[-1].lower()
    if loss:
        if loss not in _LOSSES:
            raise cfg.fail("loss", f"{component(keys.get('loss'))} is not modelled (torchtune's chunked losses or "
                           "torch's cross-entropy are)")
        cfg.set("mix.loss", _LOSSES[loss])
    dtype = str(keys.get("dtype", "bf16"))
    if dtype not in ("bf16", "fp32"):
        raise cfg.fail("dtype", f"{dtype} is not modelled (bf16 or fp32)")
    cfg.set("mix.precision", "bf16" if dtype == "bf16" else "fp32")
    cfg.set("mix.gradient_checkpointing", bool(keys.get("enable_activation_checkpointing", False)))
    # compile (model and loss), activation offloading and the optimizer step fused into backward are mix keys
    for key, mix_key in (("compile", "mix.compile"), ("enable_activation_offloading", "mix.activation_offload"),
                         ("optimizer_in_bwd", "mix.optimizer_in_backward")):
        if is_set(keys.get(key)):
            cfg.set(mix_key, True)
    # the *_distributed recipes always shard with FSDP2 (reshard_after_forward True by default); one device, none
    cfg.multi_gpu_mix["fsdp"] = "full_shard" if keys.get("fsdp_reshard_after_forward", True) else "shard_grad_op"
    if is_set(keys.get("fsdp_cpu_offload")):
        cfg.multi_gpu_mix["offload"] = "optimizer+params"
    cfg.unmapped += keys.unmapped()


def _model(node: Mapping[str, Any], cfg: FrameworkConfig) -> None:
    method, name, _ = torchtune_model(component(node))
    model(name, "model._component_", cfg)
    cfg.set("mix.method", method)
    if is_set(node.get("use_dora")):
        raise cfg.fail("model.use_dora", "DoRA is not modelled (LoRA is)")
    for key in set(node) - _MODEL_KEYS - {"use_dora"}:
        cfg.unmapped.append(f"model.{key}={node[key]} (not read by ftscope)")
    if method == "full":
        return
    targets = [str(m) for m in node.get("lora_attn_modules") or ()]
    if node.get("apply_lora_to_mlp"):
        targets += ["w1", "w2", "w3"]
    if node.get("apply_lora_to_output"):
        cfg.unmapped.append("model.apply_lora_to_output=true (a LoRA on the output projection: r x (hidden + vocab) "
                            "adapter weights not counted)")
    if not targets:
        raise cfg.fail("model.lora_attn_modules", "names no module to adapt")
    cfg.set("mix.lora_targets", targets)
    cfg.set("mix.lora_rank", int(node.get("lora_rank", 8)))
    cfg.set("mix.lora_dropout", float(node.get("lora_dropout", 0.0)))


def _data(tokenizer: Mapping[str, Any], dataset: Any, cfg: FrameworkConfig) -> None:
    nodes = dataset if isinstance(dataset, list) else [dataset]
    packed = any(isinstance(n, Mapping) and n.get("packed") for n in nodes)
    length = tokenizer.get("max_seq_len") if isinstance(tokenizer, Mapping) else None
    if length is not None:
        cfg.set("workload.seq_len", int(length))
    if packed:
        cfg.set("workload.padding", "packed")
    names = ", ".join(component(n).rsplit(".", 1)[-1] for n in nodes if component(n))
    cfg.unmapped.append(f"dataset={names or '?'} (token lengths unknown: "
                        + ("every sequence counted at max_seq_len; " if length is not None else
                           "tokenizer.max_seq_len is null, so samples are not truncated: workload.seq_len must "
                           "give the longest; ")
                        + "give workload.dataset statistics for time)")
