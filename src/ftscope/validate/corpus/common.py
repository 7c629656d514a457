"""What a corpus point becomes: a scenario plus the numbers it measured, or the reason it cannot be compared.

Every point of the published corpus maps to a `Mapped`: the scenario the run used (as a scenario mapping, the
input format of every verb), the measured numbers as `Measure`s in ftscope's metrics, the features the run used
that the estimator must model for a fair comparison (`needs`), and the interpretations the mapping made
(`notes`). Nothing is dropped: a point or a single number that cannot be compared carries its reason.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ... import catalog
from ...errors import FtscopeError

MODELLED: frozenset[str] = frozenset({
    "tensor parallelism", "pipeline parallelism", "context parallelism", "expert parallelism",
    "selective checkpointing", "fp8", "torch.compile", "optimizer in backward", "activation offload",
    "qlora param offload"})
"""Features (the `needs` vocabulary below) the estimator models today; a point needing anything else is listed."""

FEATURES = {
    "tensor parallelism": "needs tensor parallelism",
    "pipeline parallelism": "needs pipeline parallelism",
    "context parallelism": "needs context (sequence) parallelism",
    "expert parallelism": "needs expert parallelism",
    "selective checkpointing": "needs selective activation checkpointing",
    "fp8": "needs FP8 matmuls",
    "torch.compile": "needs torch.compile",
    "optimizer in backward": "needs the optimizer step fused into backward",
    "activation offload": "needs activation offloading to CPU",
    "qlora param offload": "needs QLoRA with FSDP CPU parameter offload (ftscope refuses the combination)",
    "paged 32-bit optimizer": "needs bitsandbytes' paged 32-bit AdamW (ftscope models the paged 8-bit one)",
}
"""Feature -> the reason a point that needs it is listed while the estimator lacks it."""

METRICS = ("tokens_per_s_per_gpu", "mfu", "peak_gib", "oom")
"""Metric families of the corpus: throughput, model FLOPs utilization, peak memory per GPU, out-of-memory."""


@dataclass(frozen=True)
class Measure:
    """One published number in ftscope's terms."""

    metric: str
    """tokens_per_s_per_gpu | mfu (fraction) | peak_gib:<allocated|reserved|smi|unknown> | oom (1 = ran out)."""
    value: float
    note: str = ""
    """How it was derived from what the source printed."""
    reason: str | None = None
    """Why this number cannot be compared even when its point can (None: comparable)."""


@dataclass(frozen=True)
class Mapped:
    """A corpus point mapped to a scenario, or listed with the reason it cannot be."""

    id: str
    source: str
    framework: str
    """The training framework as the source names it (fsdp_qlora, torchtune, llm-foundry, megatron-core, ...)."""
    scenario: dict[str, Any] | None
    measures: tuple[Measure, ...]
    needs: tuple[str, ...] = ()
    """Features the run used (keys of FEATURES): compared only once every one is MODELLED."""
    reason: str | None = None
    """Why the point cannot be compared whatever ftscope models (no architecture, batch not stated, ...)."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def why_not(self, modelled: frozenset[str] = MODELLED) -> str | None:
        """The reason this point is not compared, or None when it is."""
        if self.reason:
            return self.reason
        missing = [n for n in self.needs if n not in modelled]
        if missing:
            return "; ".join(FEATURES[n] for n in missing)
        if not self.measures:
            return "measured nothing ftscope compares"
        return None


def listed(raw: Mapping[str, Any], source: str, framework: str, reason: str, *measures: Measure) -> Mapped:
    """A point that cannot be compared, kept with its measurements and reason."""
    return Mapped(str(raw["id"]), source, framework, None, tuple(measures), reason=reason)


# ---- GPUs -------------------------------------------------------------------------------------------------------

GPU_UNSTATED = {"a100": "a100-80gb", "unstated": "a100-80gb", "24gb-class": "rtx-4090", "40gb-class": "a100-40gb"}
"""GPU descriptions that name no exact part -> the catalog GPU assumed (only memory is compared for them)."""


def gpu_key(text: str) -> tuple[str | None, str]:
    """(catalog key or None, note) for the corpus's GPU field ('h100-sxm-80gb (DGX-H100)', 'a100 (size not
    stated)', ...): the first word is looked up in the catalog's names and aliases."""
    word = str(text).split("(")[0].strip().lower()
    if word in GPU_UNSTATED:
        return GPU_UNSTATED[word], f"GPU '{text}' read as {GPU_UNSTATED[word]}"
    try:
        return catalog.resolve_gpu_name(word), ""
    except FtscopeError:
        return None, f"GPU '{text}' is not in the catalog"


def exact_gpu(text: str) -> bool:
    """True when the GPU field names one part (its throughput can be compared)."""
    return str(text).split("(")[0].strip().lower() not in GPU_UNSTATED


def hardware(gpu: str, n_gpus: int, per_node: int = 8, inter_node_gbs: float | None = None) -> dict[str, Any]:
    """The scenario's hardware section for n GPUs filled node by node (8 per node unless stated)."""
    per = min(n_gpus, per_node)
    if n_gpus % per:
        raise ValueError(f"{n_gpus} GPUs do not fill nodes of {per}")
    hw: dict[str, Any] = {"gpu": gpu, "gpus_per_node": per, "nodes": n_gpus // per}
    if inter_node_gbs is not None:
        hw["inter_node_gbs"] = inter_node_gbs
    return hw


# ---- numbers as printed -----------------------------------------------------------------------------------------

def number(text: Any) -> float | None:
    """The number in '76/80', '56.9%', '8*64GB', '72-80 (90-98%)' (a range gives its middle), or None."""
    if isinstance(text, bool) or text is None:
        return None
    if isinstance(text, (int, float)):
        return float(text)
    s = str(text)
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*-\s*(\d+(?:\.\d+)?)", s)
    if m:
        return (float(m.group(1)) + float(m.group(2))) / 2
    s = s.split("*")[-1]
    m = re.search(r"\d+(?:\.\d+)?", s)
    return float(m.group(0)) if m else None


def memory_kind(text: Any) -> str:
    """The memory metric a source's wording names: allocated | reserved | smi | unknown."""
    s = str(text or "").lower()
    if "active" in s or "allocated" in s:
        return "allocated"   # torchtune's peak active bytes are what max_memory_allocated reports
    if "reserved" in s:
        return "reserved"
    if "smi" in s or "used/total" in s:
        return "smi"
    return "unknown"


def peak(value: Any, kind: str, note: str = "") -> Measure | None:
    v = number(value)
    if v is None:
        return None
    return Measure(f"peak_gib:{kind}", v, note or f"peak memory as {kind}")


def lora_targets(text: Any) -> list[str] | str:
    """LoRA targets from a source's wording ('q,v', 'q,k,v,o + mlp', 'all-linear', [q_proj, v_proj])."""
    if isinstance(text, list):
        return [str(t) for t in text]
    s = str(text or "").lower()
    if "all" in s and "q,v" not in s:
        return "all-linear"
    names = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"}
    out = [names[t] for t in re.findall(r"\b([qkvo])\b", s.split("(")[0])]
    if "mlp" in s:
        out += ["gate_proj", "up_proj", "down_proj"]
    return out or "all-linear"
