"""The bundled corpus's sources and points, read once per test session."""
from __future__ import annotations

import pytest

from ftscope.validate.corpus import load_corpus


@pytest.fixture(scope="session")
def corpus_sources():
    return {s.id: s for s in load_corpus()}


@pytest.fixture(scope="session")
def point(corpus_sources):
    """point(source_id, point_id) -> (raw point, source meta)."""
    def get(source: str, pid: str):
        src = corpus_sources[source]
        return next(p for p in src.points if p["id"] == pid), src.meta
    return get
