"""A training run's own settings as an ftscope scenario: the model as built, its TrainingArguments (or a Lightning
run's settings under the same names), its PEFT LoRA config and quantization, at the batch shape a step ran.

`RunConfig` holds plain values only (the callbacks read them off the live run, see model_facts.py), so the mapping
needs no torch and the results store keeps it as JSON. TrainingArguments keys go through the same reader as a TRL /
Trainer config file (spec/frameworks/hf_args.py): batch, accumulation, checkpointing, precision flags, optimizer,
DeepSpeed and FSDP. What the live run says overrides what its arguments say: checkpointing switched on on the model,
the dtype the weights were loaded in, the modules PEFT actually wrapped.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import FtscopeError
from ..spec.frameworks.base import FrameworkConfig, Keys, attention, is_set, key_table
from ..spec.frameworks.hf_args import read_training_args
from ..spec.resolve import model_from_config
from ..spec.scenario import Scenario, scenario_from_dict

HALF = ("bfloat16", "float16")


@dataclass
class RunConfig:
    """What a training run is, as plain values (read off the live run by model_facts.py)."""

    model_config: dict[str, Any]
    """The HF config of the model as built (`model.config.to_dict()`)."""
    model_name: str
    """Its `_name_or_path`, or its model_type."""
    training_args: dict[str, Any]
    """TrainingArguments keys (`TrainingArguments.to_dict()`; a Lightning run's settings under the same names)."""
    framework: str = "hf-trainer"
    """The ftscope recipe of the training loop: hf-trainer, or trl-sft for TRL's SFTTrainer."""
    lora: dict[str, Any] | None = None
    """PEFT LoRA settings (lora_settings): r, targets, lora_dropout, use_dora, modules_to_save."""
    quantization: str | None = None
    """'4bit' (a bitsandbytes 4-bit base), '8bit', or None."""
    trainable_dtype: str | None = None
    """dtype of the trainable parameters (float32, bfloat16, ...); None when it is mixed or unknown."""
    frozen_dtype: str | None = None
    """dtype of the frozen floating-point parameters (LoRA's base), None without any."""
    hand_frozen: bool = False
    """Some parameters were frozen without PEFT (counted as full fine-tuning: listed)."""
    gradient_checkpointing: bool = False
    """Checkpointing is on in the model (`model.is_gradient_checkpointing`), whoever switched it on."""
    attention: str | None = None
    """The model's attention implementation (config._attn_implementation)."""
    experts_implementation: str | None = None
    """transformers 5's experts implementation of an MoE model (config._experts_implementation)."""
    gpu: str | None = None
    """Catalog key of the GPU the run is on; None on CPU (the estimate then assumes the default GPU)."""
    world_size: int = 1
    gpus_per_node: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def lora_settings(peft_config: Any, targeted: list[str] | None = None) -> dict[str, Any]:
    """A PEFT config as plain LoRA settings; `targeted`: the dotted names of the modules PEFT wrapped (what a
    regex or `all-linear` selected), read as their leaf names. Other PEFT methods are a one-line FtscopeError."""
    kind = getattr(getattr(peft_config, "peft_type", None), "value", getattr(peft_config, "peft_type", None))
    if str(kind).upper() != "LORA":
        raise FtscopeError(f"PEFT method {kind} is not modelled (ftscope knows LoRA and QLoRA)")
    if targeted:
        targets: str | list[str] = sorted({name.rsplit(".", 1)[-1] for name in targeted})
    else:
        given = getattr(peft_config, "target_modules", None)
        if given == "all-linear" or isinstance(given, (list, tuple, set, frozenset)):
            targets = given if isinstance(given, str) else sorted(given)
        else:
            raise FtscopeError(f"LoRA target_modules {given!r}: pass the model PEFT wrapped to read what it selected")
    saved = getattr(peft_config, "modules_to_save", None)
    return {"r": int(peft_config.r), "targets": targets, "lora_dropout": float(peft_config.lora_dropout or 0.0),
            "use_dora": bool(getattr(peft_config, "use_dora", False)), "modules_to_save": sorted(saved or ())}


def precision(run: RunConfig) -> tuple[str, list[str]]:
    """mix.precision from the weights' dtypes and the autocast flags, with a note where they disagree: trainable
    weights in bf16 train in pure bf16 whatever the flags say; otherwise bf16 / fp16 autocast is mixed precision."""
    bf16, fp16 = is_set(run.training_args.get("bf16")), is_set(run.training_args.get("fp16"))
    if run.trainable_dtype in HALF:
        notes = [] if run.trainable_dtype == "bfloat16" else ["fp16 weights trained in pure fp16: counted as pure bf16"]
        return "bf16", notes
    if bf16 or fp16:
        return ("bf16-mixed" if bf16 else "fp16-mixed"), []
    if run.frozen_dtype in HALF:
        return "bf16-mixed", [f"{run.frozen_dtype} base with fp32 adapters and no autocast: counted as bf16-mixed"]
    return "fp32", []


def _method(run: RunConfig, cfg: FrameworkConfig) -> None:
    if run.quantization == "8bit":
        raise FtscopeError("an 8-bit (LLM.int8) base is not modelled (ftscope models a bf16 base or bitsandbytes NF4)")
    if run.lora is None:
        if run.quantization:
            raise FtscopeError("a 4-bit base trains only through adapters, and this model has no PEFT LoRA")
        cfg.set("mix.method", "full")
        if run.hand_frozen:
            cfg.notes.append("some parameters are frozen without PEFT: counted as full fine-tuning")
        return
    lora = run.lora
    if lora.get("use_dora"):
        raise FtscopeError("DoRA adapters are not modelled")
    cfg.set("mix.method", "qlora" if run.quantization == "4bit" else "lora")
    if run.quantization == "4bit":
        _nested_quant(run, cfg)
    cfg.set("mix.lora_rank", int(lora["r"]))
    cfg.set("mix.lora_targets", lora["targets"])
    cfg.set("mix.lora_dropout", float(lora.get("lora_dropout") or 0.0))
    if lora.get("modules_to_save"):
        cfg.notes.append(f"modules_to_save {', '.join(lora['modules_to_save'])}: fully trained copies, not counted")


def _nested_quant(run: RunConfig, cfg: FrameworkConfig) -> None:
    """mix.nested_quant from the BitsAndBytesConfig the model was loaded with (`quantization_config` in its config
    dict; transformers' default False); a base quantized some other way keeps the recipe's default."""
    quant = run.model_config.get("quantization_config")
    if isinstance(quant, Mapping) and isinstance(quant.get("bnb_4bit_use_double_quant"), bool):
        cfg.set("mix.nested_quant", quant["bnb_4bit_use_double_quant"])


def scenario_mapping(run: RunConfig, batch: int, seq_len: int, micro_batches: int) -> tuple[dict[str, Any], list[str]]:
    """The scenario mapping of the run at one step's shape (micro-batch, padded length, micro-batches per
    optimizer step), and what the mapping assumed or could not map."""
    args = {k: v for k, v in run.training_args.items() if not k.startswith("_")}
    cfg = FrameworkConfig("trl", Path("TrainingArguments"), args, scenario={"framework": run.framework})
    table = key_table("hf-training-args", "trl") if run.framework.startswith("trl") else key_table("hf-training-args")
    keys = Keys(args, table, cfg)
    read_training_args(keys, cfg, checkpointing=False, bf16=False)
    _method(run, cfg)
    cfg.set("mix.gradient_checkpointing", bool(run.gradient_checkpointing))
    mix_precision, notes = precision(run)
    cfg.set("mix.precision", mix_precision)
    cfg.notes += notes
    if run.attention:
        cfg.set("mix.attention", attention(run.attention, "attn_implementation", cfg))
    if run.experts_implementation in ("eager", "batched_mm", "grouped_mm"):
        cfg.set("mix.experts_backend", run.experts_implementation)
    if run.gpu:
        cfg.set("hardware.gpu", run.gpu)
    else:
        cfg.notes.append("no CUDA device: memory is compared as tensor bytes; the estimate assumes its default GPU")
    per_node = max(1, min(run.gpus_per_node, run.world_size))
    cfg.set("hardware.gpus_per_node", per_node)
    cfg.set("hardware.nodes", max(1, run.world_size // per_node))
    cfg.set("workload.micro_batch_size", int(batch))
    cfg.set("workload.seq_len", int(seq_len))
    cfg.set("workload.padding", "max_length")  # the step's own padded length
    cfg.set("workload.gradient_accumulation", int(micro_batches))
    cfg.scenario["model"] = run.model_name
    return cfg.scenario, cfg.notes + cfg.unmapped + keys.unmapped()


def run_scenario(run: RunConfig, batch: int, seq_len: int, micro_batches: int) -> Scenario:
    """The checked scenario of the run at one step's shape, its model from the config as built."""
    mapping, _ = scenario_mapping(run, batch, seq_len, micro_batches)
    model = model_from_config(run.model_config, name=f"{run.model_name} (as built)")
    return scenario_from_dict(mapping, model=model)


def model_name(config: Mapping[str, Any]) -> str:
    """How a run names its model: the checkpoint it was loaded from, else its architecture."""
    return str(config.get("_name_or_path") or config.get("model_type") or "model")[:200] or "model"


__all__ = ["RunConfig", "lora_settings", "precision", "scenario_mapping", "run_scenario", "model_name"]
