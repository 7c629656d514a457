"""Prints the cost of profile's hooks (layer timing + expert counting): step time with hooks vs without.

Target (issue 4): below 5 % of step time. Alternates on/off runs so machine noise hits both, and compares the
fastest run of each: interference only ever adds time, so the minimum is the cleanest estimate of the cost.
Run: .venv/bin/python benchmarks/profile_overhead.py
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import ftscope  # noqa: E402
from ftscope.measure.runtime.profile import profile  # noqa: E402

CASES = [
    ("llama-3.2-1b LoRA, 4 layers x 512", {"model": "llama-3.2-1b", "mix": {"method": "lora", "attention": "sdpa", "precision": "fp32"},
                                          "workload": {"micro_batch_size": 4, "seq_len": 256, "padding": "max_length"}},
     {"layers": 4, "hidden": 512, "vocab": 4096}),
    ("mixtral LoRA, 2 layers x 512, 4 experts", {"model": "mixtral-8x7b", "mix": {"method": "lora", "attention": "sdpa",
                                                                                  "precision": "fp32", "experts_backend": "eager"},
                                                "workload": {"micro_batch_size": 4, "seq_len": 256, "padding": "max_length"}},
     {"layers": 2, "hidden": 512, "experts": 4, "vocab": 4096}),
]


def fastest_step(raw: dict, shrink: dict, hooks: bool) -> float:
    r = profile(ftscope.load_scenario(raw), device="cpu", steps=4, warmup=1, batch_sizes=(4,), shrink=shrink,
                db=None, hooks=hooks)
    return r.points[0].step_s


if __name__ == "__main__":
    for name, raw, shrink in CASES:
        on, off = [], []
        for _ in range(4):
            off.append(fastest_step(raw, shrink, False))
            on.append(fastest_step(raw, shrink, True))
        a, b = min(off), min(on)
        print(f"{name}: step {a * 1e3:.1f} ms without hooks, {b * 1e3:.1f} ms with: overhead {100 * (b / a - 1):+.1f} % (target < 5 %)")
