"""Many memory models' reserved bytes at once: MemoryModel.reserved_totals and peak_bytes over numpy arrays.

A search probes hundreds of thousands of memory models (one per mix and GPU count) at a few batch shapes each;
one model at a time that is most of its scan. `ModelArrays` stacks the models' fields and evaluates every phase
point of memory.py's `_points` and `_reserved_of` with the same float operations in the same order, a branch
(checkpointing, activation offload, a trained or tied head, a chunked loss) taken per model by selecting
between both sides. So each number equals the scalar one exactly (tests/estimate/test_memory_arrays.py
compares them with ==); a change to the scalar formulas must be made here too, and that test fails until it is.
"""
from __future__ import annotations

from itertools import chain
from operator import attrgetter
from typing import Any, Sequence

from ..spec.hardware import GIB
from .memory import MemoryModel

ACTS = ("saved_per_token", "saved_per_token_quadratic", "layer_per_token", "layer_per_token_quadratic",
        "layer_ffn_per_token", "forward_transient_per_token", "checkpoint_per_token", "head_per_token",
        "logits_saved_per_token", "logits_forward_extra_per_token", "logits_backward_extra_per_token",
        "logits_held_per_token", "loss_tile_per_token", "loss_tile_tokens", "checkpoint_layer_per_token")
"""The ActivationCoefficients fields _points reads."""
MODEL = ("weights", "optimizer", "weight_transient", "gradients_in_forward", "gradients", "block_transient",
         "optimizer_transient", "stream_gathered", "stream_pool", "reserved_floor", "small_pool_step",
         "gradient_pool")
HEAD = ("weight", "chunks", "logits_grad_per_token", "in_blocks", "at_last_block", "at_embedding")


