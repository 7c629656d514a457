"""A recommended scenario written back in a fine-tuning framework's own config format (Axolotl, LLaMA-Factory,
torchtune, TRL), on top of the user's config when it was one: keys ftscope does not read are kept as they were.

Each writer sets exactly the keys spec/frameworks reads, so reading the written file gives the recommendation back.
DeepSpeed mixes point at the ds_config.json that plan/emit.py writes beside it."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from .. import catalog
from ..errors import FtscopeError
from ..spec.frameworks.base import known_optimizer
from ..spec.frameworks.models import torchtune_builder, torchtune_family
from ..spec.scenario import Scenario
from .emit import commented, emit_recommendation, label_lines
from .recommend import Recommendation

FILES = {"axolotl": "axolotl.yml", "llama-factory": "llama-factory.yaml", "torchtune": "torchtune.yaml", "trl": "trl.yaml"}
_HF_OPTIM = {"adamw": "adamw_torch_fused", "adamw_8bit": "adamw_bnb_8bit", "paged_adamw_8bit": "paged_adamw_8bit",
             "sgd": "sgd"}
_TT_OPTIM = {"adamw": "torch.optim.AdamW", "adamw_8bit": "bitsandbytes.optim.AdamW8bit",
             "paged_adamw_8bit": "bitsandbytes.optim.PagedAdamW8bit", "sgd": "torch.optim.SGD"}
_HF_ATTN = {"flash": "flash_attention_2", "sdpa": "sdpa", "eager": "eager"}
_TT_ATTN = ("q_proj", "k_proj", "v_proj", "output_proj")
_TT_NAMES = {"o_proj": "output_proj", "gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def _hf_id(scn: Scenario) -> str:
    preset = catalog.resolve_model_name(scn.model_ref)
    return str(catalog.model_index()[preset].get("hf_id") or preset) if preset else scn.model_ref


def _targets(scn: Scenario) -> str | list[str]:
    t = scn.mix.lora_targets
    return t if isinstance(t, str) else list(t)


def _drop(cfg: dict[str, Any], *keys: str) -> None:
    for key in keys:
        cfg.pop(key, None)


def _hf_parallel(scn: Scenario, cfg: dict[str, Any]) -> None:
    """TrainingArguments' deepspeed / fsdp keys (TRL, LLaMA-Factory)."""
    mix = scn.mix
    _drop(cfg, "deepspeed", "fsdp", "fsdp_config")
    if mix.zero_stage:
        cfg["deepspeed"] = "ds_config.json"
    elif mix.fsdp:
        cfg["fsdp"] = f"{mix.fsdp} auto_wrap" + (" offload" if mix.offload == "optimizer+params" else "")
        cfg["fsdp_config"] = {"fsdp_version": 2, "reshard_after_forward": mix.fsdp == "full_shard"}


