"""The rank worker's pieces that need no process group: the step hook it loads and the report it writes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftscope.measure.distributed.worker import RankReport, load_step_hook

FAILURES = Path(__file__).with_name("failures.py")


def test_step_hook_loads_from_a_file_or_a_module():
    hook = load_step_hook(f"{FAILURES}:raise_on_rank_1")
    hook(0, 5)  # other ranks are left alone
    hook(1, 0)  # and rank 1 before its first step
    with pytest.raises(RuntimeError, match="injected failure on rank 1 after 1 steps"):
        hook(1, 1)
    assert load_step_hook("json:dumps") is json.dumps
    assert load_step_hook(None) is None


def test_rank_report_is_rewritten_whole_and_records_the_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    report = RankReport(tmp_path / "ranks")
    assert json.loads((tmp_path / "ranks" / "rank1.json").read_text())["status"] == "starting"
    report.doc["current_batch"] = 4
    try:
        raise ValueError("the engine broke\nat line 2")
    except ValueError as exc:
        report.fail(exc)
    doc = json.loads((tmp_path / "ranks" / "rank1.json").read_text())
    assert doc["status"] == "error" and doc["error"]["batch"] == 4
    assert doc["error"]["message"] == "ValueError: the engine broke" and "Traceback" in doc["error"]["traceback"]
    assert not list((tmp_path / "ranks").glob("*.tmp"))
