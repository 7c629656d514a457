"""Prints how fast `estimate` is: scenarios per second in-process, and the CLI's cold start.

Targets (issue 2): >= 2,000 estimates/s in-process; CLI cold start <= 0.8 s with no torch import.
Run: .venv/bin/python benchmarks/estimate_speed.py
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import ftscope  # noqa: E402
from ftscope.estimate.efficiency import load_calibration  # noqa: E402


def in_process(seconds: float = 2.0) -> float:
    scenarios = [ftscope.load_scenario(p) for p in sorted((ROOT / "examples").glob("*.yaml"))]
    cal = load_calibration()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for s in scenarios:
            ftscope.estimate(s, strict=False, calibration=cal)
            n += 1
    return n / (time.perf_counter() - start)


def cold_start(runs: int = 5) -> tuple[float, bool]:
    exe = Path(sys.executable).parent / "ftscope"
    example = ROOT / "examples" / "iiswc-mixtral-qlora.yaml"
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([str(exe), "estimate", str(example), "--json"], check=True, capture_output=True)
        best = min(best, time.perf_counter() - t)
    probe = subprocess.run([sys.executable, "-c", "import sys, ftscope.cli; print('torch' in sys.modules)"],
                           capture_output=True, text=True, check=True)
    return best, probe.stdout.strip() == "True"


if __name__ == "__main__":
    rate = in_process()
    print(f"estimate in-process: {rate:,.0f} scenarios/s (target >= 2,000), {1e3 / rate:.3f} ms each")
    wall, torch_loaded = cold_start()
    print(f"CLI cold start (estimate --json, best of 5): {wall:.3f} s (target <= 0.8 s); torch imported: {torch_loaded}")
