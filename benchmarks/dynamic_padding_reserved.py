"""What dynamic padding does to reserved memory: a step traced at each batch length, the steps replayed in a
sequence through one caching-allocator model (estimate/caching_allocator.py, via measure/trace/allocator.replay_steps).

Under dynamic padding every batch is padded to its own longest sample, so the step's large tensors change size from
step to step. The caching allocator never returns a segment (no empty_cache), and a segment cut for a shorter batch
cannot hold the same tensor of a longer one: each new longest batch ("record") adds segments, and the run's reserved
peak depends on the order in which the lengths first appear, not only on the longest one. ftscope compares the
published dynamic-padding rows at their longest batch (a fixed shape), which is the lower bound of this.

    python benchmarks/dynamic_padding_reserved.py [SCENARIO.yaml] [--orders 512,200,350 90,130,200,...]

Seen (torch 2.13 CPU trace; llama-2-7b LoRA r8 q,v, checkpointing, batch 2, torchtune 0.1's recipe, the 2024-04
LoRA 1x4090 row and the LoRA tutorial, measured 14.50 GiB reserved): a fixed 512-token step replays to 13.46 GiB; the
longest batch first, then any lengths, stays 13.46; records at 250, 400, 480, 512 tokens reach 14.00; lengths growing
from 90 to 512 reach 14.32. Which order a run met is a property of its dataset and shuffle, which the sources do not
state: not modelled.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

GIB = 2**30
SCENARIO = {"model": "llama-2-7b", "framework": "torchtune-0.1", "hardware": {"gpu": "rtx-4090"},
            "mix": {"method": "lora", "precision": "bf16", "attention": "sdpa", "optimizer": "adamw", "loss": "standard",
                    "lora_rank": 8, "lora_targets": ["q_proj", "v_proj"], "gradient_checkpointing": True},
            "workload": {"micro_batch_size": 2, "seq_len": 512, "padding": "max_length"}}
ORDERS = ["512,200,350,512,130,280,420,512,90,300", "250,400,480,512", "90,130,200,280,300,350,420,512,200,512"]


def main() -> None:
    import ftscope
    from ftscope.measure.trace.allocator import replay_steps
    from ftscope.measure.trace.tracer import trace

    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", nargs="?", help="scenario YAML (default: torchtune 0.1's 7B LoRA on one 4090)")
    ap.add_argument("--orders", nargs="+", default=ORDERS, help="comma-separated batch lengths, one run each")
    args = ap.parse_args()
    scn = ftscope.load_scenario(args.scenario or SCENARIO)
    batch = scn.workload.micro_batch_size
    orders = [[int(x) for x in o.split(",")] for o in args.orders]
    steps = {}
    for length in sorted({n for o in orders for n in o}):
        steps[length] = trace(scn, batch=batch, seq=length)
        print(f"seq {length}: allocated {max(steps[length].phases.values()) / GIB:.2f} GiB, "
              f"a fixed-length run reserves {steps[length].reserved_bytes / GIB:.2f}", flush=True)
    for order in orders:
        alloc = None
        for length in order:
            alloc = replay_steps(steps[length].recs, steps=1, allocator=alloc)
        print(f"lengths {order}: peak reserved {alloc.peak_reserved / GIB:.2f} GiB, "
              f"peak allocated {alloc.peak_allocated / GIB:.2f}")


if __name__ == "__main__":
    main()
