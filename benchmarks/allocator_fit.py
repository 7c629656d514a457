"""Fit the caching allocator's fragmentation fractions on measured CUDA runs; check them on runs they did not see.

ftscope predicts reserved memory as allocated + workspace + fragmentation x (activations + temporaries at the
peak phase): the caching allocator keeps freed blocks that later, larger requests cannot reuse. A step with
activation checkpointing fragments more (each block's kept input is carved out of a block its larger transients
freed and pins that segment), so the two kinds of step get a fraction each: `AllocatorModel.fragmentation` and
`fragmentation_checkpointed`. Each is fitted on its points of the characterization store
(data/measurements/gpu-runs.sqlite) with today's estimator (`memory_model` at the measured batch and sequence)
and checked on the long-context and timing stores.

Run:  .venv/bin/python benchmarks/allocator_fit.py
"""
from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from ftscope.estimate.memory import DEFAULT_ALLOCATOR, AllocatorModel, memory_model  # noqa: E402
from ftscope.spec.hardware import GIB  # noqa: E402

DATA = ROOT / "data" / "measurements"
FIT = ("gpu-runs.sqlite",)
HELD_OUT = ("gpu-long.sqlite", "gpu-timing.sqlite")


def points(names: tuple[str, ...], checkpointed: bool) -> list[tuple]:
    """(scenario, batch, seq, measured reserved GiB) of every CUDA reserved point of these stores whose step
    does (or does not) checkpoint activations."""
    from ftscope.validate.store_cases import store_checks

    out = []
    for name in names:
        checks, _ = store_checks(DATA / name)
        for c in checks:
            if c.metric == "peak_gib:reserved" and c.scenario.mix.gradient_checkpointing == checkpointed:
                w = c.scenario.workload
                out.append((c.scenario, w.micro_batch_size, w.seq_len, c.measured))
    return out


def errors(pts: list[tuple], allocator: AllocatorModel) -> list[float]:
    """% error of the predicted reserved bytes of each point under this allocator model."""
    out = []
    for scn, batch, seq, reserved in pts:
        mm = memory_model(scn, allocator)
        predicted = (mm.breakdown(batch, seq).peak_bytes - mm.paged_optimizer) / GIB
        out.append(100.0 * (predicted / reserved - 1.0))
    return out


def with_fraction(checkpointed: bool, frac: float) -> AllocatorModel:
    field = "fragmentation_checkpointed" if checkpointed else "fragmentation"
    return AllocatorModel(**{**DEFAULT_ALLOCATOR.__dict__, field: frac})


def main() -> None:
    for checkpointed in (False, True):
        field = "fragmentation_checkpointed" if checkpointed else "fragmentation"
        fit, held = points(FIT, checkpointed), points(HELD_OUT, checkpointed)
        grid = [i / 100 for i in range(101)]
        best = min(grid, key=lambda f: statistics.mean(abs(math.log1p(e / 100))
                                                       for e in errors(fit, with_fraction(checkpointed, f))))
        for label, frac in (("current", getattr(DEFAULT_ALLOCATOR, field)), ("fitted", best)):
            for name, pts in (("fit set", fit), ("held out", held)):
                errs = errors(pts, with_fraction(checkpointed, frac))
                absolute = [abs(e) for e in errs]
                under = sum(1 for e in errs if e < 0)
                print(f"{label} {field} {frac:.2f}: {name:8s} n={len(pts):3d}  median {statistics.median(absolute):4.1f} %  "
                      f"max {max(absolute):5.1f} %  under-predicted {under}/{len(pts)}")


if __name__ == "__main__":
    main()
