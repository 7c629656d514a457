"""The pass over every mix of a space (classify.py's first stage): refusal, support per GPU type, layout validity
per GPU count, and one memory probe per mix and GPU count that may fit, with the probes' results kept per slot.
The probes are recorded as the pass meets them (a mix's shared part once, its models as numpy arrays) and evaluated
together when it is done (`settle`: probes.Probes); a capacity reads NCCL's buffers per distinct set of
communicators (comm_buffers.CommBytes).

Work is shared wherever the answer provably does not change: GPU support per distinct GPU_FIELDS value, layout
validity per distinct LAYOUT_FIELDS value, a fused attention kernel's probes taking its FUSED_ATTENTION twin's models,
and no memory model at a GPU count whose state floor (memory_probe.StateFloor) is above every capacity.
"""
from __future__ import annotations

from dataclasses import fields
from operator import attrgetter
from typing import Any, Callable, Iterable, Sequence

from ..estimate.comm_buffers import NCCL_MIX_FIELDS, CommBytes, nccl_mix_key
from ..estimate.memory import usable_bytes
from ..spec.rules import GPU_FIELDS, gpu_problem
from ..spec.mix import Mix
from .memory_probe import FLOOR_FREE, StateFloor, probe_part
from .probes import Probes
from .layouts import LAYOUT_FIELDS, layout_reason
from .ranking import mix_complexity, refusal
from .space import Space, twin_offsets, with_mix

