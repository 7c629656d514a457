"""The space recommend searches: dimensions declared once, every candidate numbered in one fixed order.

A candidate is a block (one GPU type at one GPU count) and a mix. Mix dimensions are declared in
`MIX_DIMENSIONS`; adding one (a parallel degree, FP8, compile) is a `SearchSpace` field plus one
`MixDimension` entry, and the search, the tie order, the explanation and the bounds pick it up. Candidates are
numbered block-major, then by mix in `itertools.product` order of the dimensions: the order rows were always
listed in, which breaks ties between equal ranking keys.

What a new dimension must declare: `affects_compute=False` only if micro_batch_ops ignores it. If its validity
depends on the GPU count (a tensor x pipeline degree that must divide it), it goes into plan/layouts.py's check,
which classify.py runs per GPU count (tests/plan/test_bounds.py fails until it does). An empty SearchSpace tuple
keeps the scenario's value.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Collection, Iterator, Sequence

from ..errors import FtscopeError
from ..estimate.memory import FUSED_ATTENTION, memory_mix
from ..spec.hardware import GpuSpec
from ..spec.mix import Mix
from ..spec.scenario import Scenario, fast_replace

SHARDING = ((0, None), (1, None), (2, None), (3, None), (0, "full_shard"), (0, "shard_grad_op"))
ENGINES: dict[str, tuple[tuple[int, str | None], ...]] = {
    "deepspeed": tuple(s for s in SHARDING if s[1] is None),
    "fsdp": tuple(s for s in SHARDING if s[1] is not None),
}
"""`recommend --engine`: the sharding values each launcher runs. deepspeed: ZeRO 0-3 (stage 0 is DeepSpeed's
plain data parallelism, written with a stage-0 ds_config.json); fsdp: torch FSDP2's strategies."""
NODE_SIZE = 8
"""GPUs per server in the layouts recommend builds; a larger count spans several such nodes."""


@dataclass(frozen=True)
class SearchSpace:
    """The mix values recommend enumerates, one tuple per dimension (the scenario's LoRA rank and targets,
    precision and top-k are kept)."""

    methods: tuple[str, ...] = ("full", "lora", "qlora")
    gradient_checkpointing: tuple[bool, ...] = (False, True)
    sharding: tuple[tuple[int, str | None], ...] = SHARDING
    """(zero_stage, fsdp) pairs: DeepSpeed ZeRO 0-3 or torch FSDP2."""
    offload: tuple[str, ...] = ("none", "optimizer", "optimizer+params")
    attention: tuple[str, ...] = ("eager", "sdpa", "flash")
    optimizer: tuple[str, ...] = ("adamw", "adamw_8bit")
    experts_backend: tuple[str, ...] = ("eager", "batched_mm", "grouped_mm", "modules")
    """Searched for MoE models only; dense models keep the scenario's value."""
    tensor_parallel: tuple[tuple[int, bool], ...] = ()
    """(tensor_parallel, sequence_parallel) pairs. Empty (the default): the scenario's layout is kept; LAYOUTS
    searches 1, 2, 4, 8 with sequence parallelism on."""
    pipeline_parallel: tuple[int, ...] = ()
    """Pipeline stages (1F1B); empty: the scenario's."""
    context_parallel: tuple[int, ...] = ()
    """Context-parallel degrees (the scenario's implementation); empty: the scenario's."""
    expert_parallel: tuple[int, ...] = ()
    """Expert-parallel degrees, MoE models only; empty: the scenario's."""


def for_engine(space: SearchSpace, engine: str | None) -> SearchSpace:
    """The space restricted to one launcher's sharding values (None: unrestricted). The restriction is an
    ordinary SearchSpace, so the pruned search and --exhaustive see the same space and agree."""
    if engine is None:
        return space
    if engine not in ENGINES:
        raise FtscopeError(f"--engine must be one of {', '.join(ENGINES)}; got {str(engine)[:40]!r}")
    kept = tuple(s for s in space.sharding if s in ENGINES[engine])
    if not kept:
        raise FtscopeError(f"--engine {engine}: the search space has no {engine} sharding value "
                           f"(it searches {list(space.sharding)})")
    return replace(space, sharding=kept)


@dataclass(frozen=True)
class MixDimension:
    """How one SearchSpace field becomes Mix fields, and what the search may assume about it."""

    space_field: str
    mix_fields: tuple[str, ...]
    """The Mix fields one value sets (a tuple value sets several, like sharding's (zero_stage, fsdp))."""
    label: str
    """Its name in the explanation ("gradient checkpointing")."""
    show: Callable[[Any], str]
    """A value in words ("with checkpointing")."""
    moe_only: bool = False
    """Only MoE models search it; dense models keep the scenario's value."""
    affects_compute: bool = True
    """False only where the FLOPs of a micro-batch (estimate.compute.micro_batch_ops) do not read it: then
    mixes differing only here share one time lower bound. New dimensions default to True (always safe)."""

    def get(self, mix: Mix) -> Any:
        values = tuple(getattr(mix, f) for f in self.mix_fields)
        return values if len(values) > 1 else values[0]

    def assign(self, value: Any) -> dict[str, Any]:
        return dict(zip(self.mix_fields, value)) if len(self.mix_fields) > 1 else {self.mix_fields[0]: value}


