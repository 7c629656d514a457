"""What every framework-config reader shares: the mapped result, a key tracker that never drops a key silently,
and the values frameworks name alike (optimizers, attention kernels, precision flags, DeepSpeed and FSDP settings)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping

from ... import catalog
from ...errors import FtscopeError
from .models import model_ref, prequantized

FORMATS = ("axolotl", "llama-factory", "torchtune", "trl")


@dataclass
class FrameworkConfig:
    """A fine-tuning framework's own config file, read as an ftscope scenario."""

    format: str
    """axolotl | llama-factory | torchtune | trl."""
    path: Path
    original: dict[str, Any]
    """The file as parsed (a TRL argument file: its flags as a mapping)."""
    scenario: dict[str, Any] = field(default_factory=dict)
    """The ftscope scenario mapping it maps to (`framework:` set)."""
    unmapped: list[str] = field(default_factory=list)
    """'key (why)' for every key that may change memory or time and is not mapped."""
    notes: list[str] = field(default_factory=list)
    """What the mapping assumed (a preset for a model id, a ZeRO stage read from a file name, ...)."""
    multi_gpu_mix: dict[str, Any] = field(default_factory=dict)
    """mix keys the framework sets only when it runs on more than one GPU (torchtune's distributed recipes shard
    with FSDP); applied when the scenario, overrides included, has more than one GPU and sets none of them."""

    def set(self, dotted: str, value: Any) -> None:
        """Set a scenario key by its dotted path (mix.lora_rank)."""
        node = self.scenario
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    def fail(self, key: str, why: str) -> FtscopeError:
        return FtscopeError(f"{self.format} config {self.path.name}: {key}: {why}")


@dataclass(frozen=True)
class KeyTable:
    """Per format: the keys that do not change training memory or time, those that do but are not modelled, and
    those whose feature ftscope cannot express at all (an error when set)."""

    no_effect: frozenset[str]
    no_effect_prefixes: tuple[str, ...]
    not_modelled: Mapping[str, str]
    unsupported: Mapping[str, str]

    def ignorable(self, key: str) -> bool:
        return key in self.no_effect or key.startswith(self.no_effect_prefixes)


@lru_cache(maxsize=None)
def key_table(*sections: str) -> KeyTable:
    """The merged key table of the named sections of catalog/framework_keys.yaml."""
    data = catalog.framework_keys()
    names: set[str] = set()
    prefixes: list[str] = []
    not_modelled: dict[str, str] = {}
    unsupported: dict[str, str] = {}
    for name in sections:
        sec = data[name]
        for key in sec.get("no_effect") or ():
            (prefixes.append(key[:-1]) if key.endswith("*") else names.add(key))
        not_modelled.update(sec.get("not_modelled") or {})
        unsupported.update(sec.get("unsupported") or {})
    return KeyTable(frozenset(names), tuple(prefixes), not_modelled, unsupported)


def is_set(value: Any) -> bool:
    """A value that turns something on: not None, false, zero, empty or 'none'."""
    if value is None or value is False or value == 0 or (isinstance(value, str) and value.strip().lower() in ("", "none", "null", "false", "no")):
        return False
    return not (isinstance(value, (list, tuple, dict)) and not value)


