"""Estimate vs trace on a grid of scenarios: tensor memory per category and phase, and FLOPs, with the error.

`trace` runs the real HF implementation at full size under fake tensors (ground truth for allocated bytes and
FLOPs); `estimate` is the fast formula model. The grid covers dense and MoE models; full, LoRA and QLoRA; GC on
and off; eager and sdpa attention; batch 1-8; sequence 256-8192. Memory is compared as allocated bytes (the
estimate's `memory.allocated_gib`, no allocator overhead) and per category at the estimate's peak phase (the trace's
breakdown at the same phase). FLOPs: `estimate.compute.step_flops` vs the trace's FlopCounterMode totals.

Run:  .venv/bin/python benchmarks/trace_vs_estimate.py [--only SUBSTR] [--json out.json]   (about 5-10 min, 2 cores)
Issue 5 target: peak within 5 % and FLOPs within 2 % on the whole grid.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import ftscope  # noqa: E402
from ftscope.errors import FtscopeError  # noqa: E402
from ftscope.estimate.compute import step_flops  # noqa: E402

GIB = 2**30
CATS = ("weights", "gradients", "optimizer", "activations", "temporary")


def _s(model: str, method: str, batch: int, seq: int, gc: bool = False, att: str = "sdpa", **mix) -> dict:
    return {"model": model, "hardware": {"gpu": "a100-80gb"},
            "mix": {"method": method, "lora_rank": 16, "gradient_checkpointing": gc, "attention": att, **mix},
            "workload": {"micro_batch_size": batch, "seq_len": seq}}


GRID: list[dict] = [
    # dense, small: every method x GC x attention
    _s("llama-3.2-1b", "full", 1, 512),
    _s("llama-3.2-1b", "full", 4, 1024, gc=True),
    _s("llama-3.2-1b", "full", 2, 512, att="eager"),
    _s("llama-3.2-1b", "full", 8, 256, gc=True, att="eager"),
    _s("llama-3.2-1b", "lora", 1, 2048),
    _s("llama-3.2-1b", "lora", 4, 4096, gc=True),
    _s("llama-3.2-1b", "lora", 2, 1024, att="eager"),
    _s("llama-3.2-1b", "lora", 1, 8192, gc=True, att="eager"),
    _s("llama-3.2-1b", "qlora", 8, 512),
    _s("llama-3.2-1b", "qlora", 2, 2048, gc=True),
    _s("llama-3.2-1b", "qlora", 1, 1024, att="eager"),
    _s("llama-3.2-1b", "qlora", 4, 256, gc=True, att="eager"),
    _s("llama-3.2-1b", "full", 2, 1024, precision="bf16"),
    _s("llama-3.2-1b", "full", 8, 2048, precision="bf16"),          # activations dominate a full fine-tune
    _s("llama-3.2-1b", "full", 4, 4096, att="eager"),
    _s("llama-3.2-1b", "lora", 1, 512, precision="fp32"),
    _s("llama-3.2-1b", "lora", 2, 512, lora_targets="attention"),
    # dense, 7B class
    _s("qwen2.5-7b", "lora", 1, 512),
    _s("qwen2.5-7b", "lora", 4, 2048, gc=True),
    _s("qwen2.5-7b", "qlora", 8, 1024, gc=True),
    _s("qwen2.5-7b", "qlora", 1, 4096, att="eager"),
    _s("qwen2.5-7b", "full", 1, 512, gc=True, precision="bf16"),
    _s("qwen2.5-7b", "lora", 2, 8192, gc=True, att="eager"),
    _s("llama-2-7b", "lora", 1, 512),
    _s("llama-2-7b", "full", 2, 1024, gc=True),
    _s("llama-2-7b", "qlora", 4, 2048, gc=True),
    _s("phi-2", "lora", 4, 512),
    # MoE: OLMoE (64 experts, top-8), Qwen1.5-MoE (60 experts, top-4, shared expert), Mixtral, DeepSeek-V2-Lite
    _s("olmoe-1b-7b", "lora", 1, 512),
    _s("olmoe-1b-7b", "lora", 4, 1024, gc=True),
    _s("olmoe-1b-7b", "lora", 2, 512, experts_backend="eager"),
    _s("olmoe-1b-7b", "qlora", 2, 2048),
    _s("olmoe-1b-7b", "qlora", 1, 4096, gc=True, att="eager"),
    _s("olmoe-1b-7b", "full", 1, 1024, precision="bf16"),
    _s("olmoe-1b-7b", "full", 1, 256, experts_backend="batched_mm"),
    _s("olmoe-1b-7b", "lora", 8, 512, lora_targets="attention"),
    _s("olmoe-1b-7b", "lora", 4, 512, experts_top_k=2),
    _s("qwen1.5-moe-a2.7b", "lora", 1, 1024),
    _s("qwen1.5-moe-a2.7b", "lora", 2, 4096, gc=True),
    _s("qwen1.5-moe-a2.7b", "qlora", 4, 512),
    _s("qwen1.5-moe-a2.7b", "full", 1, 2048, gc=True, precision="bf16"),
    _s("qwen1.5-moe-a2.7b", "lora", 1, 2048, att="eager"),
    _s("qwen1.5-moe-a2.7b", "lora", 2, 256, experts_backend="eager"),
    _s("mixtral-8x7b", "lora", 1, 512, lora_targets="attention"),
    _s("mixtral-8x7b", "qlora", 1, 1024, gc=True),
    _s("mixtral-8x7b", "lora", 1, 512),
    _s("deepseek-v2-lite", "lora", 2, 1024),
    _s("deepseek-v2-lite", "qlora", 1, 2048, gc=True),
]


def pct(est: float, ref: float) -> float | None:
    """Signed error of the estimate relative to the trace, in %; None when the trace has (almost) nothing."""
    if abs(ref) < 1e-3 * GIB and abs(est) < 1e-3 * GIB:
        return 0.0
    if abs(ref) < 1e-6:
        return None
    return 100.0 * (est - ref) / ref


def compare(raw: dict) -> dict:
    from ftscope.measure.trace.tracer import trace

    scn = ftscope.load_scenario(raw)
    est = ftscope.estimate(scn, strict=False, with_time=False)
    r = trace(scn)
    e_mem = est.memory
    phase = e_mem.phase
    t_cats = r.phase_categories.get(phase, r.categories)
    fl = step_flops(scn, r.batch, r.seq)
    row = {
        "label": f"{scn.model.name} {scn.mix.label()}" + (f" {scn.mix.experts_backend}" if scn.model.is_moe else "")
                 + ("" if not scn.mix.trains_lora or scn.mix.lora_targets == "all-linear" else f" [{scn.mix.lora_targets}]")
                 + f" b{r.batch} s{r.seq}",
        "moe": scn.model.is_moe, "method": scn.mix.method, "gc": scn.mix.gradient_checkpointing,
        "attention": scn.mix.attention,
        "trace_s": r.wall_s,
        "est_alloc": e_mem.allocated_bytes, "trace_peak": r.peak_bytes,
        "est_phase": phase, "trace_phase": r.peak_phase,
        "peak_err": pct(e_mem.allocated_bytes, r.peak_bytes),
        "phases": {p: (e_mem.phases.get(p, 0.0), r.phases.get(p, 0)) for p in ("forward", "backward", "optimizer")},
        "cats": {c: (e_mem.categories.get(c, 0.0), t_cats.get(c, 0)) for c in CATS},
        # per category: error in % of the trace's peak (these add up to the peak error when the phases agree),
        # and in % of the category itself where it is at least 5 % of the peak (smaller ones are noise)
        "cat_err": {c: 100.0 * (e_mem.categories.get(c, 0.0) - t_cats.get(c, 0)) / r.peak_bytes for c in CATS},
        "cat_rel": {c: pct(e_mem.categories.get(c, 0.0), t_cats.get(c, 0))
                    if t_cats.get(c, 0) >= 0.05 * r.peak_bytes else None for c in CATS},
        "est_trainable": est.model_memory.trainable_params, "trace_trainable": r.trainable_params,
        "flops_est": fl, "flops_trace": r.flops,
        "flops_err": pct(fl["total"], r.flops["total"]),
        "fwd_flops_err": pct(fl["forward"], r.flops["forward"]),
        "bwd_flops_err": pct(fl["backward"], r.flops["backward"]),
        "rec_flops_err": pct(fl["recompute"], r.flops["recompute"]) if r.flops["recompute"] else None,
        "notes": r.build.notes,
    }
    return row


def fmt(x: float | None, width: int = 7) -> str:
    return f"{x:+{width}.1f}" if x is not None else " " * (width - 1) + "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run the grid rows whose model or method contains this")
    ap.add_argument("--json", default="", help="also write the rows to this JSON file")
    args = ap.parse_args()
    rows, failures = [], []
    grid = [g for g in GRID if args.only in json.dumps(g)]
    print(f"{len(grid)} scenarios; memory in GiB (allocated); errors are estimate vs trace in %; per-category "
          "columns are the category's error in % of the trace's peak\n")
    head = (f"{'scenario':58s} {'est':>8s} {'trace':>8s} {'err%':>7s} {'phase e/t':>19s} "
            + " ".join(f"{c[:6]:>7s}" for c in CATS) + f" {'FLOPs%':>7s} {'fwd%':>7s} {'bwd%':>7s} {'rec%':>7s} {'t(s)':>5s}")
    print(head)
    print("-" * len(head))
    t0 = time.perf_counter()
    for raw in grid:
        try:
            row = compare(raw)
        except FtscopeError as exc:
            failures.append((json.dumps(raw["mix"]), str(exc)))
            print(f"{raw['model']} {raw['mix']}: not traced: {exc}")
            continue
        rows.append(row)
        print(f"{row['label'][:58]:58s} {row['est_alloc'] / GIB:8.2f} {row['trace_peak'] / GIB:8.2f} {fmt(row['peak_err'])} "
              f"{row['est_phase'][:9]:>9s}/{row['trace_phase'][:9]:<9s} "
              + " ".join(fmt(row["cat_err"][c]) for c in CATS)
              + f" {fmt(row['flops_err'])} {fmt(row['fwd_flops_err'])} {fmt(row['bwd_flops_err'])} {fmt(row['rec_flops_err'])}"
              f" {row['trace_s']:5.1f}", flush=True)
        gc.collect()
    if not rows:
        return 1
    print(f"\n{len(rows)} traced in {time.perf_counter() - t0:.0f} s; {len(failures)} not traceable")
    summarize(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=float))
    return 0


def _stats(vals: list[float]) -> str:
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    return (f"mean {statistics.mean(vals):+6.1f} %  median {statistics.median(vals):+6.1f} %  "
            f"range [{min(vals):+.1f}, {max(vals):+.1f}] %  n={len(vals)}")


def summarize(rows: list[dict]) -> None:
    worst = max(rows, key=lambda r: abs(r["peak_err"] or 0))
    worst_f = max(rows, key=lambda r: abs(r["flops_err"] or 0))
    within = sum(1 for r in rows if r["peak_err"] is not None and abs(r["peak_err"]) <= 5)
    within_f = sum(1 for r in rows if r["flops_err"] is not None and abs(r["flops_err"]) <= 2)
    print(f"peak within 5 %: {within}/{len(rows)};  FLOPs within 2 %: {within_f}/{len(rows)}")
    print(f"worst peak:  {worst['peak_err']:+.1f} %  {worst['label']}  "
          f"(estimate {worst['est_alloc'] / GIB:.2f} GiB, trace {worst['trace_peak'] / GIB:.2f} GiB)")
    print(f"worst FLOPs: {worst_f['flops_err']:+.1f} %  {worst_f['label']}")
    print("\nbias by category, estimate vs trace at the estimate's peak phase; first in % of the trace's peak, then "
          "in % of the category (rows where it is >= 5 % of the peak):")
    groups = {
        "all": rows,
        "dense": [r for r in rows if not r["moe"]], "MoE": [r for r in rows if r["moe"]],
        "sdpa": [r for r in rows if r["attention"] != "eager"], "eager": [r for r in rows if r["attention"] == "eager"],
        "GC on": [r for r in rows if r["gc"]], "GC off": [r for r in rows if not r["gc"]],
        "full": [r for r in rows if r["method"] == "full"], "lora": [r for r in rows if r["method"] == "lora"],
        "qlora": [r for r in rows if r["method"] == "qlora"],
    }
    for c in CATS:
        print(f"  {c}:")
        for g, rs in groups.items():
            if rs:
                print(f"    {g:7s} of peak {_stats([r['cat_err'][c] for r in rs])}")
                rel = [r["cat_rel"][c] for r in rs if r["cat_rel"][c] is not None]
                if rel:
                    print(f"    {'':7s} of cat  {_stats(rel)}")
    for c, key in (("peak", "peak_err"), ("FLOPs total", "flops_err"), ("FLOPs forward", "fwd_flops_err"),
                   ("FLOPs backward", "bwd_flops_err"), ("FLOPs recompute", "rec_flops_err")):
        print(f"  {c}:")
        for g, rs in groups.items():
            vals = [r[key] for r in rs if r[key] is not None]
            if vals:
                print(f"    {g:7s} {_stats(vals)}")
    mism = [r for r in rows if r["est_trainable"] != r["trace_trainable"]]
    if mism:
        print("\ntrainable parameters differ (estimate vs PEFT as built):")
        for r in mism:
            d = 100.0 * (r["est_trainable"] - r["trace_trainable"]) / r["trace_trainable"]
            print(f"  {r['label'][:58]:58s} {r['est_trainable']:>13,} vs {r['trace_trainable']:>13,} ({d:+.1f} %)")
    phase_mism = [r for r in rows if r["est_phase"] != r["trace_phase"]]
    print(f"\npeak phase differs in {len(phase_mism)}/{len(rows)} rows")


if __name__ == "__main__":
    raise SystemExit(main())
