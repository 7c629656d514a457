"""Many mixes' memory models on many GPU counts as ModelArrays, without a MemoryModel each: memory.py's models_of
(build_memory_models' per-cluster part) over numpy arrays, one entry per (mix, GPU count), with the same float
operations in the same order, so every number equals the scalar one (tests/estimate/test_memory_columns.py compares
them with ==; a change to models_of or split_states must be made here too, and that test fails until it is).

A search probes hundreds of thousands of such models and reads only their reserved bytes (memory_arrays.py): built one
by one they were most of its pass over the mixes. Only what ModelArrays reads is computed. A mix whose models read
more of the cluster than its shard count (a recipe's init cache, FSDP1's unshard or post-backward stream, an
optimizer fused into backward) is not `columnar`: its models are built one by one.
"""
from __future__ import annotations

from typing import Any, Sequence

from .head_gradient import split_head
from .memory_part import MixPart
from .weight_memory import gathered_weight_bytes
from .memory_arrays import ModelArrays, _rows


def columnar(part: MixPart) -> bool:
    """Whether models_of's branches that Columns leaves out are all off for this mix at every GPU count."""
    mix, rec, m = part.scn.mix, part.scn.recipe, part.scn.model
    if mix.optimizer_in_backward:
        return False
    if mix.method == "qlora" and ((rec.init_layer_clones and not m.is_moe) or rec.init_quantize_bytes_per_weight):
        return False  # an init cache (reserved_floor), at one shard
    # FSDP1's init cache, unshard and post-backward pools (shard_grad_op's held units Columns makes)
    return mix.fsdp is None or not (rec.fsdp1_sync_init or rec.fsdp1_unshard_stream or rec.fsdp1_post_backward_stream)


FIELDS = ("mp", "num_w", "num_g", "num_o", "num_t4", "kbit", "bucket", "ot1", "f", "host", "wt", "bt", "held", "sw",
          "sg", "so", "off_opt", "off_params", "ddp", "in_forward", "has_bucket", "has_ot1", "has_ot2", "split", "is_host",
          "ckpt", "offload")
"""_numbers' values per mix, in order: numbers, then flags (read as != 0)."""


