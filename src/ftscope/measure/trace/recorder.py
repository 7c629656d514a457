"""The recorder that books every storage a traced step creates (bytes, creation and free events, kind) and
attributes FLOPs to phases and layer types; and the balanced router that stands in for data-dependent routing."""
from __future__ import annotations

import math
import weakref
from collections import defaultdict
from typing import Any

from ...errors import FtscopeError
from ..runtime.tracker import DispatchObserver
from .layers import LayerContext


class Rec:
    __slots__ = ("nbytes", "t0", "t1", "phase", "kind")

    def __init__(self, nbytes: int, t0: int, phase: str, kind: str) -> None:
        self.nbytes, self.t0, self.t1, self.phase, self.kind = nbytes, t0, math.inf, phase, kind


class Recorder(DispatchObserver):
    """Books every storage a traced step creates (`Rec`: bytes, creation and free event, phase, kind) and
    attributes the FLOPs the counter sees to (phase, layer type); a dispatch mode while entered."""

    def __init__(self, counter: Any, routing: "BalancedRouting | None", layers: LayerContext) -> None:
        import torch
        from torch.utils._pytree import tree_leaves

        self.torch, self.counter, self.routing, self.layers = torch, counter, routing, layers
        self.tree_leaves = tree_leaves
        aten = torch.ops.aten
        # ops whose output is a weight-sized copy when an input is a parameter (autocast casts, PEFT's W + BA)
        self.copy_ops = {aten._to_copy.default, aten.clone.default, aten.baddbmm.default, aten.add.Tensor,
                         aten.mul.Tensor}
        self.dequant_ops = set()
        try:
            self.dequant_ops.add(torch.ops.bitsandbytes.dequantize_4bit.default)  # packed 4-bit weight -> bf16 copy
        except AttributeError:  # no bitsandbytes here: torch.ops.bitsandbytes is an empty namespace
            pass
        self.live: dict[int, Rec] = {}
        self.refs: dict[int, Any] = {}
        self.recs: list[Rec] = []
        self.t = 0
        self.cur = 0
        self.phase = "setup"
        self.peaks: dict[str, tuple[int, int]] = {}
        self.param_numel: dict[int, int] = {}
        self.flops: dict[tuple[str, str], float] = defaultdict(float)

    # bookkeeping
    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self.peaks[phase] = (self.cur, self.t)

    def track(self, tensor: Any, kind: str) -> Rec | None:
        st = tensor.untyped_storage()
        key = id(st)
        rec = self.live.get(key)
        if rec is not None:
            return rec
        nbytes = st.nbytes()
        rec = Rec(nbytes, self.t, self.phase, kind)
        self.t += 1
        self.live[key] = rec
        self.refs[key] = weakref.ref(st, lambda _r, key=key: self._free(key))
        self.recs.append(rec)
        self.cur += nbytes
        peak = self.peaks.get(self.phase)
        if peak is None or self.cur > peak[0]:
            self.peaks[self.phase] = (self.cur, self.t)
        return rec

    def _free(self, key: int) -> None:
        rec = self.live.pop(key, None)
        self.refs.pop(key, None)
        if rec is not None:
            rec.t1 = self.t
            self.t += 1
            self.cur -= rec.nbytes

    def rec_of(self, tensor: Any) -> Rec | None:
        return self.live.get(id(tensor.untyped_storage()))

    def register_weights(self, tensors: list[Any]) -> None:
        for t in tensors:
            self.track(t, "param")
            self.param_numel[id(t.untyped_storage())] = t.numel()

    def _global_flops(self) -> int:
        return sum(self.counter.flop_counts["Global"].values()) if self.counter is not None else 0

    def _kind(self, func: Any, args: Any) -> tuple[str, int | None]:
        """(kind of the op's new storages, numel a weight copy must have; -1: any)."""
        kind = "recompute" if self.phase == "backward" and self.layers.stack else self.phase
        if self.phase in ("forward", "backward"):
            if func in self.dequant_ops:
                return kind, -1
            if func in self.copy_ops:
                for a in self.tree_leaves(args):
                    if isinstance(a, self.torch.Tensor):
                        n = self.param_numel.get(id(a.untyped_storage()))
                        if n is not None and n > 1:
                            return kind, n
        return kind, None

    def dispatch(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        if self.routing is not None:
            handled = self.routing.handle(func, args)
            if handled is not _NOT_HANDLED:
                return handled
        before = self._global_flops()
        out = func(*args, **kwargs)
        delta = self._global_flops() - before
        if delta:
            # a module's forward running inside backward: a checkpointed block being recomputed (grad mode
            # cannot tell: custom autograd Functions such as bitsandbytes' run their forward without grad)
            phase = "recompute" if self.phase == "backward" and self.layers.stack else self.phase
            self.flops[(phase, self.layers.current(phase))] += delta
        kind, copy_numel = self._kind(func, args)
        for t in self.tree_leaves(out):
            if isinstance(t, self.torch.Tensor) and t.device.type != "meta":
                is_copy = copy_numel is not None and (copy_numel < 0 or t.numel() == copy_numel)
                self.track(t, "wcopy" if is_copy else kind)
        return out


_NOT_HANDLED = object()


class BalancedRouting:
    """Answers the data-dependent ops of transformers' eager expert loop as if routing were perfectly balanced.

    The eager backend loops over the experts a batch hits (`nonzero` on the routing mask) and gathers each
    expert's tokens (`torch.where`): under fake tensors those sizes are unknown. Balanced routing hits every
    expert with tokens x top_k / experts slots, which is also what the estimator assumes; grouped_mm and
    batched_mm need no such help (their shapes do not depend on the routing).
    """

    def __init__(self, experts: int, layers: "LayerContext") -> None:
        import torch

        self.torch = torch
        self.experts = experts
        self.layers = layers
        self.calls = 0
        self.index = 0
        aten = torch.ops.aten
        self.nonzero = aten.nonzero.default
        self.scalar_ops = {aten.is_nonzero.default, aten._local_scalar_dense.default}

    def handle(self, func: Any, args: Any) -> Any:
        torch = self.torch
        if (func is not self.nonzero and func not in self.scalar_ops) or not self.layers.in_experts():
            return _NOT_HANDLED
        if func is self.nonzero:
            x = args[0]
            e = self.experts
            if x.dim() == 1 and x.shape[0] in (e, e + 1):
                return torch.empty((e, 1), dtype=torch.long, device=x.device)
            if x.dim() == 2:
                slots = x.numel()   # (top_k, tokens): each token sits in top_k of the experts' masks
                i = self.calls % e
                self.calls += 1
                share = math.floor((i + 1) * slots / e) - math.floor(i * slots / e)
                return torch.empty((max(share, 0), 2), dtype=torch.long, device=x.device)
            raise FtscopeError(f"data-dependent op nonzero on a {tuple(x.shape)} tensor: not traceable")
        if func in self.scalar_ops and args and args[0].dim() == 0:
            if args[0].dtype == torch.bool:
                return False  # `if expert_idx == num_experts`: the no-expert sentinel is never hit
            if not args[0].dtype.is_floating_point:
                self.index = (self.index + 1) % self.experts  # `expert_mask[expert_idx]`: the next expert
                return self.index
        return _NOT_HANDLED
