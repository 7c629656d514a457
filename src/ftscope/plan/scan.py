"""The pass over every mix of a space (classify.py's first stage): refusal, support per GPU type, layout validity
per GPU count, and one memory probe per mix and GPU count that may fit, with the probes' results kept per slot.
The probes are recorded as the pass meets them (what a mix's models share computed once per mix, the models
themselves made as numpy arrays: estimate/memory_columns.py) and evaluated together when it is done (`settle`:
memory_probe.Probes, over numpy arrays of every probed model); a capacity reads NCCL's buffers per distinct set of
communicators (comm_buffers.CommBytes).

Work is shared wherever the answer provably does not change: GPU support per distinct GPU_FIELDS value, layout
validity per distinct LAYOUT_FIELDS value, a fused attention kernel's probes taking its FUSED_ATTENTION twin's models,
and no memory model at a GPU count whose state floor (memory_probe.StateFloor) is above every capacity.
"""
from __future__ import annotations

from dataclasses import fields
from operator import attrgetter
from typing import Any, Callable, Sequence

from ..estimate.comm_buffers import CommBytes
from ..estimate.memory import FUSED_ATTENTION, memory_mix, usable_bytes
from ..spec.rules import GPU_FIELDS, gpu_problem
from ..spec.mix import Mix
from ..spec.scenario import fast_replace
from .memory_probe import FLOOR_FREE, Probes, StateFloor, probe_part
from .layouts import LAYOUT_FIELDS, layout_reason
from .ranking import mix_complexity, refusal
from .space import MIX_DIMENSIONS, Space, with_mix

SLOT_CHUNK = 4096
"""Slots (mixes some GPU type supports) the probe arrays start with, and the least they grow by."""


