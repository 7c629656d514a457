"""Tokens routed to each expert in each MoE layer of a live model, and how unevenly they spread.

`ExpertLoad` reads the top-k indices the router hands to the experts module and keeps the counts on the device
(no host sync per layer). torch is imported inside the functions that need it, never at module import.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

from .hooks import _graph_task_active

@dataclasses.dataclass
class ExpertImbalance:
    """How unevenly tokens spread over experts, per MoE layer."""

    max_over_mean: list[float]
    """Busiest expert's tokens / mean tokens per expert (1.0 = perfectly even; top-k of E: at most E/k)."""
    cv: list[float]
    """Coefficient of variation: population standard deviation (divide by E, not E-1: the experts are the
    whole population, not a sample) / mean."""
    mean_max_over_mean: float
    """max_over_mean averaged over layers."""
    mean_cv: float
    """cv averaged over layers."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def imbalance_of(counts: list[list[int]]) -> ExpertImbalance:
    """Imbalance of a [layers][experts] count matrix (layers with no tokens score 0)."""
    mom, cvs = [], []
    for row in counts:
        n = len(row)
        mean = sum(row) / n if n else 0.0
        if mean == 0:
            mom.append(0.0)
            cvs.append(0.0)
            continue
        var = sum((c - mean) ** 2 for c in row) / n  # population variance: all experts, not a sample
        mom.append(max(row) / mean)
        cvs.append(var**0.5 / mean)
    return ExpertImbalance(
        max_over_mean=mom, cv=cvs,
        mean_max_over_mean=sum(mom) / len(mom) if mom else 0.0, mean_cv=sum(cvs) / len(cvs) if cvs else 0.0,
    )


def _topk_position(module: Any) -> tuple[int, str] | None:
    """(positional index, keyword) of the routed top-k index argument of an experts module's forward, if any."""
    try:
        params = list(inspect.signature(type(module).forward).parameters)  # follows functools.wraps
    except (TypeError, ValueError):
        return None
    for kw in ("top_k_index", "router_indices", "selected_experts", "topk_indices"):
        if kw in params:
            return params.index(kw) - 1, kw  # minus self
    return None


class ExpertLoad:
    """Count tokens routed to each expert in each MoE layer while the model runs forward.

    Hooks the experts module (transformers 5: `*Experts.forward(hidden_states, top_k_index, top_k_weights)`,
    called by the MoE block with the router's top-k indices) with a forward pre-hook. Forward passes re-run
    inside backward by gradient checkpointing are skipped, so each token counts once per step. Padding tokens
    are routed like any other token and are counted. Indices equal to the expert count (a 'dropped' sentinel
    some implementations use) are kept apart in `dropped`.
    """

    def __init__(self, model: Any) -> None:
        import torch

        self._torch = torch
        self.layers: list[str] = []
        """Qualified names of the hooked experts modules, in layer order (rows of `counts`)."""
        self.num_experts: list[int] = []
        self.top_k: int | None = None
        self._counts: Any = None  # [layers, max_experts + 1] int64 on the model's device; last column: dropped
        self._tokens: list[int] = []
        self._handles: list[Any] = []
        for name, m in model.named_modules():
            pos = _topk_position(m)
            n = getattr(m, "num_experts", None)
            if not isinstance(n, int):  # fall back to the config the module was built from
                cfg = getattr(m, "config", None)
                n = next((getattr(cfg, a) for a in ("num_local_experts", "num_experts", "n_routed_experts")
                          if isinstance(getattr(cfg, a, None), int)), None)
            if pos is None or not isinstance(n, int):
                continue
            row = len(self.layers)
            self.layers.append(name)
            self.num_experts.append(n)
            self._tokens.append(0)
            self._handles.append(m.register_forward_pre_hook(self._make_hook(row, n, *pos), with_kwargs=True))

    @property
    def is_moe(self) -> bool:
        return bool(self.layers)

    def _make_hook(self, row: int, n: int, pos: int, kw: str) -> Callable[..., None]:
        torch = self._torch

        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if _graph_task_active(torch):
                return  # gradient-checkpointing recompute: already counted in the real forward
            idx = kwargs.get(kw) if kw in kwargs else (args[pos] if len(args) > pos else None)
            if idx is None:
                return
            with torch.no_grad():
                flat = idx.reshape(-1).long().clamp(0, n)  # n = the dropped sentinel column
                if self._counts is None or self._counts.device != flat.device:
                    self._counts = torch.zeros(len(self.layers), max(self.num_experts) + 1, dtype=torch.long,
                                               device=flat.device)
                # Sentinel values go to column n of this row, then are moved to the last column on read.
                self._counts[row].index_add_(0, flat, torch.ones_like(flat))
            self._tokens[row] += int(idx.shape[0]) if idx.dim() > 1 else int(idx.numel())
            self.top_k = int(idx.shape[-1]) if idx.dim() > 1 else 1

        return hook

    def reset(self) -> None:
        self._counts = None
        self._tokens = [0] * len(self.layers)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> "ExpertLoad":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def counts(self) -> list[list[int]]:
        """[layers][experts] tokens routed (one host sync). Each row sums to tokens x top_k (minus dropped)."""
        if self._counts is None:
            return [[0] * n for n in self.num_experts]
        rows = self._counts.cpu().tolist()
        return [r[:n] for r, n in zip(rows, self.num_experts)]

    def dropped(self) -> list[int]:
        """Per layer, routing slots that pointed at the 'no expert' sentinel."""
        if self._counts is None:
            return [0] * len(self.layers)
        rows = self._counts.cpu().tolist()
        return [r[n] for r, n in zip(rows, self.num_experts)]

    def tokens(self) -> list[int]:
        """Tokens that reached each MoE layer."""
        return list(self._tokens)

    def imbalance(self) -> ExpertImbalance:
        """max/mean and population coefficient of variation of the per-expert counts, per layer."""
        return imbalance_of(self.counts())

    def to_dict(self) -> dict[str, Any]:
        return {
            "layers": self.layers, "num_experts": self.num_experts, "top_k": self.top_k, "tokens": self.tokens(),
            "counts": self.counts(), "dropped": self.dropped(), "imbalance": self.imbalance().to_dict(),
        }
