"""What every `ftscope` command shares: the --json, --calibration, --show-scenario options and the overrides
argument, reading a scenario (or a framework's config), printing one JSON document or a view (rich tables and
lines) to the terminal."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, List, Optional

import typer

from . import options as opt

JSON_OPT = typer.Option(False, "--json", help="Print one JSON document (the output contract) and nothing else.")
CAL_OPT = typer.Option(None, "--calibration", help="Efficiency calibration file (default: the bundled fit).")
SHOW_OPT = typer.Option(False, "--show-scenario", help="Print the scenario first (a framework config: as mapped).")
CSV_OPT = typer.Option(False, "--csv", help="Print the table's rows as CSV (a header line, raw numbers) and nothing else.")
WIDE_OPT = typer.Option(False, "--wide", help="Show every column however wide (default: fit the terminal, or COLUMNS).")


def _overrides_help() -> str:
    from .spec.mix import mix_help  # the allowed values come from Mix's field types, nowhere else
    return f"key.path=value overrides, e.g. mix.zero_stage=3. Choices: {mix_help()}."


OVERRIDES_ARG = typer.Argument(None, help=_overrides_help())

split = opt.split


def print_json(data: Any) -> None:
    from .report.contract import to_json
    sys.stdout.write(to_json(data))


def print_csv(rows: Any) -> None:
    """The rows as CSV on stdout (report/csv_out.py)."""
    from .report.csv_out import write_csv
    write_csv(rows, sys.stdout)


def one_format(json_out: bool, csv_out: bool) -> None:
    if json_out and csv_out:
        from .errors import FtscopeError
        raise FtscopeError("--json and --csv: choose one output format")


def json_lines(row: Any) -> None:
    """One compact JSON document per line (recommend --all streams rows as the search produces them)."""
    if hasattr(row, "to_dict"):
        row = row.to_dict()
    sys.stdout.write(json.dumps(row, default=str) + "\n")


PIPED_WIDTH = 160
"""Columns when stdout is not a terminal and COLUMNS is unset (a log or a file: don't squeeze tables to 80)."""


WIDE_WIDTH = 10_000
"""The console's width under --wide: every table at its natural width (the terminal wraps what is longer)."""


def console(wide: bool = False) -> Any:
    """The stdout console: as wide as COLUMNS says (piped or not), else the terminal, else PIPED_WIDTH."""
    import os

    from rich.console import Console
    if wide:
        return Console(width=WIDE_WIDTH)
    con = Console()
    if not con.is_terminal and not os.environ.get("COLUMNS", "").strip().isdigit():
        con = Console(width=PIPED_WIDTH)
    return con


def print_view(items: List[Any], wide: bool = False) -> None:
    """Print a view: rich tables and lines of text (tables fit the console's width unless wide)."""
    con = console(wide)
    for item in items:
        con.print(item, crop=False)  # a table narrower than its essentials grows: the terminal wraps it, nothing is cut


def load_input(path: Optional[Path], overrides: Optional[List[str]], show: bool = False,
               json_out: bool = False) -> tuple[Any, Any]:
    """(scenario, framework config or None) of a scenario file or a framework config (Axolotl, LLaMA-Factory,
    torchtune, TRL), or of the overrides alone when there is no file (flags, cli_quick.py): what a framework
    config's mapping left out or assumed goes to stderr, one line each."""
    from .spec.frameworks import load
    from .spec.scenario import load_scenario

    scn, cfg = load(path, overrides or []) if path is not None else (load_scenario({}, overrides or []), None)
    if cfg is not None:
        sys.stderr.write(f"ftscope: {path}: read as a config of {cfg.format} (framework: {scn.recipe.name})\n")
        for line in cfg.unmapped:
            sys.stderr.write(f"ftscope: warning: not mapped: {line}\n")
        for line in cfg.notes:
            sys.stderr.write(f"ftscope: note: {line}\n")
    if show:
        import yaml
        text = yaml.safe_dump(scn.to_dict(), sort_keys=False)
        (sys.stderr if json_out else sys.stdout).write(text)
    return scn, cfg


def notes_to_stderr() -> None:
    """ftscope's own notes (which preset a model reference was matched to) as one stderr line each."""
    import logging
    log = logging.getLogger("ftscope")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("ftscope: note: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def fail(message: str) -> None:
    sys.stderr.write(f"ftscope: error: {' '.join(message.split())}\n")
    sys.exit(2)
