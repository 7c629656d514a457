"""Published measurement cases (dev-cases format): each a scenario plus what was measured and how.

The file's shape and every measured figure are checked when it is read (`Measured`: an unknown metric, a
zero, NaN or negative figure is an error naming the case file); each case's scenario is checked when the case
is compared, and its errors name the case.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Sequence

from ..errors import FtscopeError
from ..files import parse_yaml, read_text, show
from ..spec.schema import Flag, Int, Number, Text, forbid_extra, validate

BUNDLED = "dev-cases.yaml"
MAX_CASES_BYTES = 64 * 2**20

Measure = Number(gt=0, le=1e12)
"""A measured figure: finite and above 0 (a zero would make every error percentage infinite)."""
TopK = Text(pattern=r"^top[1-9][0-9]*$")
Batch = Int(1, 10**6)
Stage = Literal["forward", "backward", "optimizer"]


@forbid_extra
@dataclass(frozen=True)
class Measured:
    """What a source measured (see the header of data/dev-cases.yaml)."""

    memory_metric: Literal["allocated", "reserved", "smi", "unknown"] = "unknown"
    peak_gib: Measure | None = None
    samples_per_s: Measure | None = None
    tokens_per_s: Measure | None = None
    step_s: Measure | None = None
    max_micro_batch_size: Batch | None = None
    oom: Flag() | None = None
    samples_per_s_by_batch: dict[Batch, Measure] | None = None
    max_micro_batch_size_by_top_k: dict[TopK, Batch] | None = None
    step_s_by_top_k_and_batch: dict[TopK, dict[Batch, dict[Stage, Measure]]] | None = None
    peak_by_setup_gib: dict[Text(), Measure] | None = None
    ladder_peak_active_gib_and_tokens_per_s: dict[Text(), tuple[Measure, Measure]] | None = None
    lora: tuple[Measure, Measure] | None = None
    """torchtune's LoRA recipe (peak active GiB, tokens/s) beside its ladder: not the case's scenario."""
    qlora: tuple[Measure, Measure] | None = None
    """torchtune's QLoRA recipe (peak active GiB, tokens/s) beside its ladder: not the case's scenario."""
    not_compared: dict[Text(), Text()] | None = None
    """Metric -> why a figure is kept but not compared (e.g. an unstated dataset under dynamic padding)."""

    def given(self) -> dict[str, Any]:
        """The figures present, as plain data."""
        data = asdict(self)
        return {f.name: data[f.name] for f in fields(self) if data[f.name] is not None}


@forbid_extra
@dataclass(frozen=True)
class CaseInput:
    """One entry of `cases:` as written."""

    id: Text(min_length=1, max_length=200)
    scenario: dict[Any, Any]
    measured: Measured | None
    source: Text() = ""
    confidence: Text() = "unknown"
    notes: Text() = ""


@dataclass(frozen=True)
class CasesFile:
    cases: list[CaseInput]


@dataclass(frozen=True)
class Case:
    """One published measurement: the scenario it ran and the numbers it reported."""

    id: str
    scenario: dict[str, Any]
    measured: dict[str, Any]
    source: str
    confidence: str
    notes: str = ""
    group: str = ""
    """Series name for per-group error (the id up to the first digit-free prefix: iiswc, torchtune, ...)."""


def _group(case_id: str) -> str:
    return case_id.split("-")[0]


def read_yaml(path: str | Path | None, bundled: str, kind: str) -> tuple[Any, str]:
    """(parsed YAML, where it came from) of a file, or of ftscope's bundled data/`bundled`: read and parsed under
    the size, depth and alias budgets of files.py; every problem is one FtscopeError."""
    if path is None:
        text, where = resources.files("ftscope").joinpath("data", bundled).read_text(), f"bundled {bundled}"
    else:
        text, where = read_text(path, f"{kind} file", MAX_CASES_BYTES), show(path)
    return parse_yaml(text, f"{kind} file {where}" if path is not None else where), where


def load_case_file(path: str | Path | None = None) -> list[Case]:
    """Cases from a file, or the bundled copy of the published cases."""
    data, where = read_yaml(path, BUNDLED, "cases")
    where = f"cases file {where}" if path is not None else where
    if not isinstance(data, dict) or "cases" not in data:
        raise FtscopeError(f"{where} needs a top-level 'cases:' list")
    given = validate(CasesFile, {"cases": data["cases"]}, source=where)
    ids = [c.id for c in given.cases]
    dup = next((i for i in ids if ids.count(i) > 1), None)
    if dup is not None:
        raise FtscopeError(f"{where}: case id '{dup}' appears twice")
    return [Case(id=c.id, scenario=c.scenario, measured=(c.measured or Measured()).given(), source=c.source,
                 confidence=c.confidence, notes=c.notes, group=_group(c.id)) for c in given.cases]


def load_cases(paths: Sequence[str] | None = None) -> list[Case]:
    if not paths:
        return load_case_file(None)
    return [c for p in paths for c in load_case_file(p)]
