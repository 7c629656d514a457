"""Reserved memory two ways against the H200 measurements: the estimator's fitted fragmentation fraction, and
the trace's allocations replayed through the caching-allocator model (measure/trace/allocator.py), following the
profile sweep's history (batch sizes one after another in one process, warm-up steps, then the measured step).

For every measured point of the chosen stores (data/measurements/*.json) the model is traced at the measured
batch and sequence (the config as built: the 4-layer Mixtral stays 4 layers) and compared on allocated
(`max_memory_allocated`) and reserved (`max_memory_reserved`) bytes.

Run:  .venv/bin/python benchmarks/allocator_replay.py [--stores gpu-timing,gpu-runs] [--only SUBSTR] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import ftscope  # noqa: E402

GIB = 2**30


def points(store: str, only: str):
    data = json.loads((ROOT / "data" / "measurements" / f"{store}.json").read_text())
    for run in data["runs"]:
        sc = run["scenario"]
        raw, cfg = sc.get("scenario"), (sc.get("build") or {}).get("config")
        for p in sorted(run["points"], key=lambda q: q["created"]):
            m = p["measurement"]
            mem = m.get("memory") or {}
            if m.get("status") != "ok" or not mem.get("peak_reserved_bytes"):
                continue
            scn = ftscope.load_scenario(raw)
            experts = f" {scn.mix.experts_backend}-experts" if scn.model.is_moe else ""
            label = f"{raw['model']} {scn.mix.label()}{experts} s{raw['workload']['seq_len']} b{m['batch']}"
            if only in label:
                yield label, raw, cfg, m, (store, run["id"]), sc.get("options") or {}


def main() -> int:
    from ftscope.measure.trace.tracer import trace

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stores", default="gpu-timing,gpu-runs")
    ap.add_argument("--only", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    from ftscope.measure.trace.allocator import replay_steps

    rows, seen = [], set()
    sc_opts: dict = {}
    history, last_run = None, None
    tmp = Path(tempfile.mkdtemp())
    print(f"{'point':52s} {'alloc meas':>10s} {'trace':>7s} {'resv meas':>10s} {'replay':>7s} {'err':>7s} {'estimate':>9s} {'err':>7s}")
    for store in args.stores.split(","):
        for label, raw, cfg, m, run_key, options in points(store, args.only):
            sc_opts[run_key] = options
            key = (label, m["padded_len_mean"])
            if key in seen:
                continue
            seen.add(key)
            path = tmp / f"{abs(hash(json.dumps(cfg, sort_keys=True)))}.json"
            path.write_text(json.dumps(cfg))
            scn = ftscope.load_scenario({**raw, "model": str(path)})
            r = trace(scn, batch=int(m["batch"]), seq=int(raw["workload"]["seq_len"]))
            # profile sweeps batch sizes in one process without emptying the cache: continue the run's allocator
            # through its warm-up steps and the measured step (peak = reserved when that step ends)
            opts = sc_opts[run_key]
            if run_key != last_run:
                history, last_run = None, run_key
            elif opts.get("empty_cache_per_point"):
                history.empty_cache()
            history = replay_steps(r.recs, steps=int(opts.get("warmup", 1)) + 1, allocator=history)
            r.reserved_bytes = history.reserved
            history = replay_steps(r.recs, steps=int(opts.get("steps", 3)), allocator=history)
            est_now = ftscope.estimate(scn.with_(micro_batch_size=int(m["batch"])), strict=False, with_time=False)
            est = {"memory": {"peak_gib": est_now.memory.peak_bytes / GIB}}
            mem = m["memory"]
            row = {"point": label, "store": store,
                   "alloc_meas": mem["peak_allocated_bytes"] / GIB, "alloc_trace": r.peak_bytes / GIB,
                   "resv_meas": mem["peak_reserved_bytes"] / GIB, "resv_replay": r.reserved_bytes / GIB,
                   "resv_est": est["memory"]["peak_gib"] if est else None}
            row["replay_err"] = 100 * (row["resv_replay"] / row["resv_meas"] - 1)
            row["est_err"] = 100 * (row["resv_est"] / row["resv_meas"] - 1) if est else None
            rows.append(row)
            print(f"{label[:52]:52s} {row['alloc_meas']:10.2f} {row['alloc_trace']:7.2f} {row['resv_meas']:10.2f} "
                  f"{row['resv_replay']:7.2f} {row['replay_err']:+6.1f}% {row['resv_est'] or 0:9.2f} "
                  f"{row['est_err'] or 0:+6.1f}%", flush=True)
    if not rows:
        return 1
    for name, key in (("allocator replay", "replay_err"), ("estimate (fitted fraction)", "est_err")):
        errs = [abs(r[key]) for r in rows if r[key] is not None]
        under = sum(1 for r in rows if r[key] is not None and r[key] < 0)
        print(f"{name:28s} n={len(errs)} median {statistics.median(errs):.1f} %  max {max(errs):.1f} %  "
              f"under-predicted {under}/{len(errs)}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
