"""A test client for `ftscope serve`'s app (uploads under tmp_path) and a one-run profile store."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="ftscope serve needs the serve extra (pip install -e '.[serve]')")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def uploads_dir(tmp_path: Path) -> Path:
    return tmp_path / "uploads"


@pytest.fixture
def client(uploads_dir: Path):
    from starlette.testclient import TestClient

    from ftscope.serve.app import create_app

    with TestClient(create_app(uploads_dir), raise_server_exceptions=False) as c:
        yield c


def one_run_store(path: Path) -> Path:
    """A store holding the first run of the bundled H200 timing store (real measurements), copied point by point."""
    from ftscope.measure.store import Store

    source = path.with_name("source.sqlite")  # opened from a copy: sqlite may write beside the file it opens
    shutil.copyfile(ROOT / "data" / "measurements" / "gpu-timing.sqlite", source)
    with Store(source) as src, Store(path) as dst:
        run = src.runs()[0]
        rid = dst.start_run(run.scenario, run.environment)
        for p in src.points(run.id)[:2]:
            dst.record_point(rid, p.key, p.status, p.measurement, p.estimate)
        dst.finish_run(rid, "done")
    return path
