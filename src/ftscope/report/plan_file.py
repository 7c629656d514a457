"""The plan file `report --plan` charts: what `ftscope plan --json` (or `recommend --json`) wrote, checked.

Only the fields the charts read are typed (the rest of each row is kept as written); a row of the wrong
shape, or a NaN, infinite or negative figure, is one error naming the row and the key.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import FtscopeError
from ..files import parse_json, read_text, show
from ..spec.schema import Flag, Int, Number, Text, validate

Figure = Number(ge=0, le=1e15)


@dataclass(frozen=True)
class PlanMemory:
    fits: Flag()
    breakdown_gib: dict[Text(), Figure] | None = None
    capacity_gib: Figure | None = None
    peak_gib: Figure | None = None


@dataclass(frozen=True)
class PlanTime:
    breakdown_s: dict[Text(), Figure]


@dataclass(frozen=True)
class PlanRun:
    hours: Number(gt=0, le=1e12)
    usd: Figure | None = None


@dataclass(frozen=True)
class PlanHardware:
    gpu: Text()
    gpus_per_node: Int(1, 262_144)


@dataclass(frozen=True)
class PlanScenario:
    hardware: PlanHardware


@dataclass(frozen=True)
class PlanRow:
    label: Text()
    memory: PlanMemory
    scenario: PlanScenario
    time: PlanTime | None = None
    run: PlanRun | None = None
    pareto: Flag() | None = None


@dataclass(frozen=True)
class PlanFile:
    rows: list[PlanRow]


def load_plan(path: str | Path) -> dict[str, Any]:
    """The plan JSON at `path`, with every row checked; the data itself is returned as written."""
    where = f"plan file {show(path)}"
    data = parse_json(read_text(path, "plan file", 512 * 2**20), where)
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise FtscopeError(f"{where} is not plan output: write it with `ftscope plan SCENARIO --json > plan.json` "
                           "(an object with a 'rows' list)")
    validate(PlanFile, {"rows": data["rows"]}, source=where)
    return data
