"""Prints how fast `recommend` searches and how much memory it takes (issue 21).

1. The IISWC Mixtral QLoRA case over every GPU type with a price, as a user runs it
   (`ftscope recommend examples/iiswc-mixtral-qlora.yaml --any-gpu`), best of --repeat runs: wall and CPU
   seconds and peak RSS of the process. Targets: <= 2 s and <= 300 MB (before this search: 22.7 s, 1.0 GB).
2. In-process, the same search: configurations, exact estimates, seconds; with --exhaustive also the reference
   that estimates every configuration, and whether both answer the same.
3. With --scale, a 70B model on four GPU types from 1 to 1,024 GPUs each (multi-node above 8).
4. With --layouts, parallel layouts (`recommend --any-gpu --max-gpus 1024 --layouts`: tensor + sequence parallel
   1-8, pipeline 1-16, context 1-2, expert 1-64) for Llama-3.1-405B full fine-tuning and DeepSeek-V3 LoRA on every
   GPU type with a price, 1 to 1,024 GPUs (target: <= 10 s each), with the heap settings the CLI takes
   (src/ftscope/heap.py). A --time-budget caps each run (DeepSeek-V3's
   space is about 30x the 405B's; without one both are searched to the end) and the line says how much of
   the space it covered.
Run: .venv/bin/python benchmarks/recommend_speed.py [--repeat 3] [--exhaustive] [--scale] [--layouts [--budget S]]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import ftscope  # noqa: E402
from ftscope.plan.recommend import recommend  # noqa: E402

IISWC = ROOT / "examples" / "iiswc-mixtral-qlora.yaml"
FTSCOPE = Path(sys.executable).parent / "ftscope"
LAYOUT_CASES = ("examples/llama31-405b-full.yaml", "examples/deepseek-v3-lora.yaml")


def run_cli(args: list[str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MB) of one CLI run."""
    cmd = [str(FTSCOPE)] if FTSCOPE.exists() else [sys.executable, "-m", "ftscope.cli"]
    start = time.perf_counter()
    proc = subprocess.Popen([*cmd, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"ftscope {' '.join(args)} failed: {proc.stderr.read().decode()[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def cli_case(repeat: int) -> None:
    runs = [run_cli(["recommend", str(IISWC), "--any-gpu"]) for _ in range(repeat)]
    wall, cpu, rss = min(r[0] for r in runs), min(r[1] for r in runs), max(r[2] for r in runs)
    print(f"recommend {IISWC.name} --any-gpu (CLI, best of {repeat}): {wall:.2f} s wall, {cpu:.2f} s CPU, "
          f"{rss:,.0f} MB peak RSS (targets <= 2 s, <= 300 MB; before: 22.7 s, 1.0 GB)")


def in_process(exhaustive: bool) -> None:
    scn = ftscope.load_scenario(IISWC)
    start, cpu = time.perf_counter(), time.process_time()
    rec = recommend(scn, any_gpu=True)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    s = rec.summary
    print(f"  in-process: {s.candidates:,} configurations ({s.feasible:,} run) in {wall:.2f} s wall, {cpu:.2f} s CPU; "
          f"{s.estimates:,} estimated exactly ({s.estimates / s.candidates:.2%}), {s.candidates / cpu:,.0f} configurations/s")
    if exhaustive:
        start = time.process_time()
        ref = recommend(scn, any_gpu=True, exhaustive=True)
        same = json.dumps(ref.to_dict()["rows"], default=str) == json.dumps(rec.to_dict()["rows"], default=str)
        print(f"  exhaustive reference: {time.process_time() - start:.2f} s CPU, {ref.summary.estimates:,} estimates; "
              f"same top-10 and rejected rows: {same}")


def scale_case() -> None:
    scn = ftscope.load_scenario(ROOT / "examples" / "llama2-70b-lora-zero3.yaml")
    gpus = ["h100-80gb:1024", "h200:1024", "b200:1024", "mi300x:1024"]
    start = time.process_time()
    rec = recommend(scn, gpus=gpus)
    s = rec.summary
    print(f"scale: llama-2-70b on {len(gpus)} GPU types x 1-1,024 GPUs: {s.candidates:,} configurations in "
          f"{time.process_time() - start:.2f} s CPU, {s.estimates:,} estimated; best {rec.best.to_dict()['label']}")


def layout_cases(budget: float | None) -> None:
    from ftscope.heap import keep_large_allocations
    keep_large_allocations()  # as `ftscope recommend` does before its search (src/ftscope/heap.py)
    for scenario in LAYOUT_CASES:
        scn = ftscope.load_scenario(ROOT / scenario)
        start, cpu = time.perf_counter(), time.process_time()
        rec = recommend(scn, any_gpu=True, max_gpus=1024, layouts=True, time_budget_s=budget)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        s = rec.summary
        best = rec.best.to_dict()["label"] if rec.best else "none"
        print(f"{scenario} --any-gpu --max-gpus 1024 --layouts: {s.candidates:,} configurations ({s.feasible:,} run), "
              f"{s.estimates:,} estimated, covered {s.covered:.1%}, {wall:.1f} s wall, {cpu:.1f} s CPU (target <= 10 s); "
              f"best {best}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--exhaustive", action="store_true", help="also time the search that estimates everything")
    ap.add_argument("--scale", action="store_true", help="also search a 70B model up to 1,024 GPUs")
    ap.add_argument("--layouts", action="store_true", help="also search parallel layouts for 405B and DeepSeek-V3")
    ap.add_argument("--budget", type=float, default=None, help="--time-budget of each layout run (seconds)")
    opts = ap.parse_args()
    cli_case(opts.repeat)
    in_process(opts.exhaustive)
    if opts.scale:
        scale_case()
    if opts.layouts:
        layout_cases(opts.budget)
