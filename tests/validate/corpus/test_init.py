"""The bundled corpus (validate/corpus/__init__.py): it loads whole, and every point maps or is listed."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ftscope import FtscopeError
from ftscope.validate.corpus import MAPPERS, Mapped, load_corpus, map_corpus

SHARED = Path(__file__).resolve().parents[3] / ".." / "shared" / "validation" / "published-runs.yaml"


@pytest.fixture(scope="module")
def sources():
    return load_corpus()


@pytest.fixture(scope="module")
def mapped(sources):
    return map_corpus(sources)


def test_bundled_copy_has_every_source_and_point(sources):
    assert len(sources) == 12
    assert sum(len(s.points) for s in sources) == 420
    for s in sources:
        assert len(s.points) == s.meta["n_points"], s.id
        assert s.id in MAPPERS


@pytest.mark.skipif(not SHARED.is_file(), reason="the shared corpus is not beside this checkout")
def test_bundled_copy_equals_the_shared_corpus(sources):
    shared = yaml.safe_load(SHARED.read_text())["sources"]
    assert [s["points"] for s in shared] == [list(s.points) for s in sources]


def test_every_point_is_mapped_once(sources, mapped):
    assert len(mapped) == 420
    assert [m.id for m in mapped] == [p["id"] for s in sources for p in s.points]
    for m in mapped:
        assert isinstance(m, Mapped)
        assert m.framework, m.id
        assert (m.scenario is None) == (m.reason is not None), m.id
        if m.why_not() is not None:
            assert m.why_not().strip(), m.id  # listed points say why


def test_a_source_without_a_mapper_lists_its_points(tmp_path):
    p = tmp_path / "corpus.yaml"
    p.write_text(yaml.safe_dump({"sources": [{"id": "new-source", "points": [{"id": "a"}, {"id": "b"}]}]}))
    out = map_corpus(path=p)
    assert [m.id for m in out] == ["a", "b"]
    assert all(m.why_not() == "no mapping for this source" for m in out)


@pytest.mark.parametrize("text, message", [("sources: 3", "needs a top-level 'sources:' list"),
                                           ("sources: [{points: []}]", "needs an id"),
                                           ("sources: [", "malformed YAML in corpus file")])
def test_bad_corpus_files_are_one_line_errors(tmp_path, text, message):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(FtscopeError, match=message):
        load_corpus(p)
    with pytest.raises(FtscopeError, match="not found"):
        load_corpus(tmp_path / "missing.yaml")
