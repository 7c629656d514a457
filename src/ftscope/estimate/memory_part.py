"""What one mix's memory models share (`MixPart`, made by `mix_part`): everything memory.py's build_memory_models
computes without reading the GPU count. A search probes one mix on many GPU counts; memory.py's models_of builds each
count's model from it, memory_columns.py all of them as arrays.
"""
from __future__ import annotations

from typing import NamedTuple

from ..spec.scenario import Scenario
from .activations import ActivationCoefficients, activation_coefficients, activation_mix
from .allocator_model import AllocatorModel
from .head_gradient import HeadGradient, head_gradient
from .memory_layout import activation_policy, paged_state_params, state_split
from .state_memory import StateBytes, state_bytes, trainable_params
from .weight_memory import forward_transients, frozen_weight_bytes, gathered_bytes_per_weight, kbit_state_bytes


class MixPart(NamedTuple):
    """What build_memory_models computes once for one mix (scenarios that differ only in their cluster): share is
    memory_layout.state_split's (it reads the mix and the model only), in_forward whether gradients are already
    allocated during forward."""

    scn: Scenario
    allocator: AllocatorModel
    trainable: int
    per: StateBytes
    frozen: float
    kbit: float
    in_forward: bool
    transient: float
    block: float
    acts: ActivationCoefficients
    checkpointing: bool
    head: HeadGradient
    per_weight: float
    paged_share: float | None
    share: float


def mix_part(scn: Scenario, allocator: AllocatorModel, policy: tuple | None = None,
             states: tuple | None = None, transients: tuple[float, float] | None = None) -> MixPart:
    """build_memory_models' part that reads no cluster (`policy`, `states`: as there; `transients`:
    forward_transients(scn) when the caller has it)."""
    m, mix = scn.model, scn.mix
    trainable, per, frozen, kbit = states or (trainable_params(scn), state_bytes(scn), frozen_weight_bytes(scn),
                                              kbit_state_bytes(scn))
    transient, block = transients or forward_transients(scn)  # reads no shard count: a gathered unit is whole
    acts, checkpointing = policy or activation_policy(activation_coefficients(m, activation_mix(mix), scn.top_k,
                                                                              scn.recipe), scn)
    paged_share = (min(paged_state_params(scn) / max(trainable, 1), 1.0) if mix.optimizer.startswith("paged_")
                   else None)
    return MixPart(scn, allocator, trainable, per, frozen, kbit, scn.workload.gradient_accumulation > 1
                   or mix.zero_stage > 0, transient, block, acts, checkpointing, head_gradient(scn, per.gradient),
                   gathered_bytes_per_weight(scn), paged_share, state_split(scn))
