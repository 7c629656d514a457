"""Work that the candidates of one sweep share: a plan estimates one model, mix and workload on many GPU types and
GPU counts, and most of an estimate depends on only one of the two.

`Shared(scn)` is bound to one model, mix, workload, recipe and price: it answers for a scenario that differs from
`scn` only in its cluster (`covers`), and `estimate` falls back to the unshared path for anything else. Every
value is computed by the same function the unshared path calls, on the first candidate that needs it, and
reused: per GPU type (the support rules, the efficiency, the price, the GPU's rates), per GPU count (the memory
model), per capacity (the largest micro-batch), per micro-batch (its length, ops and model FLOPs) and per GPU
type and micro-batch (the passes' times). The numbers are those of the unshared path by construction
(tests/estimate/test_shared.py compares whole estimates).
"""
from __future__ import annotations

from typing import Any, Callable

from ..spec.scenario import Scenario


MEMO_LIMIT = 100_000
"""Values one memo keeps at most (a plan over every GPU type and 1-512 GPUs keeps a few thousand)."""


class Shared:
    """Memo of one sweep's shared work (see the module docstring). Two threads may both make a value the memo
    lacks; they make the same one, so either may stay."""

    def __init__(self, scn: Scenario) -> None:
        self.scenario = scn
        self._memo: dict[tuple, Any] = {}
        self._kept: list[Any] = []  # objects whose id() is in a key stay alive, so no id is reused

    def covers(self, scn: Scenario) -> bool:
        """True when `scn` differs from the bound scenario only in its cluster (GPU type, count, nodes)."""
        base = self.scenario
        return (scn.model is base.model and scn.mix is base.mix and scn.workload is base.workload
                and scn.recipe is base.recipe and scn.usd_per_gpu_hour == base.usd_per_gpu_hour)

    def get(self, key: tuple, make: Callable[[], Any], *alive: Any) -> Any:
        """The value under `key`, made once; `alive`: objects whose id() the key holds."""
        hit = self._memo.get(key, self)
        if hit is self:
            if len(self._memo) >= MEMO_LIMIT:  # a long-lived memo (ftscope serve) starts over rather than grow
                self._memo.clear()
                self._kept.clear()
            hit = self._memo[key] = make()
            self._kept.extend(alive)
        return hit

    def known(self, key: tuple) -> Any:
        """The value under `key` when made, else None (nothing made)."""
        return self._memo.get(key)

    def per_gpu(self, name: Any, scn: Scenario, make: Callable[[], Any], *alive: Any) -> Any:
        """The value of `name` for this scenario's GPU type (`alive`: objects whose id() `name` holds)."""
        gpu = scn.cluster.gpu
        return self.get((name, id(gpu)), make, gpu, *alive)

    def per_cluster(self, name: str, scn: Scenario, make: Callable[[], Any]) -> Any:
        cl = scn.cluster
        return self.get((name, id(cl.gpu), cl.gpus_per_node, cl.nodes, cl.inter_node_gbs), make, cl.gpu)


class KeyMemo(dict):
    """A bounded memo of one function of its key: `memo[key]` is a plain dict lookup on a hit and makes the value
    (`make(key)`) on a miss, starting over past `limit` values rather than growing for a long-lived process."""

    def __init__(self, make: Callable[[Any], Any], limit: int = 4096) -> None:
        super().__init__()
        self.make, self.limit = make, limit

    def __missing__(self, key: Any) -> Any:
        if len(self) >= self.limit:
            self.clear()
        value = self[key] = self.make(key)
        return value


def shared_for(shared: Shared | None, scn: Scenario) -> Shared | None:
    """`shared` when it covers `scn`, else None (the unshared path)."""
    return shared if shared is not None and shared.covers(scn) else None