class Columns:
    """Probes recorded a mix at a time (`add`: its MixPart, which columnar accepts, and GPU counts), their models'
    arrays made at once (`arrays`). What the arrays read of a part is taken when it is added, so the parts (a search
    adds hundreds of thousands) need not be kept."""

    def __init__(self) -> None:
        self.numbers: list[tuple] = []  # per part: its FIELDS (_numbers)
        self.heads: list = []  # per part: its head gradient, as split_states splits it
        self.acts: list = []  # per part: its activation coefficients
        self.allocators: list = []  # per part: its allocator model
        self.split: dict[tuple, Any] = {}  # (head gradient, share) -> the split head: one object per distinct value
        self.part_of: list[int] = []
        self.world: list[int] = []

    def __len__(self) -> int:
        return len(self.world)

    def add(self, part: MixPart, worlds: Sequence[int]) -> None:
        self.part_of += [len(self.numbers)] * len(worlds)
        self.numbers.append(_numbers(part))
        head = part.head
        if part.share != 1.0 or _host(part.scn.mix):  # as split_states splits it, once per distinct head and share
            # (equal heads split equally: split_head multiplies each of their fields by the share)
            key = head, part.share
            split = self.split.get(key)
            head = split if split is not None else self.split.setdefault(key, split_head(head, part.share))
        self.heads.append(head)
        self.acts.append(part.acts)
        self.allocators.append(part.allocator)
        self.world += worlds

    def arrays(self, np) -> ModelArrays:
        """ModelArrays of every recorded probe, in order (the fields models_of gives them, split by the layout)."""
        p = np.array(self.part_of, np.int64)
        table = np.array(self.numbers, float).reshape(len(self.numbers), len(FIELDS))
        v = {name: table[:, i][p] for i, name in enumerate(FIELDS)}
        b = {name: v[name] != 0 for name in FIELDS[FIELDS.index("sw"):]}
        n = np.array(self.world, np.int64) // v["mp"].astype(np.int64)  # models_of's n: the data-parallel shards
        one = np.ones(len(n), np.int64)
        shard_w, shard_g, shard_o = (np.where(b[k], n, one) for k in ("sw", "sg", "so"))
        # sharded_states
        weights = v["num_w"] / shard_w
        grads = v["num_g"] / shard_g
        optimizer = v["num_o"] / shard_o
        optimizer = np.where(b["off_opt"], 0.0, optimizer)  # (the host bytes: not read here)
        weights = np.where(b["off_params"], 0.0, weights) + v["kbit"]
        # models_of
        grads = np.where(b["ddp"] & (n > 1), grads * 2.0, grads)
        grads_fwd = np.where(b["in_forward"], grads, 0.0)
        grads = np.where(b["has_bucket"], grads + v["bucket"], grads)
        grads_fwd = np.where(b["has_bucket"], grads_fwd + v["bucket"], grads_fwd)
        opt_transient = np.where(b["has_ot1"], 0.0 + v["ot1"] / shard_o, 0.0)
        opt_transient = np.where(b["has_ot2"], opt_transient + v["num_t4"] / shard_o, opt_transient)
        # split_states
        f, split = v["f"], b["split"]
        weights = np.where(split, weights * f, weights)
        host = b["is_host"]  # FSDP's CPU offload: two blocks' unsharded gradients
        grads_fwd = np.where(split, np.where(host, 0.0, grads_fwd * f), grads_fwd)
        host = np.where(host, grads * f * n * v["host"], grads * f)
        grads = np.where(split, host, grads)
        optimizer = np.where(split, optimizer * f, optimizer)
        opt_transient = np.where(split, opt_transient * f, opt_transient)
        zero = np.zeros(len(n))
        held = np.where(n > 1, v["held"], 0.0)  # fsdp1_stream_bytes: shard_grad_op's units on the all-gather's stream
        columns = dict(weights=weights, optimizer=optimizer, weight_transient=v["wt"], gradients_in_forward=grads_fwd,
                       gradients=grads, block_transient=v["bt"], optimizer_transient=opt_transient,
                       stream_gathered=held, stream_pool=held, reserved_floor=zero, small_pool_step=zero,
                       gradient_pool=zero)
        tables = []
        for objects in (self.acts, self.heads, self.allocators):
            which, distinct = _rows(np, objects)
            tables.append((which[p], distinct))
        return ModelArrays.of_columns(np, columns, b["ckpt"], b["offload"], *tables)


def _host(mix) -> bool:
    """FSDP's CPU offload: split_states' two blocks' unsharded gradients."""
    return mix.fsdp is not None and mix.offload == "optimizer+params"


def _numbers(part: MixPart) -> tuple:
    """One mix's FIELDS: models_of's and split_states' expressions that read no shard count."""
    scn = part.scn
    m, mix = scn.model, scn.mix
    trainable, per, kbit, f = part.trainable, part.per, part.kbit, part.share
    stage, deepspeed, offload = mix.shard_stage, mix.zero_stage > 0, mix.offload
    host = _host(mix)
    split = f != 1.0 or host
    bucket = deepspeed and stage >= 2
    return (mix.model_parallel, part.frozen - kbit + trainable * per.weight, trainable * per.gradient,
            trainable * per.optimizer, trainable * 4.0, kbit,
            min(trainable, m.arch.hidden_size ** 2) * per.gradient * 2 if bucket else 0.0,
            trainable * (2.0 if per.low_states else 4.0), f,
            min(m.largest_layer_params() / m.total_params * 2, 1.0) if host else 0.0,
            part.transient * f if split else part.transient, part.block * f if split else part.block,
            gathered_weight_bytes(scn) if mix.fsdp == "shard_grad_op" else 0.0,
            stage == 3 or mix.fsdp is not None, stage >= 2, stage >= 1, offload in ("optimizer", "optimizer+params"),
            offload == "optimizer+params", stage == 0, part.in_forward, bucket,
            offload == "none" and mix.optimizer in ("adamw",) and not scn.recipe.adamw_fused,
            deepspeed and mix.precision in ("bf16-mixed", "fp16-mixed") and offload == "none", split, host,
            part.checkpointing, mix.activation_offload)
