"""How recommend orders candidates: the primary value, rounded so noise-level differences tie, then the simpler
mix, then the exact value; and which combinations it refuses before estimating anything."""
from __future__ import annotations

import math
from typing import Any

from ..errors import FtscopeError
from ..spec.mix import Mix
from ..spec.rules import mix_problem, model_problem
from ..spec.model import ModelSpec
from ..spec.scenario import Scenario

RANK_BY = ("time", "cost", "memory")
_OFFLOAD_WEIGHT = {"none": 0, "optimizer": 2, "optimizer+params": 4}


def mix_complexity(mix: Mix) -> int:
    """How much machinery a mix needs; among equally good candidates the simpler one wins."""
    # bools as 0 / 1, written out (a search asks for every mix it scans)
    return (mix.shard_stage + (1 if mix.fsdp else 0) + _OFFLOAD_WEIGHT[mix.offload]
            + (mix.optimizer != "adamw") + (mix.attention == "flash") + (mix.method == "qlora")
            + (1 if mix.gradient_checkpointing else 0) + (mix.tensor_parallel > 1) + (mix.pipeline_parallel > 1)
            + (mix.context_parallel > 1) + (mix.expert_parallel > 1))


def complexity(scn: Scenario) -> int:
    """mix_complexity of a scenario's mix."""
    return mix_complexity(scn.mix)


def tie(x: float) -> float:
    """Round to 3 significant digits: differences below ~0.5 % are noise in an estimate. Monotone (x <= y gives
    tie(x) <= tie(y)), which is what lets the search stop at a bound."""
    return float(f"{x:.3g}") if math.isfinite(x) else x


def rank_key(candidate: Any, by: str) -> tuple:
    """(tier, rounded primary, complexity, primary) for a feasible candidate, tier 0 when it leaves the margin free
    and 1 when it is tight (Estimate.status); (2, 0, 0, 0) for one that cannot run (those keep listing order)."""
    if not candidate.feasible:
        return (2, 0.0, 0, 0.0)
    e = candidate.estimate
    usd = e.run.usd if e.run.usd is not None else math.inf
    primary = {"memory": e.memory.peak_bytes, "cost": usd, "time": e.run.hours}[by]
    return (1 if e.status == "tight" else 0, tie(primary), complexity(candidate.scenario), primary)


def refusal(model: ModelSpec, mix: Mix) -> str | None:
    """Why no GPU can run this mix on this model (a combination frameworks refuse), or None. Reads only the
    model and the mix, so the search decides it once per mix."""
    reason = mix_problem(mix) or model_problem(mix, model)
    return f"unsupported: {reason}" if reason else None