SLOT_CHUNK, PROBE_CHUNK = 4096, 16384
"""Slots (mixes some GPU type supports) the probe arrays start with, and the least they grow by; probes settle reads
fixed-batch peaks of at a time."""


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
        self.slot_comm: list[int] = []  # per slot: its mix's column of `cap_columns` (comm_of per mix)
        self.comm_ids: dict[tuple, int] = {}
        self.cap_columns: list[Any] = []
        self.comm_key = nccl_mix_key
        self.nccl = CommBytes()  # comm_buffer_bytes, its work shared across the scan's columns
        self.bases = [b.base for b in space.blocks]
        self.world_block = [next(i for i, b in enumerate(space.blocks) if b.world == w) for w in worlds]  # at_world's
        self.cap_at_world: list[list[float]] = []  # per column: the capacity of each at_world scenario
        self.seq = space.scenario.workload.peak_seq_len()
        self.searched = np.zeros(nm, bool)
        self.in_run = False  # True while `run` scans a run whose refusal it asked for
        # what the pass learns per mix is recorded as plain tuples (numpy writes one at a time were a tenth of the
        # pass), made into the PER_MIX arrays when read (`_per_mix`). Per valid mix: k, complexity, signature,
        self.recorded: list[tuple[int, int, int, int, int, int]] = []  # model-parallel size, stages, support id
        self.accepted: dict[str, list[bool]] = {name: [] for name in accepts}  # per valid mix, as `recorded`
        self.slotted: list[tuple[int, int]] = []  # per slot: its mix, its layout id (`layouts`)
        self.made: tuple[int, int] | None = None  # the lengths of `recorded` and `slotted` the arrays were made of
        self.per_mix: dict[str, Any] = {}
        self.twin_slots: dict[int, tuple[int, int]] = {}  # per mix with a slot (when twins are shared): slot, support
        self.covers: dict[tuple[int, int], bool] = {}  # per two support ids: the first's GPU types include the other's
        # the probes' results are kept per slot: one column per mix that some GPU type supports, taken in order
        # (a search of millions of mixes runs a fifth of them), in chunks of SLOT_CHUNK slots added as slots are
        # taken (no copy on growth) and read chunk by chunk when the scan is done (plan/fit_test.py)
        self.slots = 0
        self.width = max(1, min(nm, SLOT_CHUNK))
        self.margin = margin
        self.chunks: list[_Chunk] = []
        self.terms: dict[str, Any] = {}  # the fitting probes' batch terms (TERMS: phases x probes), "row" per slot
        self.signatures: dict[tuple, int] = {}
        # the Mix fields of the compute dimensions, read at once (a tuple: one-to-one with the dimensions' values)
        self.compute_key = _fields_of([f for d in space.dimensions if d.affects_compute for f in d.mix_fields])
        self.gpu_key, self.layout_key = _fields_of(GPU_FIELDS), _fields_of(LAYOUT_FIELDS)
        self.probes = Probes(self.seq, space.mix)  # every probe, evaluated together when the scan is done (settle)
        self.policies: dict = {}  # memory_models' activation policies per distinct POLICY_FIELDS value
        self.floors: dict = {}  # StateFloor (and its `at` per GPU count) per distinct value of the fields it reads
        self.refused: dict = {}  # refusal per distinct value of the fields it reads (all but REFUSAL_FREE)
        self.refusal_key = _fields_of([f.name for f in fields(Mix) if f.name not in REFUSAL_FREE])
        self.floor_key = _fields_of([f.name for f in fields(Mix) if f.name not in FLOOR_FREE])
        self.probed: dict[int, int] = {}  # per slot x GPU counts + GPU count index: the probe's model row
        self.pending: list[int] = []  # per probe not settled yet: slot, GPU count index, support id (flat)
        self.on_of: Any = []  # per support id: supported per GPU type (an array once the scan is done)
        self.rooms: Any = []  # per support id: the largest capacity per GPU count
        self.twin_offset = twin_offsets(space) if share_twins else {}
        self.block_of_world = [np.flatnonzero(self.w_of == x) for x in range(len(worlds))]
        self.layouts: dict[tuple, tuple[list[int], int]] = {}  # per distinct LAYOUT_FIELDS value: runs, layout id
        self.gpu_support: dict[tuple, Any] = {}  # per distinct GPU_FIELDS value: room, support id (`on_of`)
        self.worlds = worlds
        self.room = np.full((len(worlds), len(gpus)), -np.inf)  # largest capacity per GPU count and type
        for b in range(nb):
            w, g = self.w_of[b], self.g_of[b]
            self.room[w, g] = max(self.room[w, g], self.usable[b])

    def _comm(self, mix: Any) -> int:
        """The column of this mix's capacities, made (a scenario per block) the first time its COMM_FIELDS are met."""
        key = self.comm_key(mix)
        c = self.comm_ids.get(key)
        if c is None:
            c = self.comm_ids[key] = len(self.cap_columns)
            # device_capacity(with_mix(base, mix)) of every block: its usable bytes less NCCL's
            self.cap_columns.append(self.usable - self.np.array(self.nccl.of_clusters(
                [base.cluster for base in self.bases], mix, [base.recipe.nccl_version for base in self.bases]), float))
            self.cap_at_world.append(self.cap_columns[-1][self.world_block].tolist())
        return c

    def run(self, start: int, n: int, first: Any, mixes: Iterable[Any]) -> None:
        """Scan a run of n mixes from number `start` (`first` the first of `mixes`) that differ only in REFUSAL_FREE
        fields: refusal decided once for all of them."""
        self.searched[start:start + n] = True
        if not self.refuses(first):
            self.in_run = True
            try:
                for k, mix in enumerate(mixes, start):
                    self.mix(k, mix)
            finally:
                self.in_run = False

    def mix(self, k: int, mix: Any) -> None:
        """Scan mix number k (space.mix(k); refusal asked first, but in a run `run` asked for)."""
        if not self.in_run:
            self.searched[k] = True
            if self.refuses(mix):
                return
        mix_k = k
        for name, f in self.accepts.items():
            self.accepted[name].append(f is None or f(mix))
        support = self.gpu_support.get(self.gpu_key(mix))
        if support is None:  # unsupported_reason, whose mix and model rules refusal just read
            model, np = self.space.scenario.model, self.np
            on = np.array([gpu_problem(mix, model, base.cluster.gpu) is None for base in self.on_gpu])
            # per GPU count the largest capacity of the GPU types it runs on
            room = self.room[:, on].max(axis=1).tolist() if on.any() else None
            support = self.gpu_support[self.gpu_key(mix)] = room, len(self.gpu_support)
            self.on_of.append(on)
            self.rooms.append(room or [-np.inf] * len(self.worlds))
        room, sid = support
        self.recorded.append((mix_k, mix_complexity(mix), self.signatures.setdefault(
            self.compute_key(mix), len(self.signatures)), mix.model_parallel, mix.pipeline_parallel, sid))
        if room is None:
            return
        k = self.slots  # the mix's slot: the next free one, a chunk added when the last one is full
        if k == len(self.chunks) * self.width:
            self.chunks.append(_Chunk(self.np, len(self.at_world), len(self.space.blocks), self.width,
                                      self.global_batch is not None, bool(self.margin)))
        self.slots += 1
        comm = self._comm(mix)
        self.slot_comm.append(comm)
        twin = self._twin(mix_k, mix, sid) if self.twin_offset else None
        if self.twin_offset:
            self.twin_slots[mix_k] = k, sid
        key = self.layout_key(mix)
        layout = self.layouts.get(key)
        if layout is None:  # the GPU counts (indices) whose layout check passes, per distinct LAYOUT_FIELDS value
            layout = self.layouts[key] = [w for w, base in enumerate(self.at_world)
                                          if layout_reason(with_mix(base, mix), self.global_batch) is None], \
                len(self.layouts)
        runs = layout[0]
        self.slotted.append((mix_k, layout[1]))
        if not runs:
            return
        floor_key = self.floor_key(mix)
        hit = self.floors.get(floor_key)
        if hit is None:  # shared by the mixes that differ only in FLOOR_FREE fields; its `at` per GPU count index
            hit = self.floors[floor_key] = StateFloor(with_mix(self.at_world[0], mix)), [None] * len(self.worlds)
        floor, by_w = hit
        probe = []
        probed, pending, nw = self.probed, self.pending, len(self.worlds)
        for w in runs:
            at = by_w[w]
            if at is None:
                at = by_w[w] = floor.at(self.worlds[w])
            if at > room[w]:
                continue  # does not fit on any block at this count: no model (peak stays inf, NO_FIT)
            if twin is not None and twin * nw + w in probed:
                self._copy(k, twin, w, sid)
            else:
                probe.append(w)
        if not probe:
            return
        at_world, caps = self.at_world, self.cap_at_world[comm]
        part = probe_part(with_mix(at_world[probe[0]], mix), self.policies, floor)  # what the mix's models share
        rows = self.probes.add_mix(part, mix, [at_world[w] for w in probe], [caps[w] for w in probe], mix_k)
        for w, row in zip(probe, rows):
            probed[k * nw + w] = row  # evaluated with the others (`settle`)
            pending += k, w, sid

    def refuses(self, mix: Any) -> bool:
        """Whether ranking.refusal refuses this mix, decided once per distinct value of the fields its rules read."""
        key = self.refusal_key(mix)
        refused = self.refused.get(key)
        if refused is None:
            refused = self.refused[key] = refusal(self.space.scenario.model, mix) is not None
        return refused

    def _per_mix(self) -> dict[str, Any]:
        """The per-mix arrays of what `recorded`, `accepted` and `slotted` hold (made again when they grew): valid,
        complexity, sig, split (model-parallel group size and pipeline stages), supported (GPU types x mixes), accept
        (per name); slot, comm_of (the mix's column of `cap_columns`), layout_ok (GPU counts x mixes)."""
        if self.made != (len(self.recorded), len(self.slotted)):
            np, nm, nw = self.np, self.space.mixes_per_block, len(self.worlds)
            on_of = np.array(self.on_of, bool).reshape(-1, len(self.on_gpu))
            rec = np.array(self.recorded, np.int64).reshape(-1, 6)
            k = rec[:, 0]
            a = self.per_mix = dict(valid=np.zeros(nm, bool), complexity=np.zeros(nm, np.int16),
                                   sig=np.zeros(nm, np.int32), split=np.ones((2, nm), np.int64),
                                   supported=np.zeros((len(self.on_gpu), nm), bool), slot=np.full(nm, -1, np.int64),
                                   comm_of=np.zeros(nm, np.int64), layout_ok=np.zeros((nw, nm), bool))
            a["valid"][k], a["complexity"][k], a["sig"][k] = True, rec[:, 1], rec[:, 2]
            a["split"][:, k], a["supported"][:, k] = rec[:, 3:5].T, on_of[rec[:, 5]].T
            a["accept"] = {name: np.zeros(nm, bool) for name in self.accepts}
            for name, values in self.accepted.items():
                a["accept"][name][k] = values
            slotted = np.array(self.slotted, np.int64).reshape(-1, 2)
            ks, table = slotted[:, 0], np.zeros((len(self.layouts), nw), bool)
            for runs, lid in self.layouts.values():
                table[lid, runs] = True
            a["slot"][ks], a["comm_of"][ks] = np.arange(len(ks)), self.slot_comm
            a["layout_ok"][:, ks] = table[slotted[:, 1]].T
            self.made = len(self.recorded), len(self.slotted)
        return self.per_mix

    def _twin(self, k: int, mix: Any, sid: int) -> int | None:
        """The slot of an earlier mix with the same memory_mix (a fused attention kernel's FUSED_ATTENTION sibling),
        whose probes this one may copy: equal memory models give equal peaks and solves. Only when every GPU type
        that supports this mix supports the twin, so the twin solved every block this mix needs."""
        offset = self.twin_offset.get(mix.attention)
        hit = None if offset is None else self.twin_slots.get(k - offset)  # a mix some GPU type supports has a slot
        if hit is None:
            return None
        covers = self.covers.get((hit[1], sid))
        if covers is None:
            covers = self.covers[hit[1], sid] = bool((self.on_of[hit[1]] | ~self.on_of[sid]).all())
        return hit[0] if covers else None

    def _copy(self, k: int, twin: int, w: int, sid: int) -> None:
        """A probe at GPU count w that takes the twin's model and scenario (k, twin: their slots; the twin's GPU types
        include this mix's, so its model is this mix's; Probes.copy says why its scenario serves)."""
        nw = len(self.worlds)
        self.probed[k * nw + w] = self.probes.copy(self.probed[twin * nw + w])
        self.pending += k, w, sid

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
            self.terms = dict(zip(TERMS, terms))
            self.terms["row"] = np.full((len(self.worlds), self.slots), -1, np.int64)
            self.terms["row"][w[fit], slot[fit]] = np.arange(len(fit))
        if self.global_batch is not None and len(fit):
            # per fitting probe, the blocks at its GPU count (-1 pads the counts with fewer blocks) and their capacity
            # where its mix runs on the block's GPU type; PROBE_CHUNK probes at a time (no temporary of tens of MB)
            table = np.full((len(self.block_of_world), max(len(b) for b in self.block_of_world)), -1, np.int64)
            for x, blocks in enumerate(self.block_of_world):
                table[x, :len(blocks)] = blocks
            full, slot_comm = np.stack(self.cap_columns, axis=1), np.array(self.slot_comm, np.int64)  # blocks x columns
            gets = [(full, lambda ch: ch.fixed_peak)] + [(full * (1.0 - self.margin), lambda ch: ch.safe_fixed_peak)
                                                         ] * bool(self.margin)
            for some in (fit[at:at + PROBE_CHUNK] for at in range(0, len(fit), PROBE_CHUNK)):
                blocks = table[w[some]]
                runs = (blocks >= 0) & np.take_along_axis(self.on_of[sid[some]], self.g_of[blocks], axis=1)
                comm = slot_comm[slot[some]][:, None]  # each probe's capacity column
                p, j = np.nonzero(runs)
                for caps, get in gets:
                    cells = np.where(runs, caps[blocks, comm], np.nan)
                    value = self.probes.fixed_batch_peaks(np, some, cells, self.global_batch, self.exact_peaks)
                    self._scatter(get, slot[some][p], lambda at: (blocks[p[at], j[at]],), value[p, j])
        self.pending = []
        self.probes, self.probed = Probes(self.seq, self.space.mix), {}  # the settled models are not read again
        # nor the pass's memos (100k objects the garbage collector would walk; a pass that goes on makes them again)
        self.floors, self.policies = {}, {}

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


PER_MIX = ("valid", "complexity", "sig", "split", "supported", "accept", "slot", "comm_of", "layout_ok")
"""Scan's per-mix arrays, read as attributes (`_per_mix` says what each holds)."""
for _name in PER_MIX:
    setattr(Scan, _name, property(lambda self, name=_name: self._per_mix()[name]))


COMM_FIELDS = NCCL_MIX_FIELDS
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
        self.peak = np.full((worlds, width), np.inf)
        self.fixed_peak = np.full((blocks, width), np.inf) if fixed else None
        self.safe_fixed_peak = np.full((blocks, width), np.inf) if fixed and margin else self.fixed_peak


def _fields_of(names: Sequence[str]) -> Callable[[Any], tuple]:
    """A function giving these fields of a mix as a tuple (operator.attrgetter's, which gives a bare value for one)."""
    if len(names) > 1:
        return attrgetter(*names)
    return lambda mix: tuple(getattr(mix, f) for f in names)