_METHOD_WORDS = {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA"}

MIX_DIMENSIONS: tuple[MixDimension, ...] = (
    MixDimension("methods", ("method",), "method", lambda v: _METHOD_WORDS[v]),
    MixDimension("gradient_checkpointing", ("gradient_checkpointing",), "gradient checkpointing",
                 lambda v: "with checkpointing" if v else "without checkpointing"),
    MixDimension("sharding", ("zero_stage", "fsdp"), "sharding",
                 lambda v: f"FSDP {v[1]}" if v[1] else (f"ZeRO-{v[0]}" if v[0] else "no sharding (DDP)"),
                 affects_compute=False),
    MixDimension("offload", ("offload",), "offload", lambda v: "no offload" if v == "none" else f"{v} offload",
                 affects_compute=False),
    MixDimension("attention", ("attention",), "attention", lambda v: f"{v} attention"),
    MixDimension("optimizer", ("optimizer",), "optimizer", lambda v: v, affects_compute=False),
    MixDimension("experts_backend", ("experts_backend",), "experts backend", lambda v: f"experts {v}", moe_only=True),
    MixDimension("tensor_parallel", ("tensor_parallel", "sequence_parallel"), "tensor parallelism",
                 lambda v: f"tensor parallel {v[0]}" + (" + sequence parallel" if v[1] else "") if v[0] > 1
                 else "no tensor parallelism"),
    MixDimension("pipeline_parallel", ("pipeline_parallel",), "pipeline parallelism",
                 lambda v: f"{v} pipeline stages" if v > 1 else "no pipeline"),
    MixDimension("context_parallel", ("context_parallel",), "context parallelism",
                 lambda v: f"context parallel {v}" if v > 1 else "no context parallelism"),
    MixDimension("expert_parallel", ("expert_parallel",), "expert parallelism",
                 lambda v: f"expert parallel {v}" if v > 1 else "no expert parallelism", moe_only=True),
)
assert {d.space_field for d in MIX_DIMENSIONS} == {f.name for f in fields(SearchSpace)}, "declare every dimension"

LAYOUTS = dict(tensor_parallel=((1, False), (2, True), (4, True), (8, True)), pipeline_parallel=(1, 2, 4, 8, 16),
               context_parallel=(1, 2), expert_parallel=(1, 2, 4, 8, 16, 32, 64))
"""The parallel layouts `recommend --layouts` searches (SearchSpace(**LAYOUTS)): tensor parallelism within a node
with sequence parallelism on, 1F1B pipelines, context and expert parallelism. Which ones a block can run (degrees
that divide its GPUs, the heads, the layers, the experts) plan/layouts.py decides per GPU count."""


def with_mix(base: Scenario, mix: Mix) -> Scenario:
    """`replace(base, mix=mix)` (spec.scenario.fast_replace): the search builds one per mix and GPU type or count."""
    return fast_replace(base, mix=mix)


def _mix_with(values: dict[str, Any], changes: dict[str, Any]) -> Mix:
    new = object.__new__(Mix)
    new.__dict__.update(values)
    new.__dict__.update(changes)
    return new


def gpu_counts(limit: int) -> list[int]:
    """1, 2, 4, 8 (then every power of two) up to the budget, and the budget itself when it is above 8."""
    out = [1 << i for i in range(limit.bit_length()) if 1 << i <= limit]
    if limit not in out and limit > NODE_SIZE:
        out.append(limit)
    return out


def layout(count: int, node_size: int) -> tuple[int, int]:
    """(GPUs per node, nodes) for a GPU count: whole nodes above the node size, one node otherwise."""
    if count > node_size and count % node_size == 0:
        return node_size, count // node_size
    return count, 1


@dataclass(frozen=True)
class Block:
    """One GPU type at one GPU count: the slice of the space that holds every mix."""

    target: int
    """Which GPU budget (--gpus entry) it comes from."""
    gpu: GpuSpec
    world: int
    base: Scenario
    """The scenario on this GPU type and layout (its mix is replaced per candidate)."""


class Space:
    """Every candidate of a recommend search: blocks x mixes, numbered in listing order."""

    def __init__(self, scn: Scenario, targets: Sequence[tuple[GpuSpec, int]], space: SearchSpace) -> None:
        self.scenario = scn
        node_size = scn.cluster.gpus_per_node if scn.cluster.nodes > 1 else NODE_SIZE
        self.blocks: list[Block] = []
        for t, (gpu, limit) in enumerate(targets):
            for count in gpu_counts(limit):
                per_node, nodes = layout(count, node_size)
                self.blocks.append(Block(t, gpu, count, scn.with_(gpu=gpu, gpus_per_node=per_node, nodes=nodes)))
        self.dimensions = tuple(d for d in MIX_DIMENSIONS if scn.model.is_moe or not d.moe_only)
        fixed = {d.space_field: (d.get(scn.mix),) for d in MIX_DIMENSIONS if d not in self.dimensions}
        self.values: tuple[tuple[Any, ...], ...] = tuple(
            fixed.get(d.space_field) or tuple(getattr(space, d.space_field)) or (d.get(scn.mix),)
            for d in MIX_DIMENSIONS)
        self.radix = [len(v) for v in self.values]
        self.mixes_per_block = 1
        for r in self.radix:
            self.mixes_per_block *= r

    def __len__(self) -> int:
        return len(self.blocks) * self.mixes_per_block

    def mix(self, k: int) -> Mix:
        """The k-th mix (itertools.product order over MIX_DIMENSIONS)."""
        changes: dict[str, Any] = {}
        for d, vals, i in zip(MIX_DIMENSIONS, self.values, self._digits(k)):
            changes.update(d.assign(vals[i]))
        return _mix_with(self.scenario.mix.__dict__, changes)

    def mixes(self) -> Iterator[Mix]:
        """Every mix in order (faster than mix(k) one by one)."""
        base = self.scenario.mix.__dict__
        # each value's Mix fields once (a space of millions of mixes lists each value millions of times)
        assigned = [[d.assign(v) for v in values] for d, values in zip(MIX_DIMENSIONS, self.values)]
        # the fields of every dimension but the last merged once per prefix (the last one varies fastest)
        for combo in itertools.product(*assigned[:-1]):
            prefix = dict(base)
            for fields_ in combo:
                prefix.update(fields_)
            for last in assigned[-1]:
                new = object.__new__(Mix)
                new.__dict__.update(prefix)
                new.__dict__.update(last)
                yield new

    def mix_runs(self, free: Collection[str]) -> Iterator[tuple[int, int, Mix, Callable[[], Iterator[Mix]]]]:
        """The mixes of `mixes`, in order, in runs that differ only in the trailing dimensions whose Mix fields are
        all in `free`: per run (number of its first mix, its length, its first mix, a function listing its mixes), so
        that what reads none of those fields is decided once per run (the runs are single mixes when the last
        dimension reads some field outside `free`)."""
        base = self.scenario.mix.__dict__
        assigned = [[d.assign(v) for v in values] for d, values in zip(MIX_DIMENSIONS, self.values)]
        cut = len(MIX_DIMENSIONS)
        while cut > 1 and all(f in free for f in MIX_DIMENSIONS[cut - 1].mix_fields):
            cut -= 1
        suffixes = [{k: v for part in combo for k, v in part.items()} for combo in itertools.product(*assigned[cut:])]
        for k, combo in enumerate(itertools.product(*assigned[:cut])):
            prefix = dict(base)
            for fields_ in combo:
                prefix.update(fields_)

            def run(prefix=prefix) -> Iterator[Mix]:
                for last in suffixes:
                    new = object.__new__(Mix)
                    new.__dict__.update(prefix)
                    new.__dict__.update(last)
                    yield new
            yield k * len(suffixes), len(suffixes), next(run()), run

    def coords(self, idx: int) -> tuple[int, int]:
        """(block, mix) of a candidate number."""
        return divmod(idx, self.mixes_per_block)

    def candidate(self, idx: int) -> Scenario:
        b, k = self.coords(idx)
        return with_mix(self.blocks[b].base, self.mix(k))

    def neighbours(self, idx: int) -> list[int]:
        """Candidates that differ from this one in exactly one dimension (a mix field, the GPU count or the
        GPU type): what the explanation compares the winner with."""
        b, k = self.coords(idx)
        mine = self.blocks[b]
        m = self.mixes_per_block
        out = []
        twins = []  # blocks on the same GPU type and count (a GPU named twice in --gpus)
        for j, other in enumerate(self.blocks):
            same_gpu, same_count = other.gpu.key == mine.gpu.key, other.world == mine.world
            if same_gpu and same_count:
                twins.append(j)
            elif same_gpu or same_count:
                out.append(j * m + k)
        digits = self._digits(k)
        for pos, r in enumerate(self.radix):
            for i in range(r):
                if i != digits[pos]:
                    kk = self._number(digits[:pos] + [i] + digits[pos + 1:])
                    out.extend(j * m + kk for j in twins)
        return out

    def _digits(self, k: int) -> list[int]:
        digits = []
        for r in reversed(self.radix):
            k, i = divmod(k, r)
            digits.append(i)
        return digits[::-1]

    def _number(self, digits: Sequence[int]) -> int:
        k = 0
        for r, i in zip(self.radix, digits):
            k = k * r + i
        return k


def twin_offsets(space: Space) -> dict[str, int]:
    """Per fused attention kernel the space lists after FUSED_ATTENTION: how many mixes back its FUSED_ATTENTION
    sibling is (the mixes differ only in that digit, and equal memory_mix gives them equal memory models: plan/scan.py
    copies the sibling's probes). Empty when the space does not search FUSED_ATTENTION."""
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