class ModelArrays:
    """The fields the reserved bytes read, one array entry per model (models sharing activation coefficients,
    head gradient and allocator share their rows of those tables)."""

    def __init__(self, np, models: Sequence[MemoryModel]) -> None:
        n = len(models)
        fields = attrgetter(*MODEL, "checkpointing", "offload_activations")
        width = len(MODEL) + 2
        values = np.fromiter(chain.from_iterable(map(fields, models)), float, n * width).reshape(n, width)
        self._fill(np, {name: values[:, i] for i, name in enumerate(MODEL)}, values[:, -2] != 0, values[:, -1] != 0,
                   *(_rows(np, [getattr(m, attr) for m in models]) for attr in ("acts", "head_grad", "allocator")))

    @classmethod
    def of_columns(cls, np, columns: dict[str, Any], checkpointing, offload, acts: tuple, heads: tuple,
                   allocators: tuple) -> "ModelArrays":
        """The arrays of models given field by field: MODEL's columns, checkpointing and activation offload as bool
        arrays, and per table (activation coefficients, head gradient, allocator) the row of each model and the
        objects of the rows (memory_columns.py builds them without a MemoryModel each)."""
        out = object.__new__(cls)
        out._fill(np, columns, checkpointing, offload, acts, heads, allocators)
        return out

    def _fill(self, np, columns, checkpointing, offload, acts, heads, allocators) -> None:
        self.np = np
        self.n = len(checkpointing)
        for name in MODEL:
            setattr(self, name, columns[name])
        self.checkpointing, self.offload = checkpointing, offload
        for (which, distinct), names, prefix in ((acts, ACTS, ""), (heads, HEAD, "hg_")):
            table = np.fromiter(chain.from_iterable(map(attrgetter(*names), distinct)), float,
                                len(distinct) * len(names)).reshape(len(distinct), len(names))
            for i, f in enumerate(names):
                setattr(self, prefix + f, table[which, i])
        which, allocators = allocators
        table = np.array([[a.workspace_gib, a.fragmentation, a.fragmentation_checkpointed, a.pinned]
                          for a in allocators], float).reshape(len(allocators), 4)
        workspace, frag, frag_ckpt, pinned = (table[which, i] for i in range(4))
        self.workspace = workspace * GIB
        fr = np.where(self.checkpointing, frag_ckpt, frag)
        self.fragmentation = fr, np.minimum(fr, pinned)  # (reserved, held): _reserved_of's fr
        self.least_reserved = self.reserved_floor + self.small_pool_step + self.stream_pool + self.gradient_pool

    def joined(self, rows, other: "ModelArrays", other_rows) -> "ModelArrays":
        """The arrays of these models at `rows` and the other's at `other_rows` (together every row, once)."""
        np = self.np
        out = object.__new__(ModelArrays)
        out.np, out.n = np, self.n + other.n
        for name, value in self.__dict__.items():
            if name == "fragmentation":
                out.fragmentation = tuple(_join(np, out.n, (rows, v), (other_rows, o))
                                          for v, o in zip(value, other.fragmentation))
            elif hasattr(value, "shape") and value.shape == (self.n,):
                out.__dict__[name] = _join(np, out.n, (rows, value), (other_rows, getattr(other, name)))
        return out

    def subset(self, rows) -> "ModelArrays":
        """The arrays of these rows (indices into the models), in that order."""
        out = object.__new__(ModelArrays)
        for name, value in self.__dict__.items():
            if name == "fragmentation":
                value = tuple(v[rows] for v in value)
            elif hasattr(value, "shape") and value.shape == (self.n,):
                value = value[rows]
            out.__dict__[name] = value
        out.n = len(rows)
        return out

    def points(self, batch, seq) -> list[tuple[Any, Any, Any, Any]]:
        """memory.py's _points as (activations, temporary, allocated, gradients) arrays per point (`batch`: a number
        or one per model), the ten points in order; the last is the optimizer step's."""
        np, a = self.np, self
        t = batch * seq
        head = a.head_per_token * t + a.logits_saved_per_token * t
        ckpt = self.checkpointing
        saved = np.where(ckpt, a.checkpoint_per_token * t + head,
                         a.saved_per_token * t + a.saved_per_token_quadratic * t * seq + head)
        layer = a.layer_per_token * t + a.layer_per_token_quadratic * t * seq
        kept = np.where(ckpt, a.checkpoint_layer_per_token * t, layer)
        saved = np.where(self.offload, np.minimum(saved - head, 2 * kept) + head, saved)
        static = self.weights + self.optimizer
        wt = self.weight_transient
        g_fwd = self.gradients_in_forward
        g_end = np.maximum(self.gradients, g_fwd)
        tile = a.loss_tile_per_token * np.minimum(t, a.loss_tile_tokens)
        held = a.logits_held_per_token * t
        fwd_act = saved + a.logits_forward_extra_per_token * t + tile
        bwd_act = saved + a.logits_backward_extra_per_token * t + tile + held
        after_head = saved - a.logits_saved_per_token * t + held
        att_bwd = a.layer_per_token_quadratic * t * seq
        rec_act = np.where(ckpt, after_head + np.maximum(layer, layer - a.layer_ffn_per_token * t + att_bwd),
                           after_head + att_bwd)
        end_act = layer + held
        bt = wt + self.block_transient
        in_block = after_head - held - a.head_per_token * t + a.forward_transient_per_token * t
        g_rec, g_last = g_fwd + a.hg_in_blocks, g_end + a.hg_at_last_block
        loss_start = (bwd_act, wt, static + g_fwd + bwd_act + wt, g_fwd)
        heads = self._head_points(t, saved, held, static, g_fwd, g_end, wt, loss_start)
        zero = np.zeros(self.n)
        return [(fwd_act, wt, static + g_fwd + fwd_act + wt, g_fwd),
                (in_block, bt, static + g_fwd + in_block + bt, g_fwd),
                loss_start, *heads,
                (rec_act, bt, static + g_rec + rec_act + bt, g_rec),
                (end_act, bt, static + g_last + end_act + bt, g_last),
                (zero, self.optimizer_transient, static + self.gradients + self.optimizer_transient, self.gradients)]

    def _head_points(self, t, saved, held, static, g_fwd, g_end, wt, loss_start) -> list[tuple[Any, Any, Any, Any]]:
        """_points' four head points: a frozen head's repeated start of backward, or a trained head's moments (three
        for a chunked loss, one otherwise) and a tied embedding's gradient, padded with the first moment."""
        np, a = self.np, self
        n, h = a.hg_chunks, a.hg_weight
        logits = a.logits_saved_per_token * t
        grad = a.hg_logits_grad_per_token * t / n
        moments = [(logits * (n - 1) / n + grad, h), (logits * (n - 2) / n + grad, 2 * h),
                   (logits * (n - 2) / n, 3 * h)]
        trained = []
        for kept, gh in moments:
            act = saved - logits + kept + held
            trained.append((act, wt, static + g_fwd + gh + act + wt, g_fwd + gh))
        g_emb = g_end + a.hg_at_embedding
        emb = a.hg_at_embedding != 0
        tied = (np.where(emb, 0.0, loss_start[0]), wt, np.where(emb, static + g_emb + wt, loss_start[2]),
                np.where(emb, g_emb, loss_start[3]))
        chunked = n > 1
        first = trained[0]
        order = [first, _pick(np, chunked, trained[1], tied), _pick(np, chunked, trained[2], first),
                 _pick(np, chunked, tied, first)]
        on = h != 0
        return [_pick(np, on, p, loss_start) for p in order]

    def totals(self, batch, seq, held: bool = True):
        """MemoryModel.reserved_totals (held: True) or the reserved bytes (_reserved_of) of every model: an array of
        points x models."""
        out = list(self._totals(batch, seq, held))
        return self.np.array(out).reshape(len(out), self.n)

    def _totals(self, batch, seq, held: bool = True):
        """`totals`, one point (an array over the models) at a time."""
        np = self.np
        fr = self.fragmentation[1 if held else 0]
        g, pool, ws, gp = self.stream_gathered, self.stream_pool, self.workspace, self.gradient_pool
        pts = self.points(batch, seq)
        for i, (act, temp, allocated, grads) in enumerate(pts):
            last = i == len(pts) - 1
            own = 0.0 if last else g  # the optimizer step gathers nothing on the other stream
            if held:  # what releasing the cache leaves: idle pools go
                yield allocated - own + ws + fr * (act + temp - own) + (0.0 if last else pool)
            else:
                yield allocated - own - np.minimum(grads, gp) + ws + fr * (act + temp - own) + pool + gp

    def peaks(self, batch, seq):
        """MemoryModel.peak_bytes of every model: max(least_reserved, every phase point's total); the points' maximum
        taken a point at a time, as totals(...).max(axis=0) takes it, without the points x models array (tens of MB
        for a search's models, each one fresh pages)."""
        top = None
        for total in self._totals(batch, seq):
            top = total if top is None else self.np.maximum(top, total)
        return self.np.maximum(self.least_reserved, top)


def _rows(np, objects: list) -> tuple[Any, list]:
    """(row of each object, one object per row): the same object gets one row (by identity: a search's models share
    their activation coefficients, head gradient and allocator objects; equal copies just take more rows)."""
    if not objects:
        return np.zeros(0, np.int64), []
    ids = np.fromiter(map(id, objects), np.int64, len(objects))
    _, first, which = np.unique(ids, return_index=True, return_inverse=True)
    return which.reshape(-1), [objects[i] for i in first.tolist()]


def _join(np, n: int, *parts):
    """An array of n entries, each (rows, values) of `parts` written at its rows."""
    out = np.empty(n, parts[0][1].dtype)
    for rows, values in parts:
        out[rows] = values
    return out


def _pick(np, cond, yes: tuple, no: tuple) -> tuple:
    return tuple(np.where(cond, y, n) for y, n in zip(yes, no))
