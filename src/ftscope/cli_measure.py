"""The `ftscope` commands that run the real implementation: profile (real steps, one process or torchrun),
trace (fake tensors), study moe (fine-tuning per top-k). cli.py registers them on the app."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, List, Optional

import typer

from . import options as opt
from .cli_io import JSON_OPT, OVERRIDES_ARG, console, load_input, print_json, print_view
from .errors import FtscopeError


def _with_progress(run: Any, first: str) -> Any:
    """run(progress=...) under a spinner on stderr that shows the latest progress message (on a terminal only)."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=Console(stderr=True),
                  transient=True) as bar:
        task = bar.add_task(first, total=None)
        return run(progress=lambda m: bar.update(task, description=m))


def _check_profile_options(device: str, steps: int, warmup: int, memory_cap_gib: Optional[float], nproc: int,
                           nnodes: int, node_rank: int, timeout_s: int) -> None:
    opt.device(device)
    opt.integer(steps, "--steps", 1, 100_000)
    opt.integer(warmup, "--warmup", 0, 100_000)
    opt.number(memory_cap_gib, "--memory-cap-gib", gt=0, le=1_000_000)
    opt.integer(nproc, "--nproc", 1, 1024)
    opt.integer(nnodes, "--nnodes", 1, 4096)
    opt.integer(node_rank, "--node-rank", 0, nnodes - 1)
    opt.integer(timeout_s, "--timeout", 1, 7 * 24 * 3600)


def _check_profile_inputs(weights: Optional[str], data: Optional[str], tokenizer: Optional[str],
                          emit_dir: Optional[Path], plot_file: Optional[Path]) -> None:
    opt.model_dir(weights, "--weights folder")
    opt.input_file(data, "--data file")
    opt.input_file(tokenizer, "--tokenizer file")
    if (data is None) != (tokenizer is None):
        raise FtscopeError("--data and --tokenizer go together (a local JSONL and a local tokenizer.json)")
    opt.out_dir(emit_dir, "--emit folder")
    opt.out_file(plot_file, "--plot file", (".png", ".svg"))


def _open_store_for_writing(db: Path) -> None:
    """Open (or create) the results store now, so a bad --db fails before the model is built."""
    from .measure.store import Store

    Store(opt.check_path(db, "--db store")).close()


