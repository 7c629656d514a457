"""Rule 1 of bounds.py: one mix's exact memory at one GPU count for every GPU type (`MemoryProbe`), the weights and
optimizer states below every peak (`StateFloor`), and the memory models of one mix on several GPU counts at once
(`memory_models`: what does not read the GPU count is computed once); a search's probes recorded and evaluated
together (`Probes`).
"""
from __future__ import annotations

import math
from dataclasses import fields
from operator import attrgetter
from typing import Callable, Sequence

from ..estimate.activations import activation_coefficients, activation_mix
from ..estimate.memory import (MemoryModel, MixPart, frozen_weight_bytes, kbit_state_bytes, memory_model, mix_part,
                               models_of, step_allocator, trainable_params)
from ..estimate.memory_columns import Columns, columnar
from ..estimate.memory_layout import activation_policy, state_split
from ..estimate.weight_memory import forward_transients
from ..estimate.solvers import BATCH_CAP, BatchSolver, phase_totals
from ..estimate.state_memory import sharded_states, state_bytes
from ..spec.mix import Mix
from ..spec.scenario import Scenario, fast_replace
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



class Probes:
    """Many probes of one search, recorded as the scan meets them and evaluated together: each probe's peak at
    micro-batch 1, batch terms and fixed-batch peaks are MemoryProbe's, computed over all the probed models at once
    (estimate/memory_arrays.py: equal to the scalar model exactly); what only a solve or another accumulation answers
    falls back to one model or one MemoryProbe per probe. A probe is a memory model on one mix at one GPU count;
    probes of equal models (a fused attention kernel's twin) share its row."""

    def __init__(self, seq: int, mix_of: Callable[[int], Mix] | None = None) -> None:
        self.seq, self.mix_of = seq, mix_of  # mix_of: a mix from its number (add_mix's `number`)
        self.models: list[MemoryModel] = []
        self.rows: list[int] = []  # per probe: its model's row
        # per model: the scenario of the probe that recorded it, kept as a scenario of its GPU count (`bases`) and the
        # mix to put on it (`scenario`: the search records hundreds of thousands and reads a few)
        self.bases: list[Scenario] = []
        self.mixes: list[Mix | int] = []  # (or its number: the garbage collector then does not walk each mix)
        self.facts: list[tuple] = []  # per model: what fixed_batch_peaks reads of its mix (`_facts`)
        self.made: dict[int, Mix] = {}  # the mixes made from their number, once each
        self.worlds: list[int] = []  # per model: its GPU count
        self.arrays = self.at_one = None  # the models' arrays and peaks at micro-batch 1, once settled
        self.columns = Columns()  # the models not built (None in `models`): a columnar mix's, made as arrays
        self.column_rows: list[int] = []
        self.capacities: list[float | None] = []  # per model not built: its capacity

    def copy(self, row: int) -> int:
        """Record a probe of the model at `row`, on the scenario of the probe that recorded it (a fused attention
        kernel's twin: it differs only in the kernel, which neither its memory model nor anything else the probes
        read of the scenario looks at); its row."""
        self.rows.append(row)
        return row

    def add_models(self, scns: Sequence[Scenario], models: Sequence[MemoryModel]) -> range:
        """Record a probe of each model, on its scenario; their rows."""
        start = len(self.models)
        rows = range(start, start + len(models))
        self.models += models
        self.bases += scns
        self.mixes += [s.mix for s in scns]
        self.facts += [_facts(s.mix) for s in scns]
        self.worlds += [s.cluster.world_size for s in scns]
        self.rows += rows
        self.capacities += [None] * len(models)
        return rows

    def add_mix(self, part: MixPart, mix: Mix, bases: Sequence[Scenario], capacities: Sequence[float],
                number: int | None = None) -> range:
        """Record a probe of `mix` on each of `bases` (scenarios that differ from part.scn only in their cluster; the
        probe's scenario is with_mix(base, mix)) at its device_capacity; their rows. A columnar mix's models are not
        built: their arrays are made with the others' (estimate/memory_columns.py), and a model only when a probe
        reads it (`model`); nor are their scenarios (`scenario`), and their part is not kept; nor the mix, when
        `number` gives it to mix_of."""
        if not columnar(part):
            scns = [fast_replace(base, mix=mix) for base in bases]
            return self.add_models(scns, models_of(part, scns, capacities))
        start, n = len(self.models), len(bases)
        rows = range(start, start + n)
        worlds = [base.cluster.world_size for base in bases]
        self.models += [None] * n
        self.bases += bases
        self.mixes += [mix if number is None or self.mix_of is None else number] * n
        self.facts += [_facts(mix)] * n
        self.worlds += worlds
        self.rows += rows
        self.capacities += capacities
        self.column_rows += rows
        self.columns.add(part, worlds)
        return rows

    def scenario(self, row: int) -> Scenario:
        """The scenario of the probe that recorded the model at this row."""
        mix = self.mixes[row]
        if isinstance(mix, int):
            mix = self.made.get(mix) or self.made.setdefault(mix, self.mix_of(mix))
        return fast_replace(self.bases[row], mix=mix)

    def model(self, row: int) -> MemoryModel:
        """The memory model at this row (built now if add_mix left it out: models_of's, as it would have built it;
        its part made again, not kept: memory_models' part is the same with or without the search's memo and floor,
        tests/plan/test_memory_probe.py)."""
        model = self.models[row]
        if model is None:
            scn = self.scenario(row)
            model = self.models[row] = models_of(probe_part(scn), [scn], [self.capacities[row]])[0]
        return model

    def peaks_at_one(self, np):
        """MemoryProbe.peak_at_one of every probe, in order."""
        built = [r for r, m in enumerate(self.models) if m is not None] if self.column_rows else range(len(self.models))
        self.arrays = _arrays(np, [self.models[r] for r in built], built, self.columns, self.column_rows)
        self.row_of = np.array(self.rows, np.int64)
        self.at_one = self.arrays.peaks(1, self.seq)  # per model
        return self.at_one[self.row_of]

    def batch_terms(self, np, probes):
        """MemoryProbe.batch_terms of these probes: (fixed, first, far), each an array phases x probes."""
        used, inverse = np.unique(self.row_of[probes], return_inverse=True)
        sub = self.arrays.subset(used)
        empty, one = sub.totals(0, self.seq), sub.totals(1, self.seq)
        far, farther = sub.totals(BATCH_CAP, self.seq), sub.totals(2 * BATCH_CAP, self.seq)
        return empty[:, inverse], (one - empty)[:, inverse], ((farther - far) / BATCH_CAP)[:, inverse]

    def fixed_batch_peaks(self, np, probes, caps, global_batch: int, exact: bool):
        """MemoryProbe.fixed_batch_peak of these probes on each capacity of `caps` (probes x blocks) where their peak
        at 1 fits it (NaN: the mix does not run there); inf in every other cell."""
        # what reads only the model is computed once per model (a twin's probes share their twin's) and spread
        rows = self.row_of[probes]
        used, inverse = np.unique(rows, return_inverse=True)
        inverse = inverse.reshape(-1)
        arrays, at_one = self.arrays.subset(used), self.at_one[rows]
        facts, worlds, models = self.facts, self.worlds, used.tolist()
        world = np.array([worlds[r] for r in models], np.int64)
        split = np.array([facts[r][:2] for r in models], np.int64).reshape(-1, 2)
        reps, stages = np.maximum(world // split[:, 0], 1), split[:, 1]
        cap = np.maximum(1, global_batch // (reps * stages))
        at_cap = np.where(cap <= BATCH_CAP, arrays.peaks(np.minimum(cap, BATCH_CAP), self.seq), np.inf)[inverse]
        out = np.full(caps.shape, np.inf)
        runs = at_one[:, None] <= caps  # False where NaN
        capped = runs & (at_cap[:, None] <= caps)
        rows = rows.tolist()
        accumulating = bool(rows) and self.bases[rows[0]].workload.gradient_accumulation > 1
        if capped.any():  # keep_global_batch's layout at the capped micro-batch, the same for every such capacity
            mb = np.maximum(1, np.minimum(cap, global_batch // (reps * stages)))
            ga = np.maximum(1, np.ceil(global_batch / (mb * reps)))
            ignores = np.array([not facts[r][2] for r in models], bool)
            same = ((ga > 1) == accumulating) | ignores  # equal models: this one's peaks
            kept = np.where(same, arrays.peaks(mb, self.seq), np.nan)[inverse]
            mb, ga, same = mb[inverse], ga[inverse], same[inverse]
            other = np.flatnonzero(~same & capped.any(axis=1))
            if accumulating and len(other):  # without accumulation, a mix that only drops its gradients in forward
                drops = np.array([facts[rows[p]][3] for p in other.tolist()], bool)
                plain, other = other[drops], other[~drops]
                if len(plain):
                    sub = self.arrays.subset(self.row_of[probes[plain]])
                    sub.gradients_in_forward = np.zeros(len(plain))
                    kept[plain] = sub.peaks(mb[plain], self.seq)
            if len(other):  # another accumulation: its own model (built together per mix and accumulation)
                kept[other] = self._other_accumulation(np, [self.scenario(rows[p]) for p in other.tolist()],
                                                       ga[other], mb[other])
            out = np.where(capped, kept[:, None], out)
        rest = runs & ~capped
        if not exact and accumulating:  # the peak at 1 stands for the solver's batch (fixed_batch_peak's reason)
            return np.where(rest, at_one[:, None], out)
        solved: dict[int, MemoryProbe] = {}  # a solve per capacity (memory ranking, or no accumulation)
        for p, b in zip(*np.nonzero(rest)):
            probe = solved.get(p)
            if probe is None:
                probe = solved[p] = MemoryProbe(self.scenario(rows[p]), self.seq, None, self.model(rows[p]))
            out[p, b] = probe.fixed_batch_peak(float(caps[p, b]), global_batch, exact)
        return out

    def _other_accumulation(self, np, scns: list[Scenario], ga, mb):
        """memory_model(scn.with_(gradient_accumulation=ga)).peak_bytes(mb) of each, the models of one mix and
        accumulation made together (as memory_columns arrays, or built as memory_models: they differ only in the
        cluster)."""
        groups: dict[tuple, list[int]] = {}
        for i, (scn, n) in enumerate(zip(scns, ga.tolist())):
            groups.setdefault((id(scn.mix), n), []).append(i)
        columns, models, built, made = Columns(), [], [], []  # made as arrays (memory_columns.py) or built
        for (_, n), members in groups.items():
            accumulating = [_accumulating(scns[i], int(n)) for i in members]
            part = probe_part(accumulating[0])
            if columnar(part):
                columns.add(part, [s.cluster.world_size for s in accumulating])
                made += members
            else:
                models += models_of(part, accumulating)
                built += members
        return _arrays(np, models, built, columns, made).peaks(mb, self.seq)


def reads_accumulation(mix) -> bool:
    """Whether a mix's memory model reads the gradient accumulation at all: DeepSpeed's ZeRO keeps its gradient
    partitions from the start of a step (build_memory_models' gradients in forward, head_gradient's early
    gradient) whether it accumulates or not, so its models with and without accumulation are equal
    (tests/plan/test_memory_probe.py compares them field for field)."""
    return mix.zero_stage == 0


def only_forward_gradients(mix) -> bool:
    """Whether accumulating or not changes only a mix's gradients alive in forward (all of its gradients with,
    none without): without ZeRO (reads_accumulation) and without a trained LM head's gradient (head_gradient's
    early gradient: full fine-tuning without the fused linear loss), so its model without accumulation is the one
    with, gradients_in_forward set to 0 (tests/plan/test_memory_probe.py compares them field for field)."""
    return mix.zero_stage == 0 and (mix.method != "full" or mix.loss == "fused_linear")


def _facts(mix: Mix) -> tuple[int, int, bool, bool]:
    """What fixed_batch_peaks reads of a probe's mix."""
    return mix.model_parallel, mix.pipeline_parallel, reads_accumulation(mix), only_forward_gradients(mix)


def _accumulating(scn: Scenario, ga: int) -> Scenario:
    """scn.with_(gradient_accumulation=ga), without re-checking the scenario (only the accumulation changes)."""
    return fast_replace(scn, workload=fast_replace(scn.workload, gradient_accumulation=ga))


def _arrays(np, models: list, rows: Sequence[int], columns: Columns, column_rows: Sequence[int]):
    """ModelArrays of these models at `rows` and of the columns' probes at `column_rows` (together 0 .. n - 1)."""
    from ..estimate.memory_arrays import ModelArrays
    arrays = ModelArrays(np, models)
    if not len(columns):
        return arrays
    return arrays.joined(np.array(rows, np.int64), columns.arrays(np), np.array(column_rows, np.int64))
