"""What PEFT and a recipe's k-bit preparation add to a QLoRA / LoRA step's memory beyond the generic states.

- PEFT's LoRA on fused 3-D expert stacks merges W + B @ A for the whole stack in forward, and autograd keeps it;
- a k-bit preparation (PEFT's prepare_model_for_kbit_training, and the recipes that copy it) leaves the layers it
  does not quantize in fp32, and autocast then makes bf16 copies of them that the matmul keeps for backward.
"""
from __future__ import annotations

from functools import lru_cache

from ..spec.scenario import Scenario


def peft_merged_expert_bytes(scn: Scenario) -> float:
    """PEFT's LoRA on fused 3-D experts computes W + B @ A for the whole expert stack in forward and autograd
    keeps it for backward: every MoE layer's stack without checkpointing, one layer's with it."""
    m, mix = scn.model, scn.mix
    if not (mix.trains_lora and m.is_moe and mix.fused_experts):
        return 0.0
    return _merged_expert_bytes(m, mix.precision, mix.lora_targets, mix.gradient_checkpointing)


@lru_cache(maxsize=1024)
def _merged_expert_bytes(m, precision: str, lora_targets, gradient_checkpointing: bool) -> float:
    """peft_merged_expert_bytes of a LoRA on fused experts, by what it reads (a search asks for it per mix)."""
    c = 4.0 if precision == "fp32" else 2.0
    targeted = {id(lin) for lin, _ in m.lora_targets(lora_targets) if lin.group == "experts"}
    per_layer = [sum(lin.params for lin in layer.linears if id(lin) in targeted) * c for layer, _ in m.layer_groups]
    counts = [n for _, n in m.layer_groups]
    if gradient_checkpointing:
        return max(per_layer, default=0.0)
    return sum(b * n for b, n in zip(per_layer, counts))


def kbit_fp32_params(scn: Scenario, quantized: int) -> int:
    """QLoRA: parameters left out of 4-bit that the recipe's k-bit preparation keeps in fp32 (embeddings, norms,
    LM head, and the rest: routers, fused expert stacks, biases)."""
    rec, m = scn.recipe, scn.model
    if scn.mix.method != "qlora" or not rec.kbit_fp32_params:
        return 0
    norms = m.final_norm_params + sum(layer.other_params * n for layer, n in m.layer_groups)
    groups = {"embeddings": m.embedding_params, "lm_head": m.lm_head_params, "norms": norms}
    groups["other"] = max(m.total_params - quantized - sum(groups.values()), 0)
    return sum(n for g, n in groups.items() if rec.kbit_fp32(g))


def kbit_autocast_copies(scn: Scenario) -> tuple[float, list[float]]:
    """Bytes of the bf16 copies autocast makes of frozen weights a k-bit preparation left in fp32, which the
    matmul keeps for the input gradient: (the LM head's, from its forward to its backward; each block's fused
    expert stacks, one block at a time under checkpointing)."""
    rec, m, mix = scn.recipe, scn.model, scn.mix
    if mix.method != "qlora" or mix.precision not in ("bf16-mixed", "fp16-mixed"):
        return 0.0, []
    head = 2.0 * (m.lm_head_params or m.embedding_params) if rec.kbit_fp32("lm_head") else 0.0
    stacks = []
    if rec.kbit_fp32("other") and m.is_moe and mix.fused_experts:
        for layer, n in m.layer_groups:
            stacks += [2.0 * sum(lin.params for lin in layer.linears if lin.group == "experts")] * n
    return head, stacks


@lru_cache(maxsize=256)
def largest_dequantized_linear(m, fused_experts: bool) -> int:
    """Parameters of the largest linear bitsandbytes dequantizes in QLoRA (fused expert stacks stay bf16)."""
    return max((lin.params for lin, _ in m.linears() if not (lin.group == "experts" and fused_experts)), default=0)
