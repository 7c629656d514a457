"""A question in one line: the common scenario keys as flags on estimate, plan and recommend, and `ftscope init`.

`@quick_flags()` adds `--model --gpu [--gpus N] --method --seq --batch --checkpointing/--no-checkpointing
--attention --zero` to a command whose first parameters are `scenario` and `overrides`; the flags become overrides
placed before the user's own (scenario file < flags < overrides, spec/quick.py), and SCENARIO becomes optional
when --model is given. The command body is unchanged: it receives the scenario path (or None) and the overrides.
"""
from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from .estimate.result import TIGHT_MARGIN

from . import options as opt
from .errors import FtscopeError
from .spec.quick import QuickFlags

SCENARIO_HELP = "Scenario YAML/JSON file (or a framework config); optional with --model (flags set the keys)."
MARGIN_OPT = typer.Option(TIGHT_MARGIN, "--margin",
                          help="Fraction of usable GPU memory to keep free: the batch is solved to leave it, a "
                               "candidate that fits only inside it is tight and ranks after the others (0: no margin).")

_FLAGS: dict[str, tuple[Any, Any]] = {
    "model": (Optional[str], typer.Option(None, "--model", help="Model: a preset (ftscope models), HF id or config.json.")),
    "gpu": (Optional[str], typer.Option(None, "--gpu", help="GPU type (ftscope gpus) -> hardware.gpu.")),
    "gpus": (Optional[int], typer.Option(None, "--gpus", help="GPU count: 1-8 on one node, or a multiple of 8 "
                                                           "(8-GPU nodes).")),
    "method": (Optional[str], typer.Option(None, "--method", help="full | lora | qlora -> mix.method.")),
    "seq": (Optional[int], typer.Option(None, "--seq", help="Sequence length in tokens -> workload.seq_len.")),
    "batch": (Optional[str], typer.Option(None, "--batch", help="Micro-batch size N or max -> workload.micro_batch_size.")),
    "checkpointing": (Optional[bool], typer.Option(None, "--checkpointing/--no-checkpointing",
                                                   help="Gradient checkpointing -> mix.gradient_checkpointing.")),
    "attention": (Optional[str], typer.Option(None, "--attention", help="eager | sdpa | flash | flash3 | flash1 "
                                                                     "-> mix.attention.")),
    "zero": (Optional[int], typer.Option(None, "--zero", help="DeepSpeed ZeRO stage 0-3 -> mix.zero_stage.")),
}


def quick_flags(count: bool = True, gpu_into: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command with the flags. `count=False` leaves --gpus to the command (plan and recommend give it
    their own meaning); `gpu_into` names a parameter that receives --gpu when it was not given itself (plan's list
    of GPU types to search)."""
    names = [n for n in _FLAGS if count or n != "gpus"]

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn, eval_str=True)

        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            flags = QuickFlags(**{n: kwargs.pop(n) for n in names})
            if "margin" in kwargs:
                opt.number(kwargs["margin"], "--margin", ge=0, lt=1)
            kwargs["scenario"], kwargs["overrides"] = _inputs(kwargs.get("scenario"), kwargs.get("overrides"), flags)
            if gpu_into and flags.gpu is not None and kwargs.get(gpu_into) is None:
                kwargs[gpu_into] = flags.gpu
            return fn(*args, **kwargs)

        params = list(sig.parameters.values())  # keyword-only: typer passes every parameter by name
        extra = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=_FLAGS[n][1], annotation=_FLAGS[n][0])
                 for n in names]
        positional = [p.replace(kind=p.KEYWORD_ONLY) for p in params]
        command.__signature__ = sig.replace(parameters=positional[:2] + extra + positional[2:])  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in command.__signature__.parameters.values()}  # type: ignore[attr-defined]
        return command

    return decorate


def _inputs(scenario: Path | None, overrides: list[str] | None, flags: QuickFlags) -> tuple[Path | None, list[str]]:
    """(scenario file or None, the flags' overrides then the user's). With --model and no file, a first
    `key=value` argument is an override, not a scenario file."""
    overrides = list(overrides or [])
    if scenario is not None and flags.model is not None and "=" in str(scenario) and not scenario.exists():
        scenario, overrides = None, [str(scenario), *overrides]
    if scenario is None:
        if flags.model is None and not any(o.startswith("model=") for o in overrides):
            raise FtscopeError("give a SCENARIO file or --model (e.g. --model llama-3.1-8b --gpu rtx-4090 --seq 4096; "
                               "`ftscope init` writes a scenario template)")
        if flags.seq is None and not any(o.startswith(("workload.seq_len=", "workload.dataset")) for o in overrides):
            raise FtscopeError("without a scenario file, give --seq N (tokens per sequence) or workload.dataset.* "
                               "token statistics")
    return scenario, flags.overrides() + overrides


def init(
    out: Optional[Path] = typer.Option(None, "--out", help="Write the template here (default: print it)."),
    model: Optional[str] = _FLAGS["model"][1], gpu: Optional[str] = _FLAGS["gpu"][1],
    gpus: Optional[int] = _FLAGS["gpus"][1], method: Optional[str] = _FLAGS["method"][1],
    seq: Optional[int] = _FLAGS["seq"][1], batch: Optional[str] = _FLAGS["batch"][1],
    checkpointing: Optional[bool] = _FLAGS["checkpointing"][1], attention: Optional[str] = _FLAGS["attention"][1],
    zero: Optional[int] = _FLAGS["zero"][1],
) -> None:
    """Write a commented scenario template: every key with its value (the default unless a flag sets it), its
    unit and what it means. Edit it, then `ftscope estimate FILE`."""
    from .spec.template import scenario_template

    flags = QuickFlags(model=model, gpu=gpu, gpus=gpus, method=method, seq=seq, batch=batch,
                       checkpointing=checkpointing, attention=attention, zero=zero)
    opt.out_file(out, "--out scenario file", (".yaml", ".yml"))
    text = scenario_template(flags)
    if out is None:
        typer.echo(text, nl=False)
        return
    from .files import write_text
    write_text(out, text, "--out scenario file")
    typer.echo(f"wrote {out}: edit it, then `ftscope estimate {out}`", err=True)
