"""Where the eval set's tokens go: tokens routed to each expert of each MoE layer (ExpertLoad), the share of the
routing weights, and the imbalance statistics (both variance definitions the IISWC figure mixes)."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ...measure.runtime.expert_load import ExpertLoad, imbalance_of
from ...measure.runtime.loop import autocast
from .data import Sample, pad, train_item


@dataclass
class LoadSnapshot:
    """Tokens routed to each expert of each MoE layer over the eval set's queries (prompt + reference answer)."""

    counts: list[list[int]]
    """[layer][expert] routed token slots; each row sums to tokens x top_k."""
    tokens: list[int]
    """Tokens that reached each layer (no padding: queries are batched by length)."""
    queries: int
    top_k: int
    weight_share: list[list[float]]
    """[layer][expert] share of the summed routing weights. With top-k = all experts every count is equal by
    construction; the weights still show which experts the router favours."""
    per_query: list[list[float]] = field(default_factory=list)
    """counts / queries: the IISWC figure's 'average tokens per query routed to each expert'."""
    max_over_mean: list[float] = field(default_factory=list)
    cv: list[float] = field(default_factory=list)
    """Population standard deviation / mean of the counts."""
    var_population: list[float] = field(default_factory=list)
    """Variance of per_query over the layer's E experts, dividing by E."""
    var_sample: list[float] = field(default_factory=list)
    """The same dividing by E - 1 (some IISWC panels use this one)."""

    def __post_init__(self) -> None:
        imb = imbalance_of(self.counts)
        self.max_over_mean, self.cv = imb.max_over_mean, imb.cv
        self.per_query = [[c / max(self.queries, 1) for c in row] for row in self.counts]
        self.var_population, self.var_sample = [], []
        for row in self.per_query:
            e, mean = len(row), sum(row) / max(len(row), 1)
            ss = sum((x - mean) ** 2 for x in row)
            self.var_population.append(ss / e if e else 0.0)
            self.var_sample.append(ss / (e - 1) if e > 1 else 0.0)

    def summary(self) -> dict[str, float]:
        """Layer means of the imbalance statistics."""
        m = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
        return {"max_over_mean": m(self.max_over_mean), "cv": m(self.cv), "var_population": m(self.var_population),
                "var_sample": m(self.var_sample)}


class WeightShare:
    """Sum of routing weights per expert, read from the experts modules ExpertLoad hooked."""

    def __init__(self, model: Any, layers: list[str], num_experts: list[int]) -> None:
        import torch

        self._torch = torch
        self.sums: list[Any] = [None] * len(num_experts)  # float64 on the routing tensors' device: no host sync
        self._handles = []
        modules = dict(model.named_modules())
        for row, name in enumerate(layers):
            params = list(inspect.signature(type(modules[name]).forward).parameters)[1:]
            idx_kw = next(k for k in ("top_k_index", "router_indices", "selected_experts", "topk_indices") if k in params)
            w_kw = next((k for k in ("top_k_weights", "routing_weights", "topk_weights", "router_scores")
                         if k in params), None)
            if w_kw is not None:
                self._handles.append(modules[name].register_forward_pre_hook(
                    self._hook(row, num_experts[row], params.index(idx_kw), idx_kw, params.index(w_kw), w_kw),
                    with_kwargs=True))

    def _hook(self, row: int, n: int, ipos: int, ikw: str, wpos: int, wkw: str) -> Callable[..., None]:
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            idx = kwargs[ikw] if ikw in kwargs else args[ipos]
            w = kwargs[wkw] if wkw in kwargs else args[wpos]
            flat = idx.reshape(-1).long()
            keep = flat < n  # drop 'no expert' sentinels
            if self.sums[row] is None:
                self.sums[row] = self._torch.zeros(n, dtype=self._torch.float64, device=flat.device)
            self.sums[row].index_add_(0, flat[keep], w.reshape(-1)[keep].detach().double())
        return hook

    def shares(self) -> list[list[float]]:
        return [[] if s is None else (s / s.sum()).tolist() if float(s.sum()) > 0 else s.tolist() for s in self.sums]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def expert_load(model: Any, evals: Sequence[Sample], eos: int | None, device: str, batch: int,
                autocast_dtype: str | None) -> LoadSnapshot | None:
    """Per-layer expert load over the eval queries; None for a dense model. Queries of equal length share a
    batch so that no padding token is routed (ExpertLoad counts every token the router sees)."""
    import torch

    load = ExpertLoad(model)
    if not load.is_moe:
        load.remove()
        return None
    share = WeightShare(model, load.layers, load.num_experts)
    by_len: dict[int, list[list[int]]] = {}
    for s in evals:
        ids = train_item(s, eos)[0]
        by_len.setdefault(len(ids), []).append(ids)
    model.eval()
    try:
        with torch.no_grad(), autocast(device, autocast_dtype):
            for group in by_len.values():
                for i in range(0, len(group), batch):
                    model(**pad(group[i: i + batch], None, device))
        snap = LoadSnapshot(counts=load.counts(), tokens=load.tokens(), queries=len(evals), top_k=load.top_k or 0,
                            weight_share=share.shares())
    finally:
        load.remove()
        share.remove()
        model.train()
    return snap
