"""Bytes of a run's trained state per GPU: per trainable parameter by precision, engine and recipe
(`state_bytes`), and weights, gradients and optimizer states sharded over the data-parallel ranks and offloaded
(`sharded_states`). memory.py builds the memory model from them; plan/bounds.py's state floor reads them alone."""
from __future__ import annotations

from dataclasses import dataclass

from ..spec.scenario import Scenario

OPTIMIZER_STATE_BYTES = {"adamw": 8.0, "adamw_8bit": 2.0, "paged_adamw_8bit": 2.0, "sgd": 0.0}


@dataclass(frozen=True)
class StateBytes:
    """Bytes per trainable parameter the run keeps, by role."""

    weight: float
    """The working copy of a trained weight."""
    gradient: float
    optimizer: float
    """Optimizer states plus an fp32 master copy where the engine keeps one."""
    low_states: bool
    """AdamW states kept in bf16 (pure bf16, or a recipe's bf16 adapters)."""


def state_bytes(scn: Scenario) -> StateBytes:
    """Bytes per trainable parameter of the working weight, its gradient and its optimizer state, by precision,
    engine and recipe."""
    mix = scn.mix
    deepspeed, fsdp = mix.zero_stage > 0, mix.fsdp is not None
    mixed = mix.precision in ("bf16-mixed", "fp16-mixed")
    low_adapters = mixed and mix.trains_lora and not deepspeed and scn.recipe.adapter_dtype(mix.method) != "fp32"
    if mix.precision == "fp32":
        w_b, g_b, master = 4.0, 4.0, 0.0
    elif mixed and (deepspeed or (mix.method == "full" and fsdp)):
        w_b, g_b, master = 2.0, 2.0, 4.0        # bf16 working copy, fp32 master in the optimizer
        if fsdp:
            w_b, g_b, master = 4.0, 4.0, 0.0    # FSDP2 shards fp32 params; bf16 is a per-block gathered copy
    elif mixed:
        w_b, g_b, master = 4.0, 4.0, 0.0        # torch AMP: fp32 parameters, autocast casts per op
    if mix.precision == "bf16" or low_adapters:  # pure bf16, or a recipe that keeps adapters in bf16
        w_b, g_b, master = 2.0, 2.0, 0.0
    low_states = (mix.precision == "bf16" or low_adapters) and mix.optimizer == "adamw"
    opt_state = OPTIMIZER_STATE_BYTES[mix.optimizer] * (0.5 if low_states else 1.0)
    return StateBytes(w_b, g_b, opt_state + master, low_states)


def sharded_states(mix, n: int, frozen: float, trainable: int, per: StateBytes,
                   replicated: float = 0.0) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer states, host bytes) per GPU before the layout splits them: ZeRO / FSDP shard
    over the n data-parallel ranks, offload moves states (and parameters) to the host. `replicated`: bytes of
    `frozen` every rank keeps whole on its GPU (weight_memory.kbit_state_bytes), neither sharded nor offloaded."""
    stage = mix.shard_stage
    shard_w = n if (stage == 3 or mix.fsdp is not None) else 1  # FSDP2 shards parameters at both strategies
    shard_g = n if stage >= 2 else 1
    shard_o = n if stage >= 1 else 1
    weights = (frozen - replicated + trainable * per.weight) / shard_w
    grads = trainable * per.gradient / shard_g
    optimizer = trainable * per.optimizer / shard_o
    cpu = 0.0
    if mix.offload in ("optimizer", "optimizer+params"):
        cpu += optimizer + trainable * 4.0 / shard_g  # fp32 states + fp32 grad partition live on the host
        optimizer = 0.0
    if mix.offload == "optimizer+params":
        cpu += weights
        weights = 0.0
    return weights + replicated, grads, optimizer, cpu


def trainable_params(scn: Scenario) -> int:
    """Parameters the optimizer trains: every one in full fine-tuning, the adapters' otherwise."""
    m, mix = scn.model, scn.mix
    if mix.method == "full":
        return m.total_params
    return m.lora_params(mix.lora_rank, mix.lora_targets, fused_experts=m.is_moe and mix.fused_experts)