def axolotl_config(scn: Scenario, micro: int, base: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    mix, wl = scn.mix, scn.workload
    cfg = dict(base) or {"base_model": _hf_id(scn)}
    _drop(cfg, "flash_attention", "sdp_attention", "eager_attention", "xformers_attention", "flex_attention",
          "deepspeed", "fsdp", "fsdp_config", "load_in_8bit", "lora_target_modules", "lora_target_linear")
    if mix.method == "full":
        _drop(cfg, "adapter", "lora_r", "lora_alpha", "lora_dropout", "load_in_4bit")
    else:
        cfg.update(adapter=mix.method, load_in_4bit=mix.method == "qlora", lora_r=mix.lora_rank,
                   lora_alpha=cfg.get("lora_alpha", 2 * mix.lora_rank), lora_dropout=mix.lora_dropout)
        kwargs = dict(cfg.get("bnb_config_kwargs") or {})
        # Axolotl's loader turns double quantization on itself; bnb_config_kwargs overrides it
        if mix.method == "qlora" and (not mix.nested_quant or "bnb_4bit_use_double_quant" in kwargs):
            cfg["bnb_config_kwargs"] = {**kwargs, "bnb_4bit_use_double_quant": mix.nested_quant}
        targets = _targets(scn)
        cfg.update({"lora_target_linear": True} if targets == "all-linear" else {"lora_target_modules": targets})
    cfg.update(sequence_len=wl.seq_len, sample_packing=wl.padding == "packed",
               pad_to_sequence_len=wl.padding in ("packed", "max_length"), micro_batch_size=micro,
               gradient_accumulation_steps=wl.gradient_accumulation, num_epochs=wl.epochs,
               optimizer=_keep_optimizer(cfg.get("optimizer"), mix.optimizer, _HF_OPTIM),
               bf16=mix.precision.startswith("bf16"), fp16=mix.precision.startswith("fp16"),
               gradient_checkpointing=mix.gradient_checkpointing, attn_implementation=_HF_ATTN[mix.attention])
    if mix.zero_stage:
        cfg["deepspeed"] = "ds_config.json"
    elif mix.fsdp:
        cfg.update(fsdp_version=2, fsdp_config={"reshard_after_forward": mix.fsdp == "full_shard",
                                                "offload_params": mix.offload == "optimizer+params",
                                                "auto_wrap_policy": "TRANSFORMER_BASED_WRAP"})
    if mix.precision == "bf16":
        notes.append("precision bf16 (pure) is written as bf16 mixed precision: Axolotl keeps trainable weights in fp32")
    return cfg


def llama_factory_config(scn: Scenario, micro: int, base: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    mix, wl = scn.mix, scn.workload
    cfg = dict(base) or {"model_name_or_path": _hf_id(scn), "stage": "sft", "do_train": True}
    _drop(cfg, "quantization_bit", "quantization_method", "double_quantization", "pure_bf16", "bf16", "fp16")
    cfg["finetuning_type"] = "full" if mix.method == "full" else "lora"
    if mix.method == "qlora":
        cfg.update(quantization_bit=4, quantization_method="bnb", double_quantization=mix.nested_quant)
    if mix.trains_lora:
        targets = _targets(scn)
        cfg.update(lora_rank=mix.lora_rank, lora_dropout=mix.lora_dropout,
                   lora_target="all" if targets == "all-linear" else ",".join(targets))
    cfg.update(cutoff_len=wl.seq_len, packing=wl.padding == "packed", per_device_train_batch_size=micro,
               gradient_accumulation_steps=wl.gradient_accumulation, num_train_epochs=wl.epochs,
               optim=_keep_optimizer(cfg.get("optim"), mix.optimizer, _HF_OPTIM),
               flash_attn={"flash": "fa2", "sdpa": "sdpa", "eager": "disabled"}[mix.attention],
               disable_gradient_checkpointing=not mix.gradient_checkpointing)
    cfg.update({"bf16-mixed": {"bf16": True}, "bf16": {"bf16": True, "pure_bf16": True},
                "fp16-mixed": {"fp16": True}, "fp32": {}}[mix.precision])
    _hf_parallel(scn, cfg)
    return cfg


def torchtune_config(scn: Scenario, micro: int, base: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    mix, wl = scn.mix, scn.workload
    cfg = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in base.items()}
    old = str((cfg.get("model") or {}).get("_component_", ""))
    builder = old.rsplit(".", 1)[-1].removeprefix("qlora_").removeprefix("lora_") if old else None
    builder = builder or torchtune_builder(catalog.resolve_model_name(scn.model_ref) or scn.model_ref)
    if not builder:
        raise FtscopeError(f"torchtune has no model builder for {scn.model.name}: --emit-format torchtune needs a "
                           "torchtune config as input, or a Llama / Qwen2.5 / Mistral / Gemma 2 preset")
    family = torchtune_family(builder) or builder.split("_")[0]
    prefix = {"full": "", "lora": "lora_", "qlora": "qlora_"}[mix.method]
    model: dict[str, Any] = {"_component_": f"torchtune.models.{family}.{prefix}{builder}"}
    if mix.trains_lora:
        targets = scn.model.lora_targets(mix.lora_targets)
        names = {_TT_NAMES.get(n, n) for lin, _ in targets for n in lin.names}
        model.update(lora_attn_modules=[n for n in _TT_ATTN if n in names],
                     apply_lora_to_mlp=bool(names & {"w1", "w2", "w3"}), apply_lora_to_output=False,
                     lora_rank=mix.lora_rank, lora_alpha=2 * mix.lora_rank, lora_dropout=mix.lora_dropout)
    cfg["model"] = model
    tokenizer = dict(cfg.get("tokenizer") or {})
    tokenizer["max_seq_len"] = wl.seq_len
    dataset = dict(cfg.get("dataset") or {}) if not isinstance(cfg.get("dataset"), list) else {}
    dataset["packed"] = wl.padding == "packed"
    opt = dict(cfg.get("optimizer") or {})
    opt["_component_"] = _keep_optimizer(opt.get("_component_"), mix.optimizer, _TT_OPTIM)
    cfg.update(tokenizer=tokenizer, dataset=dataset, batch_size=micro, gradient_accumulation_steps=wl.gradient_accumulation,
               epochs=wl.epochs, optimizer=opt, dtype="fp32" if mix.precision == "fp32" else "bf16",
               enable_activation_checkpointing=mix.gradient_checkpointing,
               loss={"_component_": "torchtune.modules.loss.LinearCrossEntropyLoss" if mix.loss == "chunked"
                     else "torch.nn.CrossEntropyLoss"})
    if mix.precision in ("bf16-mixed", "fp16-mixed"):
        notes.append(f"precision {mix.precision}: torchtune has no mixed precision; written as dtype bf16")
    if mix.zero_stage:
        notes.append(f"torchtune has no DeepSpeed: ZeRO-{mix.zero_stage} written as FSDP")
    if mix.method == "qlora" and not mix.nested_quant:
        notes.append("nested_quant false: torchtune's torchao NF4 always quantizes its scalers (0.516 B per 4-bit "
                     "weight, 0.05 B fewer than estimated)")
    if scn.cluster.world_size > 1 or mix.shard_stage:
        cfg.update(fsdp_reshard_after_forward=mix.shard_stage == 3, fsdp_cpu_offload=mix.offload == "optimizer+params")
    return cfg


def trl_config(scn: Scenario, micro: int, base: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    mix, wl = scn.mix, scn.workload
    cfg = {k: v for k, v in base.items() if not k.startswith("_")} or {"model_name_or_path": _hf_id(scn)}
    _drop(cfg, "load_in_8bit", "lora_target_modules")
    cfg.update(dtype="bfloat16" if mix.precision != "fp32" else "float32", attn_implementation=_HF_ATTN[mix.attention],
               use_peft=mix.trains_lora, load_in_4bit=mix.method == "qlora")
    if mix.trains_lora:
        cfg.update(lora_r=mix.lora_rank, lora_alpha=cfg.get("lora_alpha", 2 * mix.lora_rank),
                   lora_dropout=mix.lora_dropout, lora_target_modules=_targets(scn))
    if mix.method == "qlora":
        cfg["use_bnb_nested_quant"] = mix.nested_quant
    cfg.update(max_length=wl.seq_len, packing=wl.padding == "packed", per_device_train_batch_size=micro,
               gradient_accumulation_steps=wl.gradient_accumulation, num_train_epochs=wl.epochs,
               gradient_checkpointing=mix.gradient_checkpointing, bf16=mix.precision.startswith("bf16"),
               fp16=mix.precision.startswith("fp16"), optim=_keep_optimizer(cfg.get("optim"), mix.optimizer, _HF_OPTIM))
    _hf_parallel(scn, cfg)
    return cfg


def _keep_optimizer(old: Any, new: str, names: Mapping[str, str]) -> str:
    """The user's own optimizer name when it means the recommended one (adamw_torch stays adamw_torch)."""
    return str(old) if old is not None and known_optimizer(old) == new else names[new]


WRITERS: dict[str, Callable[[Scenario, int, dict[str, Any], list[str]], dict[str, Any]]] = {
    "axolotl": axolotl_config, "llama-factory": llama_factory_config, "torchtune": torchtune_config, "trl": trl_config}
_LAUNCH = {"axolotl": "axolotl train axolotl.yml", "llama-factory": "llamafactory-cli train llama-factory.yaml",
           "torchtune": "tune run {recipe} --config torchtune.yaml", "trl": "trl sft --config trl.yaml"}


def emit_framework(scn: Scenario, micro: int, out_dir: str | Path, fmt: str, base: Mapping[str, Any] | None = None,
                   label: list[str] | None = None, deepspeed: bool | None = None) -> Path:
    """Write the scenario as a `fmt` config in out_dir (over `base`, the user's own config of that format), its
    header saying what it holds (`label`, plan/emit.py's lines) and how to launch it. `deepspeed` runs a mix
    without sharding under DeepSpeed ZeRO-0 (the ds_config.json beside it) where the framework has DeepSpeed."""
    notes: list[str] = []
    cfg = WRITERS[fmt](scn, micro, dict(base or {}), notes)
    if deepspeed and not scn.mix.zero_stage:
        if fmt == "torchtune":
            notes.append("torchtune has no DeepSpeed: ZeRO-0 written as plain data parallelism")
        else:
            cfg["deepspeed"] = "ds_config.json"
    n = scn.cluster.world_size
    recipe = ("lora_finetune" if scn.mix.trains_lora else "full_finetune") + ("_distributed" if n > 1 else "_single_device")
    launch = _LAUNCH[fmt].format(recipe=(f"--nproc_per_node {n} " if n > 1 else "") + recipe)
    header = list(label or label_lines(scn, micro, deepspeed=deepspeed))
    header += [f"Launch: {launch}" + (f" on {n} GPUs" if n > 1 and fmt != "torchtune" else "")]
    header += [f"Note: {line}" for line in notes]
    path = Path(out_dir) / FILES[fmt]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(commented(header, yaml.safe_dump(cfg, sort_keys=False)))
    return path


def emit_with_framework(rec: Recommendation, out_dir: str | Path, fmt: str | None,
                        base: Mapping[str, Any] | None = None) -> list[Path]:
    """recommend --emit: plan/emit.py's launch files and, with a framework format, the winner as a `fmt` config
    beside them and the best DeepSpeed alternative's under out_dir/deepspeed (torchtune has no DeepSpeed)."""
    def also(scn: Scenario, micro: int, out: Path, label: list[str], deepspeed: bool) -> Path | None:
        if fmt is None or (fmt == "torchtune" and out != Path(out_dir)):
            return None
        return emit_framework(scn, micro, out, fmt, base, label, deepspeed)

    return emit_recommendation(rec, out_dir, also)