def profile(
    scenario: Path = typer.Argument(..., help="Scenario YAML/JSON file."),
    overrides: Optional[List[str]] = OVERRIDES_ARG,
    device: str = typer.Option("auto", "--device", help="auto | cuda | cpu."),
    steps: int = typer.Option(3, "--steps", help="Timed steps per batch size."),
    warmup: int = typer.Option(1, "--warmup", help="Untimed steps first."),
    batch_sizes: str = typer.Option("1,2,4", "--batch-sizes", help="Micro-batch sizes to measure."),
    find_max_batch: bool = typer.Option(False, "--find-max-batch", help="Search the largest batch that fits (grow, then bisect)."),
    memory_cap_gib: Optional[float] = typer.Option(None, "--memory-cap-gib", help="Pretend the device has this much "
                                                   "memory (CPU: the tensor tracker raises OOM past it)."),
    shrink: Optional[str] = typer.Option(None, "--shrink", help="Shrink the real config: layers=2,hidden=256,experts=4."),
    weights: Optional[str] = typer.Option(None, "--weights", help="Local Hugging Face model folder: config.json + "
                                          "*.safetensors matching the scenario's model (default: random weights)."),
    data: Optional[str] = typer.Option(None, "--data", help="Local JSONL to draw sample lengths from."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Local tokenizer.json for --data."),
    db: Path = typer.Option(Path("ftscope-runs.sqlite"), "--db", help="SQLite results store."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted sweep without repeating finished points."),
    no_hooks: bool = typer.Option(False, "--no-hooks", help="No layer timing / expert counting hooks."),
    nproc: int = typer.Option(1, "--nproc", help="Processes (GPUs) per node: >1 launches torchrun with the mix's "
                                                 "engine (DDP, DeepSpeed ZeRO 1-3 (+offload) or FSDP2)."),
    nnodes: int = typer.Option(1, "--nnodes", help="Nodes (run the command once per node)."),
    node_rank: int = typer.Option(0, "--node-rank", help="This node's rank."),
    master_addr: str = typer.Option("127.0.0.1", "--master-addr", help="Rank 0's address."),
    emit_dir: Optional[Path] = typer.Option(None, "--emit", help="Distributed runs: write the DeepSpeed JSON / "
                                                                  "accelerate YAML the run used."),
    timeout_s: int = typer.Option(600, "--timeout", help="Distributed runs: give up (and kill every rank) after this."),
    plot_file: Optional[Path] = typer.Option(None, "--plot", help="Write the measured time breakdown chart (PNG/SVG)."),
    json_out: bool = JSON_OPT,
) -> None:
    """Measure real fine-tuning steps (transformers, PEFT, bitsandbytes): peak memory, forward / backward /
    optimizer time, time by layer type, expert load, utilization, throughput; stored point by point."""

    sizes = opt.ints(batch_sizes, "--batch-sizes", 1, 65_536)
    if not sizes and not find_max_batch:
        raise FtscopeError("--batch-sizes needs at least one batch size (or use --find-max-batch)")
    _check_profile_options(device, steps, warmup, memory_cap_gib, nproc, nnodes, node_rank, timeout_s)
    shrink_map = opt.shrink(shrink)
    _check_profile_inputs(weights, data, tokenizer, emit_dir, plot_file)
    scn, _ = load_input(scenario, overrides)
    if data is not None:
        from .measure.runtime.batches import read_jsonl_lengths
        read_jsonl_lengths(data, tokenizer)  # a bad data file or tokenizer fails before the model is built
    _open_store_for_writing(db)
    if nproc > 1 or nnodes > 1:
        if weights is not None:
            raise FtscopeError("--weights with --nproc/--nnodes > 1 is not supported yet: each engine would need its own "
                               "loading path (ZeRO-3 / FSDP shard while loading); profile one process, or use random weights")
        from .measure.distributed.launcher import profile_distributed
        dist = profile_distributed(scn, nproc, nnodes=nnodes, node_rank=node_rank, master_addr=master_addr,
                                   device=device, steps=steps, warmup=warmup, batch_sizes=sizes,
                                   shrink=shrink_map, db=str(db), emit_dir=str(emit_dir) if emit_dir else None,
                                   timeout_s=timeout_s)
        if json_out:
            print_json(dist.to_dict())
        else:
            from .report.measure_views import distributed_view
            print_view(distributed_view(dist, scn))
        if dist.status != "done":
            raise typer.Exit(1)
        return
    from .measure.runtime.profile import profile as run_profile

    run = functools.partial(run_profile, scn, device=device, steps=steps, warmup=warmup, batch_sizes=sizes,
                            find_max_batch=find_max_batch, shrink=shrink_map, weights=weights, data=data,
                            tokenizer=tokenizer, db=str(db), resume=resume, memory_cap_gib=memory_cap_gib,
                            hooks=not no_hooks)
    result = run() if json_out else _with_progress(run, "building the model")
    if plot_file is not None:
        from .report import charts
        rows = [{"label": f"b{p.batch}", "breakdown_s": {"forward": p.forward_s, "backward": p.backward_s,
                                                          "optimizer": p.optimizer_s}} for p in result.points if p.status == "ok"]
        charts.save(charts.time_breakdown(rows, f"{scn.model.name}: measured step time ({result.device})"), plot_file)
    if json_out:
        print_json(result.to_dict())
        return
    from .report.measure_views import profile_view
    print_view(profile_view(result, scn, db))


def trace(
    scenario: Path = typer.Argument(..., help="Scenario YAML/JSON file."),
    overrides: Optional[List[str]] = OVERRIDES_ARG,
    batch: Optional[int] = typer.Option(None, "--batch", help="Micro-batch to trace (default: the scenario's, 1 for max)."),
    seq: Optional[int] = typer.Option(None, "--seq", help="Sequence length (default: the scenario's longest)."),
    shrink: Optional[str] = typer.Option(None, "--shrink", help="Trace a smaller copy: layers=2,hidden=256,..."),
    json_out: bool = JSON_OPT,
) -> None:
    """Exact tensor memory and FLOPs of the real HF implementation at full size, without allocating:
    one training step under fake tensors, memory by category and phase, FLOPs by layer type, beside the estimate."""
    from . import estimate as run_estimate
    from .spec.workload import MAX_SEQ

    opt.integer(batch, "--batch", 1, 65_536)
    opt.integer(seq, "--seq", 2, MAX_SEQ)
    shrink_map = opt.shrink(shrink)
    scn, _ = load_input(scenario, overrides)
    from .measure.trace.tracer import trace as run_trace

    from .report.progress import Spinner
    with Spinner("tracing one training step under fake tensors", enabled=not json_out):
        result = run_trace(scn, batch=batch, seq=seq, shrink=shrink_map)
    data = result.to_dict()
    est = None
    if shrink is None:
        # the estimate of the shape traced: --batch x --seq, one fixed-length batch
        est = run_estimate(scn.with_(micro_batch_size=result.batch, seq_len=result.seq, padding="max_length"),
                           strict=False).to_dict()
        data["estimate_memory"] = est["memory"]
    if json_out:
        print_json(data)
        return
    from .report.measure_views import trace_view
    print_view(trace_view(data, est, scn, result.build.notes))


def study_moe_cmd(
    scenario: Path = typer.Argument(..., help="Scenario of an MoE model (e.g. examples/moe-study-demo.yaml)."),
    overrides: Optional[List[str]] = OVERRIDES_ARG,
    data: Path = typer.Option(..., "--data", help="Training JSONL ({prompt, answer} or {prompt, choices, answer})."),
    eval_data: Path = typer.Option(..., "--eval", help="Evaluation JSONL, same format."),
    tokenizer: Path = typer.Option(..., "--tokenizer", help="Local tokenizer.json."),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Epochs (default: the scenario's)."),
    top_k: Optional[str] = typer.Option(None, "--top-k", help="Top-k values to compare (default: the model's and all experts)."),
    device: str = typer.Option("auto", "--device", help="auto | cuda | cpu."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Micro-batch (default: the scenario's)."),
    lr: float = typer.Option(1.5e-3, "--lr", help="Peak learning rate (AdamW, cosine decay)."),
    memory_cap_gib: Optional[float] = typer.Option(None, "--memory-cap-gib", help="Budget for the measured max-batch search."),
    no_max_batch: bool = typer.Option(False, "--no-max-batch", help="Skip the max-batch search."),
    seed: int = typer.Option(0, "--seed", help="Same initial weights and batch order for every top-k."),
    weights: Optional[str] = typer.Option(None, "--weights", help="Local Hugging Face model folder to start from (default: random weights)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write study.json, tables.md and the plots here."),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="With --out: accuracy, loss and expert-load charts."),
    json_out: bool = JSON_OPT,
) -> None:
    """Sparse vs dense MoE fine-tuning (the IISWC accuracy study): train with each top-k, evaluate every epoch,
    compare loss, accuracy, throughput, max batch and the expert load before and after fine-tuning."""

    ks = opt.ints(top_k, "--top-k", 1, 65_536) or None
    opt.integer(epochs, "--epochs", 1, 10_000)
    opt.integer(batch_size, "--batch-size", 1, 65_536)
    opt.number(lr, "--lr", gt=0, le=10)
    opt.number(memory_cap_gib, "--memory-cap-gib", gt=0, le=1_000_000)
    opt.integer(seed, "--seed", 0, 2**32 - 1)
    opt.device(device)
    for path, what in ((data, "--data file"), (eval_data, "--eval file"), (tokenizer, "--tokenizer file")):
        opt.input_file(path, what)
    opt.model_dir(weights, "--weights folder")
    opt.out_dir(out, "--out folder")
    scn, _ = load_input(scenario, overrides)
    from .report.moe_study import write_outputs
    from .studies.moe.study import study_moe

    con = console() if not json_out else None
    result = study_moe(scn, str(data), str(eval_data), str(tokenizer), epochs=epochs, top_ks=ks, device=device,
                       seed=seed, batch_size=batch_size, lr=lr, max_batch=not no_max_batch, memory_cap_gib=memory_cap_gib,
                       progress=(lambda m: con.print(m)) if con is not None else None, weights=weights)
    if out is not None:
        write_outputs(result, out, plot)
    if json_out:
        print_json(result.to_dict())
        return
    from .report.study_views import moe_view
    print_view(moe_view(result) + ([f"wrote {out}/"] if out is not None else []))