class Scan:
    """What the pass over every mix gathers: per mix (refusal, ranking facts, compute signature, layout degrees),
    per mix and GPU type (support), per mix and GPU count (layout validity, one memory probe)."""

    def __init__(self, np, space: Space, accepts: dict[str, Callable[[Any], bool] | None],
                 global_batch: int | None, margin: float = 0.0, share_twins: bool = True,
                 exact_peaks: bool = True) -> None:
        nb, nm = len(space.blocks), space.mixes_per_block
        self.np, self.space, self.accepts, self.global_batch = np, space, accepts, global_batch
        self.exact_peaks = exact_peaks  # False: only whether a fixed-batch peak fits is read (by time or cost)
        gpus = list(dict.fromkeys(b.gpu.key for b in space.blocks))
        worlds = list(dict.fromkeys(b.world for b in space.blocks))
        self.g_of = np.array([gpus.index(b.gpu.key) for b in space.blocks])
        self.w_of = np.array([worlds.index(b.world) for b in space.blocks])
        self.on_gpu = [next(b.base for b in space.blocks if b.gpu.key == g) for g in gpus]
        self.at_world = [next(b.base for b in space.blocks if b.world == w) for w in worlds]
        # usable bytes per block: the most any mix can reserve there (a bound: the pruning reads it); each mix's
        # capacity (device_capacity) is this less NCCL's buffers, which read COMM_FIELDS: one column per value met
        self.usable = np.array([usable_bytes(b.gpu) for b in space.blocks], float)
        self.comm_of = np.zeros(nm, np.int64)  # per mix: its column of `cap_columns`
        self.slot_comm: list[int] = []  # the same per slot
        self.comm_ids: dict[tuple, int] = {}
        self.cap_columns: list[Any] = []
        self.comm_key = _fields_of(COMM_FIELDS)
        self.nccl = CommBytes()  # comm_buffer_bytes, its work shared across the scan's columns
        self.bases = [b.base for b in space.blocks]
        self.world_block = [next(i for i, b in enumerate(space.blocks) if b.world == w) for w in worlds]  # at_world's
        self.cap_at_world: list[list[float]] = []  # per column: the capacity of each at_world scenario
        self.seq = space.scenario.workload.peak_seq_len()
        self.searched, self.valid = np.zeros(nm, bool), np.zeros(nm, bool)
        self.supported = np.zeros((len(gpus), nm), bool)
        self.layout_ok = np.zeros((len(worlds), nm), bool)  # the layout runs on this GPU count (plan/layouts.py)
        self.split = np.ones((2, nm), np.int64)  # model-parallel group size and pipeline stages of each mix
        # the probes' results are kept per slot: one column per mix that some GPU type supports, taken in order
        # (a search of millions of mixes runs a fifth of them), in chunks of SLOT_CHUNK slots added as slots are
        # taken (no copy on growth) and gathered once at the end (`gather`)
        self.slot = np.full(nm, -1, np.int64)
        self.slots = 0
        self.width = max(1, min(nm, SLOT_CHUNK))
        self.margin = margin
        self.chunks: list[_Chunk] = []
        self.phases: int | None = None  # phases of the memory models, known from the first batch terms
        self.terms: dict[str, Any] = {}  # the fitting probes' batch terms (TERMS: phases x probes), "row" per slot
        self.sig = np.zeros(nm, np.int32)
        self.signatures: dict[tuple, int] = {}
        self.accept = {name: np.zeros(nm, bool) for name in accepts}
        self.complexity = np.zeros(nm, np.int16)
        # the Mix fields of the compute dimensions, read at once (a tuple: one-to-one with the dimensions' values)
        self.compute_key = _fields_of([f for d in space.dimensions if d.affects_compute for f in d.mix_fields])
        self.gpu_key, self.layout_key = _fields_of(GPU_FIELDS), _fields_of(LAYOUT_FIELDS)
        self.probes = Probes(self.seq)  # every probe, evaluated together when the scan is done (settle)
        self.policies: dict = {}  # memory_models' activation policies per distinct POLICY_FIELDS value
        self.floors: dict = {}  # StateFloor (and its `at` per GPU count) per distinct value of the fields it reads
        self.refused: dict = {}  # refusal per distinct value of the fields it reads (all but REFUSAL_FREE)
        self.refusal_key = _fields_of([f.name for f in fields(Mix) if f.name not in REFUSAL_FREE])
        self.floor_key = _fields_of([f.name for f in fields(Mix) if f.name not in FLOOR_FREE])
        self.probed: dict[tuple[int, int], int] = {}  # (slot, GPU count index) -> the probe's model row
        self.pending: list[tuple[int, int, int]] = []  # per probe not settled yet: slot, GPU count index, support id
        self.on_of: Any = []  # per support id: supported per GPU type (an array once the scan is done)
        self.rooms: Any = []  # per support id: the largest capacity per GPU count
        self.twin_offset = _twin_offsets(space) if share_twins else {}
        self.block_of_world = [np.flatnonzero(self.w_of == x) for x in range(len(worlds))]
        self.layouts: dict[tuple, list[int]] = {}
        self.gpu_support: dict[tuple, Any] = {}  # per distinct GPU_FIELDS value: supported per GPU type, room
        self.worlds = worlds
        self.room = np.full((len(worlds), len(gpus)), -np.inf)  # largest capacity per GPU count and type
        for b in range(nb):
            w, g = self.w_of[b], self.g_of[b]
            self.room[w, g] = max(self.room[w, g], self.usable[b])

    def caps(self, mixes: Any) -> tuple[Any, Any]:
        """The capacity (device_capacity) of every block (rows) for these mixes (columns), and the same less the
        margin (the same product max_micro_batch's limit computes)."""
        caps = self.np.stack(self.cap_columns, axis=1)[:, self.comm_of[mixes]] if self.cap_columns else \
            self.np.zeros((len(self.usable), len(mixes)))
        return caps, caps * (1.0 - self.margin)

    def _comm(self, mix: Any) -> int:
        """The column of this mix's capacities, made (a scenario per block) the first time its COMM_FIELDS are met."""
        key = self.comm_key(mix)
        c = self.comm_ids.get(key)
        if c is None:
            c = self.comm_ids[key] = len(self.cap_columns)
            # device_capacity(with_mix(base, mix)) of every block: its usable bytes less NCCL's
            nccl = self.nccl
            self.cap_columns.append(self.usable - self.np.array(
                [nccl.of(base.cluster, mix, base.recipe.nccl_version) for base in self.bases], float))
            self.cap_at_world.append(self.cap_columns[-1][self.world_block].tolist())
        return c

    def mix(self, k: int, mix: Any) -> None:
        np = self.np
        self.searched[k] = True
        if self.refuses(mix):
            return
        self.valid[k] = True
        self.complexity[k] = mix_complexity(mix)
        for name, f in self.accepts.items():
            self.accept[name][k] = f is None or f(mix)
        self.sig[k] = self.signatures.setdefault(self.compute_key(mix), len(self.signatures))
        self.split[:, k] = mix.model_parallel, mix.pipeline_parallel
        key = self.gpu_key(mix)
        support = self.gpu_support.get(key)
        if support is None:  # unsupported_reason, whose mix and model rules refusal just read
            model = self.space.scenario.model
            on = np.array([gpu_problem(mix, model, base.cluster.gpu) is None for base in self.on_gpu])
            # per GPU count the largest capacity of the GPU types it runs on, and support as plain bools
            room = self.room[:, on].max(axis=1).tolist() if on.any() else None
            support = self.gpu_support[key] = on, room, on.tolist(), len(self.gpu_support)
            self.on_of.append(on)
            self.rooms.append(room or [-np.inf] * len(self.worlds))
        on, room = support[:2]
        self.supported[:, k] = on
        if room is None:
            return
        mix_k, k = k, self._take_slot(k)  # from here on, k is the mix's slot
        comm = self.comm_of[mix_k] = self._comm(mix)
        self.slot_comm.append(comm)
        twin = self._twin(mix_k, mix, on)
        runs = self._layout_runs(mix)
        self.layout_ok[runs, mix_k] = True
        if not runs:
            return
        floor_key = self.floor_key(mix)
        hit = self.floors.get(floor_key)
        if hit is None:  # shared by the mixes that differ only in FLOOR_FREE fields; its `at` per GPU count index
            hit = self.floors[floor_key] = StateFloor(with_mix(self.at_world[0], mix)), [None] * len(self.worlds)
        floor, by_w = hit
        probe = []
        probed, pending, sid = self.probed, self.pending, support[3]
        for w in runs:
            at = by_w[w]
            if at is None:
                at = by_w[w] = floor.at(self.worlds[w])
            if at > room[w]:
                continue  # does not fit on any block at this count: no model (peak stays inf, NO_FIT)
            if twin is not None and (twin, w) in probed:
                self._copy(k, twin, w, sid)
            else:
                probe.append(w)
        if not probe:
            return
        at_world, caps = self.at_world, self.cap_at_world[comm]
        part = probe_part(with_mix(at_world[probe[0]], mix), self.policies, floor)  # what the mix's models share
        rows = self.probes.add_mix(part, mix, [at_world[w] for w in probe], [caps[w] for w in probe])
        for w, row in zip(probe, rows):
            probed[k, w] = row  # evaluated with the others (`settle`)
            pending.append((k, w, sid))

    def refuses(self, mix: Any) -> bool:
        """Whether ranking.refusal refuses this mix, decided once per distinct value of the fields its rules read."""
        key = self.refusal_key(mix)
        refused = self.refused.get(key)
        if refused is None:
            refused = self.refused[key] = refusal(self.space.scenario.model, mix) is not None
        return refused

    def _take_slot(self, k: int) -> int:
        """The next free slot for mix k, a chunk added when the last one is full."""
        if self.slots == len(self.chunks) * self.width:
            self.chunks.append(_Chunk(self.np, len(self.at_world), len(self.space.blocks), self.width,
                                      self.global_batch is not None, bool(self.margin)))
        self.slot[k] = self.slots
        self.slots += 1
        return self.slots - 1

    def _at(self, slot: int) -> tuple[_Chunk, int]:
        """The chunk that holds a slot, and the slot's column in it."""
        return self.chunks[slot // self.width], slot % self.width

    def gather(self, slots: Any) -> tuple[Any, Any, Any, dict[str, Any]]:
        """(peak, fixed_peak, safe_fixed_peak, terms) of these slots, in their order, as single arrays (the fixed
        peaks None without a fixed global batch, the safe one the same array without a margin; terms empty when no
        probe fitted anywhere)."""
        np = self.np
        self.settle()
        which, cols = slots // self.width, slots % self.width
        parts = [(c, np.flatnonzero(which == c)) for c in np.unique(which).tolist()]

        def pick(get, shape, fill):
            out = np.full(shape[:-1] + (len(slots),), fill)
            for c, at in parts:
                value = get(self.chunks[c])
                if value is not None:
                    out[..., at] = value[..., cols[at]]
            return out

        nb, nw = len(self.space.blocks), len(self.at_world)
        peak = pick(lambda ch: ch.peak, (nw, 0), np.inf)
        fixed = safe = None
        if self.global_batch is not None:
            fixed = pick(lambda ch: ch.fixed_peak, (nb, 0), np.inf)
            safe = pick(lambda ch: ch.safe_fixed_peak, (nb, 0), np.inf) if self.margin else fixed
        terms = {}
        if self.terms:  # the fitting probes' terms as they are, and per GPU count and slot the column of its probe
            terms = dict(self.terms, row=self.terms["row"][:, slots])
        return peak, fixed, safe, terms

    def _layout_runs(self, mix: Any) -> list[int]:
        """The GPU counts (indices) whose layout check passes, per distinct value of the fields it reads."""
        key = self.layout_key(mix)
        runs = self.layouts.get(key)
        if runs is None:
            runs = self.layouts[key] = [w for w, base in enumerate(self.at_world)
                                        if layout_reason(with_mix(base, mix), self.global_batch) is None]
        return runs

    def _twin(self, k: int, mix: Any, on: Any) -> int | None:
        """An earlier mix with the same memory_mix (a fused attention kernel's FUSED_ATTENTION sibling), whose
        probes this one may copy: equal memory models give equal peaks and solves. Only when every GPU type that
        supports this mix supports the twin, so the twin solved every block this mix needs."""
        offset = self.twin_offset.get(mix.attention)
        if offset is None:
            return None
        twin = k - offset
        if not (self.valid[twin] and (self.supported[:, twin] | ~on).all()):
            return None
        return int(self.slot[twin])  # the twin has a slot: some GPU type supports it

    def _copy(self, k: int, twin: int, w: int, sid: int) -> None:
        """A probe at GPU count w that takes the twin's model and scenario (k, twin: their slots; the twin's GPU types
        include this mix's, so its model is this mix's; Probes.copy says why its scenario serves)."""
        self.probed[k, w] = self.probes.copy(self.probed[twin, w])
        self.pending.append((k, w, sid))

    def settle(self) -> None:
        """Every recorded probe's peak at micro-batch 1 in its slot; where some block has room for it (the largest
        capacity of the GPU types its mix runs on at its count), its batch terms and fixed-batch peaks as well."""
        np = self.np
        if not self.pending:
            return
        slot, w, sid = np.array(self.pending, np.int64).reshape(-1, 3).T
        self.on_of, self.rooms = np.array(self.on_of, bool), np.array(self.rooms, float)
        peak = self.probes.peaks_at_one(np)
        self._scatter(lambda ch: ch.peak, slot, lambda at: (w[at],), peak)
        fit = np.flatnonzero(peak <= self.rooms[sid, w])
        if len(fit):
            terms = self.probes.batch_terms(np, fit)
            self.phases = len(terms[0])
            self.terms = dict(zip(TERMS, terms))
            self.terms["row"] = np.full((len(self.worlds), self.slots), -1, np.int64)
            self.terms["row"][w[fit], slot[fit]] = np.arange(len(fit))
        if self.global_batch is not None and len(fit):
            # the blocks at each fitting probe's GPU count (-1 pads the counts with fewer blocks), and their capacity
            # where the probe's mix runs on the block's GPU type
            per_world = max(len(b) for b in self.block_of_world)
            table = np.full((len(self.block_of_world), per_world), -1, np.int64)
            for x, blocks in enumerate(self.block_of_world):
                table[x, :len(blocks)] = blocks
            blocks = table[w[fit]]
            runs = (blocks >= 0) & np.take_along_axis(self.on_of[sid[fit]], self.g_of[blocks], axis=1)
            comm = np.array(self.slot_comm, np.int64)[slot[fit]][:, None]  # each probe's capacity column
            full = np.stack(self.cap_columns, axis=1)  # blocks x columns
            for caps, get in ((full, lambda ch: ch.fixed_peak), (full * (1.0 - self.margin) if self.margin else None,
                                                                 lambda ch: ch.safe_fixed_peak)):
                if caps is None:
                    continue
                cells = np.where(runs, caps[blocks, comm], np.nan)
                value = self.probes.fixed_batch_peaks(np, fit, cells, self.global_batch, self.exact_peaks)
                p, j = np.nonzero(runs)
                self._scatter(get, slot[fit][p], lambda at: (blocks[p[at], j[at]],), value[p, j])
        self.pending = []
        self.probes, self.probed = Probes(self.seq), {}  # the settled models are not read again: free them now

    def _scatter(self, get, slots, index, values) -> None:
        """Write values (one per slot) into each chunk's array `get(chunk)` at index(at) + the slots' columns (`at`:
        the positions of the slots in that chunk)."""
        np = self.np
        which, cols = slots // self.width, slots % self.width
        if len(which) and (np.diff(which) >= 0).all():  # in slot order (settle's are): each chunk's slots a range
            bounds = np.searchsorted(which, np.arange(int(which[-1]) + 2))
            parts = ((c, np.arange(bounds[c], bounds[c + 1])) for c in np.flatnonzero(np.diff(bounds)).tolist())
        else:
            parts = ((c, np.flatnonzero(which == c)) for c in np.unique(which).tolist())
        for c, at in parts:
            get(self.chunks[c])[(*index(at), cols[at])] = values[at]


COMM_FIELDS = ("tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel", "zero_stage",
               "context_parallel_impl", "fp8")
"""The Mix fields comm_buffers.comm_key reads (NCCL's buffers, so the capacity, depend on them)."""


REFUSAL_FREE = ("nested_quant", "lora_rank", "lora_targets", "attention", "loss", "fused_elementwise", "lora_dropout",
                "context_parallel", "context_parallel_impl", "expert_parallel", "compile", "optimizer_in_backward",
                "activation_offload")
"""Mix fields no rule of ranking.refusal reads (spec/rules.py's MIX_RULES and MODEL_RULES): the scan decides refusal
once per distinct value of the others (tests/plan/test_classify.py changes each of these on refused and accepted
mixes and checks the answer stays). A new Mix field is read until it is added here."""


TERMS = ("fixed", "first", "far")
"""The batch terms kept per phase and fitting probe: fixed bytes, bytes the first sequence adds, bytes per sequence
at the cap (MemoryProbe.batch_terms)."""


class _Chunk:
    """The probes' results of `width` consecutive slots: peak at micro-batch 1 per GPU count, fixed-batch peaks per
    block (at the full capacity and, with a margin, less it)."""

    def __init__(self, np, worlds: int, blocks: int, width: int, fixed: bool, margin: bool) -> None:
        self.np, self.worlds, self.width = np, worlds, width
        self.peak = np.full((worlds, width), np.inf)
        self.fixed_peak = np.full((blocks, width), np.inf) if fixed else None
        self.safe_fixed_peak = np.full((blocks, width), np.inf) if fixed and margin else self.fixed_peak


def _fields_of(names: Sequence[str]) -> Callable[[Any], tuple]:
    """A function giving these fields of a mix as a tuple (operator.attrgetter's, which gives a bare value for one)."""
    if len(names) > 1:
        return attrgetter(*names)
    return lambda mix: tuple(getattr(mix, f) for f in names)


def _twin_offsets(space: Space) -> dict[str, int]:
    """Per fused attention kernel the space lists after FUSED_ATTENTION: how many mixes back its FUSED_ATTENTION
    sibling is (the mixes differ only in that digit). Empty when the space does not search FUSED_ATTENTION."""
    names = [d.space_field for d in MIX_DIMENSIONS]
    at = names.index("attention")
    values = space.values[at]
    if FUSED_ATTENTION not in values:
        return {}
    stride = 1
    for r in space.radix[at + 1:]:
        stride *= r
    base = values.index(FUSED_ATTENTION)
    probe = space.mix(0)
    return {v: (i - base) * stride for i, v in enumerate(values)
            if i > base and memory_mix(fast_replace(probe, attention=v)).attention == FUSED_ATTENTION}
