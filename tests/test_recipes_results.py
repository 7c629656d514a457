"""The committed output of benchmarks/recipes_vs_trace.py has the shape the README table is read from (the run
itself needs the frameworks' side venv and is not repeated here)."""
import json
from pathlib import Path

import pytest

from ftscope.spec.recipe import framework_names

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "recipes_vs_trace.json"


@pytest.mark.skipif(not RESULTS.is_file(), reason="benchmarks/results/recipes_vs_trace.json not committed yet")
def test_results_file_shape():
    doc = json.loads(RESULTS.read_text())
    assert {"versions", "summary", "rows", "batch", "seq"} <= set(doc)
    rows = doc["rows"]
    assert rows and doc["summary"]["n"] == sum("error_pct" in r for r in rows)
    for r in rows:
        assert r["framework"] in framework_names()
        assert r["method"] in ("lora", "qlora")
        if "error_pct" in r:
            err = 100 * (r["estimate_gib"] - r["trace_peak_gib"]) / r["trace_peak_gib"]
            assert abs(err - r["error_pct"]) < 0.2  # the error column is the two peaks' difference
    assert doc["summary"]["within_5pct"] == sum(abs(r.get("error_pct", 99)) <= 5 for r in rows)