class Keys:
    """A config's top-level keys. Every key ends up read, known not to matter, or listed: never dropped silently."""

    def __init__(self, data: Mapping[str, Any], table: KeyTable, cfg: FrameworkConfig):
        self.data, self.table, self.cfg = data, table, cfg
        self.read: set[str] = set()
        for key, why in table.unsupported.items():
            value = data.get(key)
            # a parallel degree of 1 is no parallelism
            if is_set(value) and not (isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 1):
                raise cfg.fail(key, f"{why} (ftscope cannot express it)")

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        value = self.data.get(key)
        return default if value is None else value

    def __contains__(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def unmapped(self) -> list[str]:
        """'key=value (why)' for each key that was not read, is set, and is not known to leave memory and time alone."""
        out = []
        for key, value in self.data.items():
            if key in self.read or self.table.ignorable(key) or not is_set(value):
                continue
            why = self.table.not_modelled.get(key, "not read by ftscope")
            out.append(f"{key}={_short(value)} ({why})")
        return out


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


# ---- values several frameworks share --------------------------------------------------------------------------

_OPTIMIZERS = {
    "adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw", "adamw": "adamw", "adam": "adamw",
    "adamw_apex_fused": "adamw", "adamw_torch_npu_fused": "adamw", "adamw_torch_xla": "adamw",
    "adamw_bnb_8bit": "adamw_8bit", "adamw_8bit": "adamw_8bit", "ao_adamw_8bit": "adamw_8bit",
    "paged_adamw_8bit": "paged_adamw_8bit", "sgd": "sgd",
    # torchtune names the optimizer class
    "torch.optim.adamw": "adamw", "torch.optim.adam": "adamw", "torch.optim.sgd": "sgd",
    "bitsandbytes.optim.adamw8bit": "adamw_8bit", "bitsandbytes.optim.pagedadamw8bit": "paged_adamw_8bit",
    "torchao.optim.adamw8bit": "adamw_8bit", "torchao.prototype.low_bit_optim.adamw8bit": "adamw_8bit",
}
_PAGED_32BIT = ("paged_adamw_32bit", "paged_adamw", "bitsandbytes.optim.pagedadamw", "bitsandbytes.optim.pagedadamw32bit")


def known_optimizer(name: Any) -> str | None:
    """The mix.optimizer a framework's optimizer name means exactly, else None."""
    return _OPTIMIZERS.get(str(name).strip().lower())


def optimizer(name: Any, key: str, cfg: FrameworkConfig) -> str:
    """The mix.optimizer for a framework's optimizer name; an optimizer ftscope has no state model for is an error."""
    low = str(name).strip().lower()
    if low in _OPTIMIZERS:
        return _OPTIMIZERS[low]
    if low in _PAGED_32BIT:
        cfg.unmapped.append(f"{key}={name} (paged 32-bit AdamW: counted as adamw, states on the GPU; bitsandbytes pages "
                            "them to CPU RAM only under memory pressure)")
        return "adamw"
    raise cfg.fail(key, f"optimizer {name} is not modelled (ftscope knows AdamW, 8-bit AdamW, paged 8-bit AdamW and SGD)")


_ATTENTION = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash", "flash_attention_3": "flash",
              "fa2": "flash", "fa3": "flash", "flash": "flash", "disabled": "eager", "auto": "sdpa"}


def attention(name: Any, key: str, cfg: FrameworkConfig) -> str:
    """The mix.attention for an attn_implementation-style value."""
    low = str(name).strip().lower()
    if low in _ATTENTION:
        return _ATTENTION[low]
    if "flash" in low:  # kernels-community/flash-attn2, kernels-community/vllm-flash-attn3
        return "flash"
    if low in ("flex_attention", "xformers", "sage", "sage_attention"):
        cfg.unmapped.append(f"{key}={name} (a memory-efficient kernel that keeps no score matrix: counted as sdpa)")
        return "sdpa"
    raise cfg.fail(key, f"attention {name} is not modelled (eager, sdpa or flash attention)")


def precision(bf16: Any, fp16: Any, pure_bf16: bool = False) -> str:
    """mix.precision from a Trainer's bf16 / fp16 flags (neither: fp32, the Trainer's default)."""
    if pure_bf16:
        return "bf16"
    if is_set(bf16) and str(bf16).lower() != "false":
        return "bf16-mixed"
    if is_set(fp16):
        return "fp16-mixed"
    return "fp32"


def deepspeed(value: Any, key: str, cfg: FrameworkConfig) -> None:
    """mix.zero_stage and mix.offload from a DeepSpeed config (a mapping, or a JSON path read beside the config or
    from the working directory; when the file is not there, from its name: ds_z3_offload_config.json)."""
    data = value if isinstance(value, Mapping) else None
    if data is None:
        for base in (cfg.path.parent, Path.cwd()):
            candidate = base / str(value)
            if candidate.is_file():
                try:
                    data = json.loads(candidate.read_text())
                except (OSError, json.JSONDecodeError):
                    raise cfg.fail(key, f"{candidate} is not a DeepSpeed JSON file") from None
                break
    if data is not None:
        zero = data.get("zero_optimization") or {}
        stage = int(zero.get("stage", 0))
        params = str((zero.get("offload_param") or {}).get("device", "none")) in ("cpu", "nvme")
        opt = str((zero.get("offload_optimizer") or {}).get("device", "none")) in ("cpu", "nvme")
    else:
        name = Path(str(value)).name.lower()
        found = re.search(r"(?:zero|_z)_?([0-3])", name)
        if not found:
            cfg.unmapped.append(f"{key}={value} (file not found and its name gives no ZeRO stage: set mix.zero_stage)")
            return
        # the usual files (LLaMA-Factory's ds_z3_offload_config, Axolotl's zero3_bf16_cpuoffload_all) offload
        # the optimizer, and at stage 3 the parameters as well
        stage, opt = int(found.group(1)), "offload" in name
        params = opt and stage == 3
        cfg.notes.append(f"{key}: {value} not found here; ZeRO stage {stage}{' with CPU offload' if opt else ''} "
                         "read from its name")
    cfg.set("mix.zero_stage", stage)
    cfg.set("mix.offload", "optimizer+params" if params and stage == 3 else ("optimizer" if opt or params else "none"))


