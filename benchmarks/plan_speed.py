"""Prints how many candidate configurations `plan`-style sweeps evaluate per second.

A full sweep: every catalog GPU x 1/2/4/8 GPUs x 24 mixes (method x checkpointing x ZeRO stage), each with
max-batch solving, time and cost. Target (issue 3): >= 10,000 candidates/s on one core. Then a plan over 1-512
GPUs (1/2/4/8 on one node, then 2-64 nodes of 8) for the same mixes (issue 16: >= 10,000/s; issue 21: >= 100,000/s):
its GPU counts above 8 are new to the process (memory models, solves, micro-batch times made on the spot). Then the
same plans again, every shared value known (what `ftscope serve` sees on a repeated request).
Run: .venv/bin/python benchmarks/plan_speed.py
"""
from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import ftscope  # noqa: E402
import numpy  # noqa: E402,F401  (plan imports it on first use, once per process, as the line above imports ftscope)
from ftscope.estimate.efficiency import load_calibration  # noqa: E402

MIXES = [dict(method=m, gradient_checkpointing=gc, zero_stage=z)
         for m, gc, z in itertools.product(("full", "lora", "qlora"), (False, True), (0, 1, 2, 3))]


def sweep(example: str) -> tuple[int, float, float]:
    """Every GPU type x 1/2/4/8 GPUs x the 24 mixes: candidates, wall and CPU seconds."""
    from ftscope.plan.search import DEFAULT_COUNTS, candidate_gpus
    return _timed(example, [(DEFAULT_COUNTS, 1)], len(candidate_gpus(None)))


def sweep_nodes(example: str) -> tuple[int, float, float]:
    """Every GPU type x 1-512 GPUs x the 24 mixes: candidates, wall and CPU seconds."""
    from ftscope.plan.search import candidate_gpus
    layouts = [((1, 2, 4, 8), 1)] + [((8,), nodes) for nodes in (2, 4, 8, 16, 32, 64)]
    return _timed(example, layouts, len(candidate_gpus(None)))


def _timed(example: str, layouts: list, gpus: int) -> tuple[int, float, float]:
    base = ftscope.load_scenario(ROOT / "examples" / example)
    cal = load_calibration()
    start, cpu = time.perf_counter(), time.process_time()
    for mix in MIXES:
        for counts, nodes in layouts:
            ftscope.plan(base.with_(**mix), counts=counts, nodes=nodes, calibration=cal)  # every GPU with a price
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return len(MIXES) * gpus * sum(len(c) for c, _ in layouts), wall, cpu


if __name__ == "__main__":
    for label, run, target in (("", sweep, "target >= 10,000"),
                               (", 1-512 GPUs", sweep_nodes, "targets >= 10,000 and >= 100,000"),
                               (", 1-512 GPUs again (every memo known)", sweep_nodes, "what a repeated plan costs")):
        for example in ("iiswc-mixtral-qlora.yaml", "llama2-7b-lora-zero2-8gpu.yaml"):
            n, wall, cpu = run(example)
            print(f"{example}{label}: {n} candidates in {wall:.2f} s = {n / wall:,.0f} candidates/s, "
                  f"{n / cpu:,.0f} per CPU second ({target})")
    t = time.perf_counter()
    ftscope.plan(ftscope.load_scenario(ROOT / "examples" / "iiswc-mixtral-qlora.yaml"))
    print(f"one plan (all GPUs x 1/2/4/8): {time.perf_counter() - t:.3f} s in-process (target < 1 s wall with start-up)")
