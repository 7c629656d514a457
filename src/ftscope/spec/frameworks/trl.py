"""TRL: an SFTConfig / TrainingArguments JSON, a `trl sft --config` YAML, or a file holding the command line
(`python trl/scripts/sft.py --model_name_or_path ... --use_peft ...`, `trl sft ...`, `accelerate launch ...`)."""
from __future__ import annotations

import shlex
from typing import Any

import yaml

from ... import catalog
from .base import FrameworkConfig, Keys, attention, dataset_lengths, is_set, key_table, listed, model, nested_quant
from .hf_args import read_training_args

SFT_KEYS = {"max_length", "max_seq_length", "packing", "padding_free", "dataset_text_field", "completion_only_loss",
            "assistant_only_loss", "loss_type", "activation_offloading", "packing_strategy", "dataset_name"}
"""Keys of SFTConfig and of TRL's script arguments that a plain TrainingArguments file does not have."""
MODEL_KEYS = {"model_name_or_path", "use_peft", "lora_r", "load_in_4bit", "dtype", "attn_implementation"}

# PEFT's target_modules when none are given (peft/utils/constants.py, v0.21.2): the attention's query and value
# projections for most models; others have no default and PEFT refuses to run
PEFT_DEFAULT_TARGETS = {"llama": ["q_proj", "v_proj"], "mistral": ["q_proj", "v_proj"], "mixtral": ["q_proj", "v_proj"],
                        "qwen2": ["q_proj", "v_proj"], "qwen3": ["q_proj", "v_proj"], "gemma": ["q_proj", "v_proj"],
                        "gemma2": ["q_proj", "v_proj"], "phi": ["q_proj", "v_proj", "fc1", "fc2"],
                        "falcon": ["query_key_value"], "gpt2": ["c_attn"]}


def parse_command(text: str) -> dict[str, Any]:
    """The `--key value` flags of a TRL command line as a mapping (a bare flag is true; repeated values a list).
    The launcher's own flags (accelerate launch --num_processes 8) are kept under `_launcher`."""
    tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    script = next((i for i, t in enumerate(tokens) if t.endswith(".py") or t == "sft"), None)
    launcher = tokens[:script] if script is not None else []
    args = tokens[script + 1:] if script is not None else tokens
    out: dict[str, Any] = _flags(args)
    out["_launcher"] = _flags(launcher)
    out["_script"] = tokens[script] if script is not None else ""
    return out


def _flags(tokens: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    key = None
    for tok in tokens:
        if tok.startswith("--"):
            key, _, value = tok[2:].partition("=")
            key = key.replace("-", "_")
            out[key] = _scalar(value) if value else True
            if value:
                key = None
        elif key is not None:
            prev = out[key]
            out[key] = _scalar(tok) if prev is True else (prev if isinstance(prev, list) else [prev]) + [_scalar(tok)]
    return out


def _scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def read(data: dict[str, Any], cfg: FrameworkConfig) -> None:
    """Map TRL / Trainer arguments to the scenario."""
    launcher = data.pop("_launcher", {}) or {}
    script = str(data.pop("_script", "") or "")
    sft = "sft" in script or bool(SFT_KEYS & set(data)) or bool(MODEL_KEYS & set(data))
    cfg.scenario["framework"] = "trl-sft" if sft else "hf-trainer"
    keys = Keys(data, key_table("hf-training-args", "trl"), cfg)
    if is_set(launcher.get("num_processes")):
        cfg.set("hardware.gpus_per_node", int(launcher["num_processes"]))
    if keys.get("model_name_or_path"):
        model(keys.get("model_name_or_path"), "model_name_or_path", cfg)
    elif not MODEL_KEYS & set(data):
        cfg.notes.append("a TrainingArguments / SFTConfig file names no model and no adapter (LoraConfig is passed to the "
                         "trainer apart): add model=..., and mix.method=lora for LoRA")
    read_training_args(keys, cfg, checkpointing=sft, bf16=sft)
    _method(keys, cfg)
    attn = keys.get("attn_implementation")
    cfg.set("mix.attention", attention(attn, "attn_implementation", cfg) if attn else "sdpa")
    length = keys.get("max_length", keys.get("max_seq_length", 1024 if sft else None))
    if length is not None:
        cfg.set("workload.seq_len", int(length))
    if keys.get("packing", False):
        cfg.set("workload.padding", "packed")
    if keys.get("padding_free", False):
        cfg.unmapped.append("padding_free=true (a padding-free batch is B samples back to back: counted as B padded "
                            "sequences of max_length)")
    if keys.get("dataset_name"):
        dataset_lengths(cfg, "dataset_name", keys.get("dataset_name"), "max_length")
    cfg.unmapped += keys.unmapped()


def _method(keys: Keys, cfg: FrameworkConfig) -> None:
    peft = bool(keys.get("use_peft", False))
    four = bool(keys.get("load_in_4bit", False))
    if four and not peft:
        raise cfg.fail("load_in_4bit", "a 4-bit base trains only through adapters: add --use_peft")
    cfg.set("mix.method", "qlora" if four else ("lora" if peft else "full"))
    dtype = keys.get("dtype", keys.get("torch_dtype", "float32" if cfg.scenario["framework"] == "trl-sft" else None))
    if dtype is not None and str(dtype) in ("float32", "fp32") and peft:
        cfg.unmapped.append("dtype=float32 (TRL's command-line default: the frozen base and every non-4-bit weight load "
                            "in fp32; ftscope counts the bf16 base SFTTrainer loads from Python; add --dtype bfloat16 "
                            "to run what is estimated)")
    if not peft:
        return
    cfg.set("mix.lora_rank", int(keys.get("lora_r", 16)))
    cfg.set("mix.lora_dropout", float(keys.get("lora_dropout", 0.05)))
    targets = keys.get("lora_target_modules")
    if targets is None:
        targets = _peft_default_targets(cfg)
    elif targets in ("all-linear", ["all-linear"]):
        targets = "all-linear"
    cfg.set("mix.lora_targets", targets if isinstance(targets, str) else listed(targets))
    nested = keys.get("use_bnb_nested_quant", False)  # ModelConfig's default: fp32 absmax scales
    if four:
        nested_quant(nested, "use_bnb_nested_quant", cfg)


def _peft_default_targets(cfg: FrameworkConfig) -> list[str]:
    model = cfg.scenario.get("model")
    preset = catalog.resolve_model_name(str(model)) if model else None
    model_type = catalog.model_config(preset).get("model_type") if preset else None
    if model_type in PEFT_DEFAULT_TARGETS:
        cfg.notes.append(f"lora_target_modules not set: PEFT's default for {model_type}, {PEFT_DEFAULT_TARGETS[model_type]}")
        return PEFT_DEFAULT_TARGETS[model_type]
    raise cfg.fail("lora_target_modules", f"not set, and PEFT has no default target modules for {model or 'this model'} "
                   "known to ftscope: name them (--lora_target_modules all-linear)")
