"""Rule 1 of bounds.py: one mix's exact memory at one GPU count for every GPU type (`MemoryProbe`), the weights and
optimizer states below every peak (`StateFloor`), and the memory models of one mix on several GPU counts at once
(`memory_models`: what does not read the GPU count is computed once); plan/probes.py records a search's probes
and evaluates them together.
"""
from __future__ import annotations

import math
from dataclasses import fields
from operator import attrgetter
from typing import Sequence

from ..estimate.activations import activation_coefficients, activation_mix
from ..estimate.memory import (MemoryModel, MixPart, frozen_weight_bytes, kbit_state_bytes, memory_model, mix_part,
                               models_of, step_allocator, trainable_params)
from ..estimate.memory_layout import activation_policy, state_split
from ..estimate.weight_memory import forward_transients
from ..estimate.solvers import BATCH_CAP, BatchSolver, phase_totals
from ..estimate.state_memory import sharded_states, state_bytes
from ..spec.mix import Mix
from ..spec.scenario import Scenario
from .layouts import keep_global_batch, replicas

SAFETY = 1.0 - 1e-6
"""A factor that covers floating-point rounding in every bound (bounds.py)."""


class _ModelMemo(BatchSolver):
    """What a probe computes from its memory model alone, shared by the probes whose models are equal (mixes that
    differ only where memory does not look, such as sdpa and flash attention): pure functions of model and length."""

    def __init__(self, model: MemoryModel, seq: int) -> None:
        super().__init__(model, seq)
        self.at_one = phase_totals(model, 1, seq)
        self.peaks[1] = max(model.least_reserved, *self.at_one)  # = model.peak_bytes(1, seq), its floor included
        self.terms: list[tuple[float, float, float]] | None = None


