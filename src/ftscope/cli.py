"""The `ftscope` command: a thin typer layer over the library functions.

Bad input is one line on stderr and exit code 2; `--json` prints exactly one JSON document on stdout.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, List, Optional

import typer

from .errors import FtscopeError

app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
    help="What will this LLM fine-tuning run cost? Memory, max batch, time and dollars before you rent a GPU.\n\n"
         "Every verb takes a scenario YAML (see examples/) and key.path=value overrides, "
         "e.g. `ftscope estimate examples/iiswc-mixtral-qlora.yaml mix.experts_top_k=8 hardware.gpu=h100-80gb`.",
)

JSON_OPT = typer.Option(False, "--json", help="Print one JSON document (the output contract) and nothing else.")
CAL_OPT = typer.Option(None, "--calibration", help="Efficiency calibration file (default: the bundled fit).")


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _console():
    from rich.console import Console
    con = Console()
    if not con.is_terminal:  # piped or captured: don't wrap tables at 80 columns
        con = Console(width=160)
    return con


def _split(value: Optional[str]) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()] if value else []


@app.command()
def estimate(
    scenario: Path = typer.Argument(..., help="Scenario YAML/JSON file."),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides, e.g. mix.zero_stage=3."),
    json_out: bool = JSON_OPT,
    margin: float = typer.Option(0.0, "--margin", help="Fraction of GPU memory to keep free (0.05 = 5 %)."),
    check: bool = typer.Option(False, "--check", help="Exit 1 when the scenario does not fit (a pre-launch guard)."),
    calibration: Optional[Path] = CAL_OPT,
) -> None:
    """One scenario: per-GPU memory by category and phase, fits?, max micro-batch and max sequence length,
    step time, throughput, hours and dollars."""
    from . import estimate as run_estimate
    from .spec.scenario import load_scenario

    scn = load_scenario(scenario, overrides or [])
    est = run_estimate(scn, margin=margin, calibration=str(calibration) if calibration else None)
    if json_out:
        _print_json(est.to_dict())
    else:
        from .report.tables import estimate_tables
        con = _console()
        for t in estimate_tables(est):
            con.print(t)
    if check and not est.fits:
        raise typer.Exit(1)


@app.command()
def plan(
    scenario: Path = typer.Argument(..., help="Scenario YAML/JSON file (its hardware is replaced by each candidate)."),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="Comma-separated GPU types (default: every GPU with a price)."),
    counts: str = typer.Option("1,2,4,8", "--counts", help="GPUs per node to try."),
    max_gpus: Optional[int] = typer.Option(None, "--max-gpus", help="Skip candidates with more GPUs than this."),
    nodes: int = typer.Option(1, "--nodes", help="Nodes per candidate."),
    by: str = typer.Option("cost", "--by", help="Rank by cost or time."),
    all_rows: bool = typer.Option(False, "--all", help="Show every GPU x count, not just the best count per GPU."),
    keep_batch: bool = typer.Option(False, "--keep-batch", help="Use the scenario's micro-batch instead of the largest that fits."),
    json_out: bool = JSON_OPT,
    calibration: Optional[Path] = CAL_OPT,
) -> None:
    """Which GPU, how many, which batch size; how many hours and dollars. Ranked, with the cost/time
    Pareto frontier marked *."""
    from .plan.search import one_row_per_gpu, plan as run_plan
    from .spec.scenario import load_scenario

    try:
        count_list = [int(c) for c in _split(counts)]
    except ValueError:
        raise FtscopeError(f"--counts must be comma-separated integers; got {counts!r}") from None
    if not count_list or any(c < 1 or c > 64 for c in count_list):
        raise FtscopeError(f"--counts must be integers from 1 to 64; got {counts!r}")
    if nodes < 1 or (max_gpus is not None and max_gpus < 1):
        raise FtscopeError("--nodes and --max-gpus must be at least 1")
    scn = load_scenario(scenario, overrides or [])
    result = run_plan(scn, gpus=_split(gpus) or None, counts=count_list, max_gpus=max_gpus, nodes=nodes, by=by,
                      solve_batch=not keep_batch, calibration=str(calibration) if calibration else None)
    if json_out:
        _print_json(result.to_dict())
        return
    from .report.tables import plan_table
    rows = result.rows if all_rows else one_row_per_gpu(result)
    pareto = {i for i, e in enumerate(rows) if result.rows.index(e) in set(result.pareto)}
    title = (f"{scn.model.name} | {scn.mix.label()} | {scn.workload.samples_per_epoch():,} samples x "
             f"{scn.workload.epochs:g} epochs | ranked by {by}" + ("" if all_rows else " (best count per GPU; --all for every count)"))
    con = _console()
    con.print(plan_table(rows, pareto, title))
    if result.best is not None:
        b = result.best
        con.print(f"best: {b.scenario.cluster.world_size}x {b.scenario.cluster.gpu.key}, micro-batch {b.micro_batch_size}: "
                  f"{b.run.hours:,.1f} h, ${b.run.usd:,.2f} ({b.run.price_source}). * = cost/time Pareto frontier.")
    else:
        con.print("[red]no candidate fits[/red]: try more GPUs (--counts), QLoRA, checkpointing or ZeRO-3.")


@app.command()
def recommend(
    scenario: Path = typer.Argument(..., help="Scenario YAML/JSON file: model, data and the mix to start from."),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPU budget(s) NAME:MAX_COUNT, e.g. a100-80gb:8,h100-80gb:4 "
                                                            "(default: the scenario's GPU and count)."),
    any_gpu: bool = typer.Option(False, "--any-gpu", help="Search every GPU type with a price, 1-8 GPUs."),
    budget_usd: Optional[float] = typer.Option(None, "--budget-usd", help="Drop candidates whose run costs more."),
    deadline_hours: Optional[float] = typer.Option(None, "--deadline-hours", help="Drop candidates that take longer."),
    by: str = typer.Option("time", "--by", help="Rank by time, cost or memory."),
    top: int = typer.Option(10, "--top", help="Rows to show."),
    emit_dir: Optional[Path] = typer.Option(None, "--emit", help="Write the winner's DeepSpeed JSON, accelerate YAML "
                                                                  "and Trainer/PEFT arguments here."),
    json_out: bool = JSON_OPT,
    calibration: Optional[Path] = CAL_OPT,
) -> None:
    """The best optimization mix for your model, data and GPUs: every valid combination of method,
    checkpointing, ZeRO/FSDP, offload, attention, optimizer and GPU count, ranked and explained."""
    from .plan.recommend import recommend as run_recommend
    from .spec.scenario import load_scenario

    scn = load_scenario(scenario, overrides or [])
    result = run_recommend(scn, gpus=_split(gpus) or None, any_gpu=any_gpu, budget_usd=budget_usd,
                           deadline_hours=deadline_hours, by=by, calibration=str(calibration) if calibration else None)
    written = []
    if emit_dir is not None and result.best is not None:
        from .plan.emit import emit
        from .plan.recommend import best_deepspeed
        written = emit(result.best.scenario, result.best.estimate.micro_batch_size, emit_dir)
        ds = best_deepspeed(result)
        if ds is not None and ds is not result.best:  # the best ZeRO alternative, for DeepSpeed users
            written += emit(ds.scenario, ds.estimate.micro_batch_size, emit_dir / "deepspeed")
    if json_out:
        data = result.to_dict()
        data["emitted"] = [str(p) for p in written]
        _print_json(data)
        return
    from .report.tables import recommend_table
    con = _console()
    counts = result.to_dict()["counts"]
    con.print(recommend_table(result.rows[:top], f"{scn.model.name}: {counts['feasible']:,} of {counts['candidates']:,} "
                                                 f"configurations run; top {min(top, counts['feasible'])} by {by}"))
    if result.best is None:
        con.print("[red]nothing fits[/red]: the first rejected candidates and why:")
        for c in result.rows[:5]:
            con.print(f"  {c.to_dict()['label']}: {c.reason}")
        raise typer.Exit(1)
    for line in result.explanation:
        con.print(line)
    for p in written:
        con.print(f"wrote {p}")


@app.command()
def models(json_out: bool = JSON_OPT) -> None:
    """Bundled model presets (real HF config.json files) with parameter counts."""
    from . import catalog
    from .spec.model import load_model

    rows = []
    for name, entry in catalog.model_index().items():
        m = load_model(name)
        rows.append({"name": name, "hf_id": entry.get("hf_id"), "family": m.arch.model_type,
                     "total_params": m.total_params, "active_params": m.active_params(),
                     "experts": m.arch.num_experts, "top_k": m.arch.top_k, "layers": m.num_layers,
                     "hidden": m.arch.hidden_size, "source": entry.get("source", "")})
    if json_out:
        _print_json(rows)
        return
    from .report.tables import simple_table
    _console().print(simple_table("bundled models (ftscope show NAME for details)",
                                  ["name", "HF id", "family", "params", "active", "experts"],
                                  [[r["name"], r["hf_id"], r["family"], f"{r['total_params'] / 1e9:.2f}B",
                                    f"{r['active_params'] / 1e9:.2f}B", f"{r['top_k']}/{r['experts']}" if r["experts"] else "-"]
                                   for r in rows]))


@app.command()
def gpus(json_out: bool = JSON_OPT) -> None:
    """GPU catalog: memory, peak rates, bandwidths and the cheapest dated price."""
    from . import catalog

    rows = []
    for key, e in catalog.gpu_table().items():
        prices = catalog.prices_for(key)
        rows.append({"key": key, **{k: e.get(k) for k in ("name", "memory_mib", "bf16_tflops", "fp16_tflops", "fp32_tflops",
                                                           "memory_bandwidth_gbs", "intra_node_link", "intra_node_gbs",
                                                           "flash_attention", "source")},
                     "prices": [{k: str(v) if k == "date" else v for k, v in p.items()} for p in prices]})
    if json_out:
        _print_json(rows)
        return
    from .report.tables import simple_table
    _console().print(simple_table("GPU catalog (dense peaks; prices: cheapest newest per provider)",
                                  ["GPU", "memory GiB", "bf16 TF/s", "HBM GB/s", "link", "flash", "$/GPU-h"],
                                  [[r["key"], f"{r['memory_mib'] / 1024:.1f}", r["bf16_tflops"] or "-",
                                    r["memory_bandwidth_gbs"], f"{r['intra_node_link']} {r['intra_node_gbs']} GB/s",
                                    "yes" if r["flash_attention"] else "no",
                                    f"{r['prices'][0]['usd_per_gpu_hour']:.2f} ({r['prices'][0]['provider']})" if r["prices"] else "-"]
                                   for r in rows]))


@app.command()
def show(
    model: str = typer.Argument(..., help="Preset name, HF id in the local cache, config.json path or model folder."),
    lora_rank: int = typer.Option(16, "--lora-rank", help="Rank for the LoRA parameter count."),
    json_out: bool = JSON_OPT,
) -> None:
    """One model: architecture, parameters per component, active parameters, LoRA parameter counts."""
    from .spec.model import load_model

    m = load_model(model)
    a = m.arch
    data = {
        "name": m.name, "source": m.source, "model_type": a.model_type, "layers": m.num_layers, "hidden_size": a.hidden_size,
        "heads": a.num_heads, "kv_heads": a.num_kv_heads, "head_dim": a.head_dim, "intermediate_size": a.intermediate_size,
        "vocab_size": a.vocab_size, "tied_embeddings": a.tie_embeddings, "experts": a.num_experts, "top_k": a.top_k,
        "moe_intermediate_size": a.moe_intermediate_size, "moe_layers": len(a.moe_layers),
        "total_params": m.total_params, "active_params": m.active_params(), "params_by_component": m.params_by_component(),
        "lora_params": {t: m.lora_params(lora_rank, t) for t in ("all-linear", "attention", "mlp")}, "lora_rank": lora_rank,
    }
    if json_out:
        _print_json(data)
        return
    from .report.tables import simple_table
    rows = [[k, f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else v] for k, v in data.items()
            if k not in ("params_by_component", "lora_params")]
    rows += [[f"params: {k}", f"{v:,}"] for k, v in data["params_by_component"].items()]
    rows += [[f"LoRA r{lora_rank}: {k}", f"{v:,}"] for k, v in data["lora_params"].items()]
    _console().print(simple_table(m.name, ["field", "value"], rows))


@app.command()
def validate(
    cases: Optional[List[Path]] = typer.Option(None, "--cases", help="Published case files (default: the bundled cases)."),
    json_out: bool = JSON_OPT,
    calibration: Optional[Path] = CAL_OPT,
) -> None:
    """Predicted vs measured on published cases: absolute % error per case and metric, median and max."""
    from .validate.compare import run_validation, summary
    from .validate.cases import load_cases

    loaded = load_cases([str(c) for c in cases] if cases else None)
    results = run_validation(loaded, calibration=str(calibration) if calibration else None)
    if json_out:
        _print_json({"results": [r.to_dict() for r in results], "summary": summary(results)})
        return
    from .report.tables import simple_table
    con = _console()
    con.print(simple_table(
        f"predicted vs measured ({len(loaded)} cases)", ["case", "metric", "predicted", "measured", "error", "compared as"],
        [[r.case_id, r.metric, r.fmt(r.predicted), r.fmt(r.measured), f"{r.error_pct:+.1f}%", r.note] for r in results]))
    con.print(simple_table("absolute % error by metric", ["metric", "n", "median", "max"],
                           [[k, v["n"], f"{v['median']:.1f}%", f"{v['max']:.1f}%"] for k, v in summary(results).items()]))


@app.command()
def calibrate(
    cases: Optional[List[Path]] = typer.Option(None, "--cases", help="Case files to fit on (default: the bundled cases)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the calibration JSON here (default: print it)."),
    cv: bool = typer.Option(False, "--cv", help="Also print leave-one-case/GPU/model-out cross-validation errors."),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="Also fit a baseline model on the same data: iiswc."),
    json_out: bool = JSON_OPT,
) -> None:
    """Fit the time model's efficiency parameters to measured times; `--cv` says how well it predicts
    what it did not see."""
    from .validate.calibrate import calibrate as run_calibrate, cross_validate, time_points
    from .validate.cases import load_cases
    from .validate.compare import all_checks

    paths = [str(c) for c in cases] if cases else None
    checks = all_checks(load_cases(paths))
    cal = run_calibrate(checks, paths or ["bundled dev-cases.yaml"])
    data: dict[str, Any] = cal.to_dict()
    if cv:
        pts = time_points(checks)
        data["cross_validation"] = {
            "leave_one_case_out": cross_validate(pts, lambda p: p.check.case_id),
            "leave_one_gpu_out": cross_validate(pts, lambda p: p.check.scenario.cluster.gpu.key),
            "leave_one_model_out": cross_validate(pts, lambda p: p.check.scenario.model.name),
        }
    if baseline is not None:
        if baseline != "iiswc":
            raise FtscopeError(f"unknown baseline '{baseline}' (known: iiswc)")
        from dataclasses import asdict
        from .validate.iiswc import max_batch_fit, throughput_fit
        data["baseline_iiswc"] = [asdict(r) for r in (throughput_fit(checks), max_batch_fit(checks)) if r]
        data["baseline_iiswc_held_out_gpu"] = "not defined: Eq. 2 has no GPU term and is refitted per GPU"
    text = json.dumps(data, indent=2) + "\n"
    if out is not None:
        out.write_text(json.dumps(cal.to_dict(), indent=2) + "\n")
    if json_out or out is None:
        sys.stdout.write(text)
        return
    from .report.tables import simple_table
    con = _console()
    con.print(simple_table(f"fitted efficiencies -> {out}", ["parameter", "value"],
                           [[k, v] for k, v in data["shared"].items()]))
    con.print(f"in-sample median abs error {cal.provenance['in_sample_median_abs_pct_error']}% over {cal.provenance['points']} points")
    if "baseline_iiswc" in data:
        con.print(simple_table("IISWC baseline, fitted in-sample on the same data", ["metric", "n", "median", "max", "how"],
                               [[r["metric"], r["n"], f"{r['median_abs_pct']:.1f}%", f"{r['max_abs_pct']:.1f}%", r["how"]]
                                for r in data["baseline_iiswc"]]))
        con.print("IISWC baseline on a held-out GPU: " + data["baseline_iiswc_held_out_gpu"])
    for name, groups in data.get("cross_validation", {}).items():
        con.print(simple_table(name.replace("_", " ") + " (fit without it, predict it)", ["held out", "n", "median", "max"],
                               [[g, v["n"], f"{v['median']:.1f}%", f"{v['max']:.1f}%"] for g, v in groups.items()]))


def main() -> None:
    try:
        app()
    except FtscopeError as exc:
        sys.stderr.write(f"ftscope: error: {exc}\n")
        sys.exit(2)
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    main()