def fsdp(value: Any, options: Mapping[str, Any] | None, key: str, cfg: FrameworkConfig) -> None:
    """mix.fsdp and mix.offload from HF Trainer's `fsdp` (a string or list: full_shard, shard_grad_op, offload,
    auto_wrap) and its fsdp_config (with or without the fsdp_ prefix)."""
    words = " ".join(value) if isinstance(value, (list, tuple)) else str(value)
    opts = {str(k).removeprefix("fsdp_"): v for k, v in (options or {}).items()}
    strategy = str(opts.get("sharding_strategy", "")).lower()
    if "shard_grad_op" in words.lower() or strategy == "shard_grad_op" or opts.get("reshard_after_forward") is False:
        mode = "shard_grad_op"
    elif "no_shard" in words.lower() or strategy == "no_shard":
        raise cfg.fail(key, "FSDP NO_SHARD is plain data parallelism: drop fsdp and run DDP instead")
    else:
        mode = "full_shard"
        if "hybrid" in words.lower() or "hybrid" in strategy:
            cfg.notes.append(f"{key}: hybrid sharding counted as full_shard over every GPU")
    cfg.set("mix.fsdp", mode)
    offload = "offload" in words.lower() or is_set(opts.get("offload_params"))
    if offload:
        cfg.set("mix.offload", "optimizer+params")


def model(name: Any, key: str, cfg: FrameworkConfig) -> None:
    """Set the scenario's model from a framework's model id; a checkpoint stored AWQ / GPTQ / ... is an error."""
    scheme = prequantized(name)
    if scheme:
        raise cfg.fail(key, f"{name} is a checkpoint stored {scheme}-quantized; ftscope models a bf16 base or bitsandbytes NF4")
    ref, note = model_ref(name)
    cfg.scenario["model"] = ref
    cfg.notes += [note] if note else []


def nested_quant(value: Any, key: str, cfg: FrameworkConfig) -> None:
    """mix.nested_quant from a framework's bitsandbytes double-quantization switch (true or false, nothing else)."""
    if not isinstance(value, bool):
        raise cfg.fail(key, f"must be true or false; got {_short(value)}")
    cfg.set("mix.nested_quant", value)


def dataset_lengths(cfg: FrameworkConfig, key: str, value: Any, length_key: str) -> None:
    """A named dataset changes time through its token lengths, which a config does not hold: say so."""
    cfg.unmapped.append(f"{key}={_short(value)} (token lengths unknown: every sequence counted at {length_key}; give "
                        "workload.dataset statistics for time)")


def liger_loss(cfg: FrameworkConfig, key: str) -> None:
    """Liger's kernels: its fused linear cross-entropy is modelled, the rest is listed."""
    cfg.set("mix.loss", "fused_linear")
    cfg.unmapped.append(f"{key} (Liger's fused linear cross-entropy is modelled; its RMSNorm, SwiGLU and RoPE kernels, "
                        "which keep fewer activations, are not)")


def listed(value: Any) -> list[str]:
    """A comma-separated string or a list, as a list of names."""
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if str(v).strip()]
    return [v.strip() for v in str(value).split(",") if v.strip()]


def first(data: Mapping[str, Any], names: Iterable[str]) -> Any:
    """The value of the first of `names` that is set in data (aliases of one key)."""
    for name in names:
        if data.get(name) is not None:
            return data[name]
    return None