class MemoryProbe:
    """Exact per-GPU memory of one mix at one GPU count, for every GPU type at once. `memos`: a dict the probes of
    one search share, so that equal memory models are solved once; `model`: memory_model(scn) when already built."""

    def __init__(self, scn: Scenario, seq: int, memos: dict | None = None, model: MemoryModel | None = None) -> None:
        self.scenario = scn
        self.model: MemoryModel = memory_model(scn) if model is None else model  # memory_models' when given
        self.seq = seq
        key = (self.model, seq)
        memo = None if memos is None else memos.get(key)
        if memo is None:
            memo = _ModelMemo(self.model, seq)
            if memos is not None:
                memos[key] = memo
        self._memo = memo
        self.peak_at_one = memo.peaks[1]
        """The same number as MemoryModel.peak_bytes(1, seq): the max of the phases' reserved bytes."""
        self._by_accumulation: dict[bool, MemoryModel] = {}
        self._fixed: list | None = None

    def batch_terms(self) -> list[tuple[float, float, float]]:
        """(fixed bytes, bytes the first sequence adds, bytes per sequence at the cap) of every phase at this
        length. A phase's reserved bytes grow linearly with the micro-batch (activations scale with tokens and
        tokens x length) plus terms that stop growing (a fused loss's logits tile), so they lie between the two
        lines these slopes draw from the fixed bytes."""
        memo = self._memo
        if memo.terms is None:
            empty = phase_totals(self.model, 0, self.seq)
            far, farther = (phase_totals(self.model, b, self.seq) for b in (BATCH_CAP, 2 * BATCH_CAP))
            memo.terms = [(k, a - k, (f2 - f1) / BATCH_CAP) for k, a, f1, f2 in zip(empty, memo.at_one, far, farther)]
        return memo.terms

    def max_micro_batch(self, capacity: float) -> int:
        """The solver's answer on a GPU with this capacity (the capacity-free curves solved once per model, the
        peak at each micro-batch computed once for every capacity)."""
        return self._memo.largest(capacity)

    def peak(self, batch: int) -> float:
        """MemoryModel.peak_bytes(batch, seq), memoized."""
        return self._memo.peak(batch)

    def fixed_batch_peak(self, capacity: float, global_batch: int, exact: bool = True) -> float:
        """Peak bytes of the layout recommend picks to keep the global batch (micro-batch as large as fits up to
        the global batch over the replicas and stages, accumulation for the rest), the way recommend's evaluate
        picks it. When the capped micro-batch itself fits, the solver's larger answer would be capped to it
        (reserved bytes grow with the micro-batch), so no solve is needed. With `exact` False, for a capacity the
        peak at micro-batch 1 fits, only whether the answer fits is kept (a search ranked by time or cost reads
        nothing else of it): below the cap the solver's batch accumulates (ga >= 2), and when the scenario's
        model accumulates too it is this model, whose peak at the solver's batch fits by the solver's definition;
        so the peak at 1, which fits, stands for it and no solve is needed."""
        scn = self.scenario
        fixed = self._fixed
        if fixed is None or fixed[0] != global_batch:  # what does not depend on the capacity, once per probe
            reps, stages = replicas(scn), scn.mix.pipeline_parallel
            cap = max(1, global_batch // (reps * stages))
            fixed = self._fixed = [global_batch, reps, stages, cap, self.peak(cap) if cap <= BATCH_CAP else math.inf,
                                   None]
        _, reps, stages, cap, at_cap, when_capped = fixed
        if at_cap <= capacity:  # the capped micro-batch fits: the same answer for every such capacity
            if when_capped is None:
                when_capped = fixed[5] = self._kept_batch_peak(cap, global_batch, reps, stages)
            return when_capped
        if not exact and self.peak_at_one <= capacity and scn.workload.gradient_accumulation > 1:
            return self.peak_at_one
        return self._kept_batch_peak(self.max_micro_batch(capacity), global_batch, reps, stages)

    def _kept_batch_peak(self, fitting: int, global_batch: int, reps: int, stages: int) -> float:
        """Peak bytes at the micro-batch and accumulation keep_global_batch picks from the largest that fits."""
        scn = self.scenario
        mb, ga = keep_global_batch(fitting, global_batch, reps, stages)
        accumulates = ga > 1  # all the memory model reads of the accumulation (tests/plan/test_bounds.py)
        if accumulates == (scn.workload.gradient_accumulation > 1):
            return self.peak(mb)
        if accumulates not in self._by_accumulation:
            self._by_accumulation[accumulates] = memory_model(scn.with_(gradient_accumulation=ga))
        return self._by_accumulation[accumulates].peak_bytes(mb, self.seq)


class StateFloor:
    """A lower bound on one mix's peak bytes at any batch shape and GPU count, without its memory model: the
    weights and optimizer states alone (state_memory.sharded_states, split by the layout as split_states splits them).
    Every phase's reserved bytes add only non-negative terms to them (the optimizer step's at least gradients and
    temporaries; tests/plan/test_bounds.py checks the bound on a grid), so a GPU count whose floor is above every
    capacity cannot fit anywhere: its memory model need not be built."""

    def __init__(self, scn: Scenario) -> None:
        self.mix = scn.mix
        self.frozen, self.trainable, self.per = frozen_weight_bytes(scn), trainable_params(scn), state_bytes(scn)
        self.replicated = kbit_state_bytes(scn)
        self.split = state_split(scn)
        self._at: dict[int, float] = {}

    def at(self, world: int) -> float:
        hit = self._at.get(world)
        if hit is None:
            n = world // self.mix.model_parallel
            weights, _, optimizer, _ = sharded_states(self.mix, n, self.frozen, self.trainable, self.per,
                                                      self.replicated)
            hit = self._at[world] = (weights * self.split + optimizer * self.split) * SAFETY
        return hit


FLOOR_FREE = ("attention", "gradient_checkpointing", "checkpointing", "checkpoint_every", "loss", "fused_elementwise",
              "lora_dropout", "sequence_parallel", "tp_comm_overlap", "pipeline_schedule", "context_parallel_impl")
"""Mix fields a StateFloor reads nowhere (nor the state bytes it holds: frozen_weight_bytes, trainable_params,
state_bytes, kbit_state_bytes, state_split, sharded_states): mixes that differ only here share one
(tests/plan/test_memory_probe.py varies each)."""


def memory_models(scns: Sequence[Scenario], memo: dict | None = None, floor: "StateFloor | None" = None,
                  capacities: Sequence[float] | None = None) -> list[MemoryModel]:
    """memory_model of each scenario, for scenarios that differ only in their cluster (one mix on several GPU counts
    and GPU types: the search's probes of one mix), built together (estimate/memory.py's build_memory_models: what
    does not read the GPU count computed once) and not memoized one by one. `memo`: a dict shared by the calls of one
    search, keeping the activation policy per distinct POLICY_FIELDS value; `floor`: a StateFloor of their mix,
    whose state bytes the models take; `capacities`: each scenario's device_capacity, when the caller has it."""
    if not scns:
        return []
    return models_of(probe_part(scns[0], memo, floor), scns, capacities)


def probe_part(scn: Scenario, memo: dict | None = None, floor: "StateFloor | None" = None) -> MixPart:
    """memory_models' MixPart of this scenario's mix (what its models share; `memo`, `floor`: as there)."""
    policy = None
    if memo is not None:
        key = (scn.model, scn.top_k, scn.recipe, _policy_key(scn.mix))
        policy = memo.get(key)
        if policy is None:  # build_memory_models' own expression
            policy = memo[key] = activation_policy(activation_coefficients(
                scn.model, activation_mix(scn.mix), scn.top_k, scn.recipe), scn)
    states = None if floor is None else (floor.trainable, floor.per, floor.frozen, floor.replicated)
    transients = None
    if memo is not None:
        key = ("forward_transients", scn.model, scn.recipe, _transient_key(scn.mix))
        transients = memo.get(key)
        if transients is None:
            transients = memo[key] = forward_transients(scn)
    return mix_part(scn, step_allocator(scn), policy, states, transients)


POLICY_FIELDS = tuple(f.name for f in fields(Mix) if f.name not in (
    "offload", "optimizer", "tp_comm_overlap", "pipeline_schedule", "context_parallel_impl", "expert_parallel"))
"""The Mix fields a memory model's activations read (activation_coefficients reads the mix as activation_mix, which
sets ACTIVATION_FREE; activation_policy reads the checkpointing, compile and tensor, sequence, context and pipeline
fields of those): every field but the six left out (tests/plan/test_memory_probe.py varies them)."""
_policy_key = attrgetter(*POLICY_FIELDS)


TRANSIENT_FREE = ("attention", "offload", "optimizer", "experts_top_k", "loss", "fused_elementwise", "lora_dropout",
                  "checkpointing", "checkpoint_every", "tensor_parallel", "sequence_parallel", "tp_comm_overlap",
                  "pipeline_parallel", "pipeline_schedule", "virtual_stages", "context_parallel",
                  "context_parallel_impl", "expert_parallel", "optimizer_in_backward", "activation_offload")
"""Mix fields weight_memory.forward_transients reads nowhere (nor what it calls: the gathered units, PEFT's merged
experts, k-bit copies, trainable_params): probe_part keeps one per distinct value of the others (a search probes
each method, sharding and checkpointing with hundreds of layouts; tests/plan/test_memory_probe.py varies each)."""
_transient_key = attrgetter(*(f.name for f in fields(Mix) if f.name not in TRANSIENT_FREE))
