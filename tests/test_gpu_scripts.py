"""The prepared GPU script for GEMM and attention efficiency runs its whole flow on CPU (DRY_RUN=1)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gemm_attention_dry_run_writes_its_data(tmp_path):
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(tmp_path), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu" / "gemm_attention.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / "data" / "gemm_attention.json").read_text())
    assert doc["dry_run"] is True and doc["gpu"]["device"] == "cpu"
    kinds = {r["kind"] for r in doc["results"]}
    assert {"gemm", "attention"} <= kinds
    for r in doc["results"]:
        if r["kind"] == "gemm":
            assert r["seconds"] > 0 and r["tflops"] > 0 and 0 < r["ftscope_utilization"] <= 1
        if r["kind"] == "attention" and "error" not in r:
            assert r["forward_backward_s"] >= r["forward_s"] > 0
