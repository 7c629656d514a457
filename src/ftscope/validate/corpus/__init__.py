"""The published-runs corpus: 420 measured points from 12 public sources, each mapped to a scenario or listed.

`load_corpus()` reads ftscope's bundled copy (data/published-runs.yaml) into sources of raw points;
`map_corpus()` turns every point into a `Mapped` (scenario + measurements, or the reason it cannot be compared);
`checks.py` turns the comparable ones into `Check`s and summarizes coverage and error per source.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ...errors import FtscopeError
from ..cases import read_yaml
from .common import FEATURES, METRICS, MODELLED, Mapped, Measure
from .finetuning import answerai, torchtune
from .others import hf_4bit, hf_fsdp_70b, llamafactory, misc, ms_swift, peft
from .pretraining import flagperf, foundry, nemo, xtuner

BUNDLED = "published-runs.yaml"

MAPPERS: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any]], Mapped]] = {
    "llm-foundry-mpt-benchmarks": foundry,
    "nvidia-nemo-megatron-bridge-perf": nemo,
    "answerai-fsdp-qlora-benchmarks": answerai,
    "torchtune-readme-and-tutorials": torchtune,
    "xtuner-speed-benchmark": xtuner,
    "flagperf-training-nvidia": flagperf,
    "llamafactory-wiki-performance-comparison": llamafactory,
    "hf-blog-4bit-bitsandbytes": hf_4bit,
    "peft-docs-and-readme-memory": peft,
    "ms-swift-megatron-benchmark": ms_swift,
    "hf-blog-fsdp-llama2-70b": hf_fsdp_70b,
    "misc-single-points": misc,
}
"""Source id -> the function that maps one of its points."""


@dataclass(frozen=True)
class CorpusSource:
    """One public source of the corpus and its points as published."""

    id: str
    title: str
    url: str
    reliability: str
    points: tuple[Mapping[str, Any], ...]
    meta: Mapping[str, Any]
    """The source's own fields (models, tables, common settings) that its mapper reads beside a point."""


def load_corpus(path: str | Path | None = None) -> list[CorpusSource]:
    """The sources of a corpus file (default: ftscope's bundled copy)."""
    data, where = read_yaml(path, BUNDLED, "corpus")
    if not isinstance(data, dict) or not isinstance(data.get("sources"), list):
        raise FtscopeError(f"corpus file {where} needs a top-level 'sources:' list")
    out = []
    for s in data["sources"]:
        if not isinstance(s, dict) or "id" not in s or not isinstance(s.get("points"), list):
            raise FtscopeError(f"every source in {where} needs an id and a list of points")
        out.append(CorpusSource(str(s["id"]), str(s.get("title", "")), str(s.get("url", "")),
                                str(s.get("reliability", "")), tuple(s["points"]),
                                {k: v for k, v in s.items() if k != "points"}))
    return out


def map_corpus(sources: list[CorpusSource] | None = None, path: str | Path | None = None) -> list[Mapped]:
    """Every point of every source, mapped: none is dropped (an unknown source lists its points with a reason)."""
    sources = sources if sources is not None else load_corpus(path)
    out = []
    for src in sources:
        mapper = MAPPERS.get(src.id)
        for raw in src.points:
            if mapper is None:
                out.append(Mapped(str(raw.get("id")), src.id, "unknown", None, (), reason="no mapping for this source"))
                continue
            out.append(mapper(raw, src.meta))
    return out


__all__ = ["BUNDLED", "FEATURES", "MAPPERS", "METRICS", "MODELLED", "CorpusSource", "Mapped", "Measure",
           "load_corpus", "map_corpus"]
