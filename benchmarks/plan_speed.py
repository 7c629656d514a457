"""Prints how many candidate configurations `plan`-style sweeps evaluate per second.

A full sweep: every catalog GPU x 1/2/4/8 GPUs x 24 mixes (method x checkpointing x ZeRO stage), each with
max-batch solving, time and cost. Target (issue 3): >= 10,000 candidates/s on one core. Then a plan over 1-512
GPUs (1/2/4/8 on one node, then 2-64 nodes of 8) for the same mixes (issue 16: >= 10,000/s; issue 21: >= 100,000/s).
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
from ftscope.estimate.efficiency import load_calibration  # noqa: E402

MIXES = [dict(method=m, gradient_checkpointing=gc, zero_stage=z)
         for m, gc, z in itertools.product(("full", "lora", "qlora"), (False, True), (0, 1, 2, 3))]


def sweep(example: str) -> tuple[int, float]:
    base = ftscope.load_scenario(ROOT / "examples" / example)
    cal = load_calibration()
    start = time.perf_counter()
    n = 0
    for mix in MIXES:
        scn = base.with_(**mix)
        ftscope.plan(scn, calibration=cal)  # every GPU with a price x 1/2/4/8
        n += len(ftscope.plan.__defaults__[1]) if False else 0
    elapsed = time.perf_counter() - start
    from ftscope.plan.search import DEFAULT_COUNTS, candidate_gpus
    n = len(MIXES) * len(candidate_gpus(None)) * len(DEFAULT_COUNTS)
    return n, elapsed


def sweep_nodes(example: str) -> tuple[int, float]:
    """Every GPU type x 1-512 GPUs x the 24 mixes: candidates and seconds."""
    from ftscope.plan.search import candidate_gpus
    base = ftscope.load_scenario(ROOT / "examples" / example)
    cal = load_calibration()
    layouts = [((1, 2, 4, 8), 1)] + [((8,), nodes) for nodes in (2, 4, 8, 16, 32, 64)]
    start = time.perf_counter()
    for mix in MIXES:
        for counts, nodes in layouts:
            ftscope.plan(base.with_(**mix), counts=counts, nodes=nodes, calibration=cal)
    elapsed = time.perf_counter() - start
    return len(MIXES) * len(candidate_gpus(None)) * sum(len(c) for c, _ in layouts), elapsed


if __name__ == "__main__":
    for example in ("iiswc-mixtral-qlora.yaml", "llama2-7b-lora-zero2-8gpu.yaml"):
        n, elapsed = sweep(example)
        print(f"{example}: {n} candidates in {elapsed:.2f} s = {n / elapsed:,.0f} candidates/s (target >= 10,000)")
    for example in ("iiswc-mixtral-qlora.yaml", "llama2-7b-lora-zero2-8gpu.yaml"):
        n, elapsed = sweep_nodes(example)
        print(f"{example}, 1-512 GPUs: {n} candidates in {elapsed:.2f} s = {n / elapsed:,.0f} candidates/s "
              "(targets >= 10,000 and >= 100,000)")
    t = time.perf_counter()
    ftscope.plan(ftscope.load_scenario(ROOT / "examples" / "iiswc-mixtral-qlora.yaml"))
    print(f"one plan (all GPUs x 1/2/4/8): {time.perf_counter() - t:.3f} s in-process (target < 1 s wall with start-up)")
