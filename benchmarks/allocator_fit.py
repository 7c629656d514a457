"""Fit the caching allocator's fragmentation fraction on measured CUDA runs; check it on runs it did not see.

ftscope predicts reserved memory as allocated + workspace + fragmentation x (activations + temporaries at the
peak phase): the caching allocator keeps freed blocks that later, larger requests cannot reuse. This fits the one
fraction on the characterization store (data/measurements/gpu-runs.json) with the estimator's own allocated bytes
and checks it on the long-context and timing stores. The value goes into `AllocatorModel.fragmentation`.

Run:  .venv/bin/python benchmarks/allocator_fit.py
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from ftscope.estimate.memory import DEFAULT_ALLOCATOR  # noqa: E402

DATA = ROOT / "data" / "measurements"
FIT = ("gpu-runs.json",)
HELD_OUT = ("gpu-long.json", "gpu-timing.json")


def points(names: tuple[str, ...]) -> list[tuple[float, float, float]]:
    """(estimated allocated GiB, estimated churning GiB, measured reserved GiB) per CUDA point."""
    out = []
    for name in names:
        for run in json.loads((DATA / name).read_text())["runs"]:
            for p in run["points"]:
                m = p["measurement"]
                mem = m.get("memory") or {}
                if m.get("status") != "ok" or not mem.get("peak_reserved_bytes") or not m.get("estimate"):
                    continue
                e = m["estimate"]["memory"]
                b = e["breakdown_gib"]
                out.append((e["allocated_gib"], b["activations"] + b["temporary"], mem["peak_reserved_bytes"] / 2**30))
    return out


def errors(pts: list[tuple[float, float, float]], frac: float) -> list[float]:
    ws = DEFAULT_ALLOCATOR.workspace_gib
    return [100.0 * ((a + ws + frac * churn) / reserved - 1.0) for a, churn, reserved in pts]


def main() -> None:
    from scipy.optimize import minimize_scalar

    fit, held = points(FIT), points(HELD_OUT)
    res = minimize_scalar(lambda f: statistics.mean(abs(math.log1p(e / 100)) for e in errors(fit, f)),
                          bounds=(0.0, 1.0), method="bounded")
    best = round(res.x, 2)
    for label, frac in (("current", DEFAULT_ALLOCATOR.fragmentation), ("fitted", best)):
        for name, pts in (("fit set", fit), ("held out", held)):
            errs = [abs(e) for e in errors(pts, frac)]
            under = sum(1 for e in errors(pts, frac) if e < 0)
            print(f"{label} fragmentation {frac:.2f}: {name:8s} n={len(pts):3d}  median {statistics.median(errs):4.1f} %  "
                  f"max {max(errs):5.1f} %  under-predicted {under}/{len(pts)}")


if __name__ == "__main__":
    main()
