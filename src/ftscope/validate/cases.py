"""Published measurement cases (dev-cases format): each a scenario plus what was measured and how."""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import yaml

from ..errors import FtscopeError

BUNDLED = "dev-cases.yaml"


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
    """(parsed YAML, where it came from) of a file, or of ftscope's bundled data/`bundled`; one-line errors."""
    if path is None:
        text, where = resources.files("ftscope").joinpath("data", bundled).read_text(), f"bundled {bundled}"
    else:
        p = Path(path)
        if not p.is_file():
            raise FtscopeError(f"{kind} file not found: {p}")
        text, where = p.read_text(), str(p)
    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)), where
    except yaml.YAMLError as exc:
        raise FtscopeError(f"malformed {kind} file {where}: {str(exc).splitlines()[0]}") from None


def load_case_file(path: str | Path | None = None) -> list[Case]:
    """Cases from a file, or the bundled copy of the published cases."""
    data, where = read_yaml(path, BUNDLED, "cases")
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
        raise FtscopeError(f"cases file {where} needs a top-level 'cases:' list")
    out = []
    for raw in data["cases"]:
        if not isinstance(raw, dict) or "id" not in raw or "scenario" not in raw or "measured" not in raw:
            raise FtscopeError(f"every case in {where} needs id, scenario and measured")
        out.append(Case(id=str(raw["id"]), scenario=raw["scenario"], measured=raw["measured"] or {},
                        source=str(raw.get("source", "")), confidence=str(raw.get("confidence", "unknown")),
                        notes=str(raw.get("notes", "")), group=_group(str(raw["id"]))))
    return out


def load_cases(paths: Sequence[str] | None = None) -> list[Case]:
    if not paths:
        return load_case_file(None)
    return [c for p in paths for c in load_case_file(p)]
