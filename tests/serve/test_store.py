"""A profile store charted as `ftscope report --db` charts it, drawn again only when the file changes."""
from __future__ import annotations

import pytest

from ftscope.errors import FtscopeError
from ftscope.serve import store as store_mod
from ftscope.serve.store import StoreCharts

from .conftest import one_run_store


def test_the_store_view_has_the_report_sections_as_svg(tmp_path):
    from starlette.testclient import TestClient

    from ftscope.serve.app import create_app

    db = one_run_store(tmp_path / "runs.sqlite")
    with TestClient(create_app(tmp_path / "uploads", db=db)) as client:
        assert client.get("/api/choices").json()["store"] is True
        sections = client.get("/api/store").json()["sections"]
    assert len(sections) == 1 and sections[0]["title"].startswith("Profile run")
    assert [f["name"] for f in sections[0]["figures"]] == ["run1_steps", "run1_layers", "run1_throughput", "run1_util"]
    assert all(f["src"].startswith("data:image/svg+xml;base64,") for f in sections[0]["figures"])


def test_charts_are_drawn_again_only_when_the_file_changes(tmp_path, monkeypatch):
    db = tmp_path / "runs.sqlite"
    db.write_bytes(b"one")
    drawn = []
    monkeypatch.setattr(store_mod, "_draw", lambda path: drawn.append(path) or [{"title": str(len(drawn))}])
    charts = StoreCharts(db)
    assert charts.sections() == charts.sections() == [{"title": "1"}]
    db.write_bytes(b"longer: a profile run added points")
    assert charts.sections() == [{"title": "2"}] and len(drawn) == 2


def test_no_store_and_a_missing_store(tmp_path):
    with pytest.raises(FtscopeError, match="--db PATH"):
        StoreCharts(None).sections()
    StoreCharts(None).check()  # nothing to check
    with pytest.raises(FtscopeError, match="results store not found"):
        StoreCharts(tmp_path / "nope.sqlite").check()
