"""A search's memory probes, recorded as the scan meets them and evaluated together (`Probes`): each probe's peak
at micro-batch 1, batch terms and fixed-batch peaks over numpy arrays of every probed model (estimate/memory_arrays.py,
estimate/memory_columns.py), with memory_probe.MemoryProbe's answers; and which mixes' models read the gradient
accumulation (`reads_accumulation`, `only_forward_gradients`).
"""
from __future__ import annotations

from typing import Callable, Sequence

from ..estimate.memory import MemoryModel, MixPart, models_of
from ..estimate.memory_columns import Columns, columnar
from ..estimate.solvers import BATCH_CAP
from ..spec.mix import Mix
from ..spec.scenario import Scenario, fast_replace
from .layouts import keep_global_batch
from .memory_probe import MemoryProbe, probe_part


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
    (tests/plan/test_probes.py compares them field for field)."""
    return mix.zero_stage == 0


def only_forward_gradients(mix) -> bool:
    """Whether accumulating or not changes only a mix's gradients alive in forward (all of its gradients with,
    none without): without ZeRO (reads_accumulation) and without a trained LM head's gradient (head_gradient's
    early gradient: full fine-tuning without the fused linear loss), so its model without accumulation is the one
    with, gradients_in_forward set to 0 (tests/plan/test_probes.py compares them field for field)."""
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
