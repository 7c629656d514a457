"""What every `ftscope` command shares: the --json and --calibration options, printing one JSON document or a
view (rich tables and lines) to the terminal, and comma-separated option values."""
from __future__ import annotations

import json
import sys
from typing import Any, List, Optional

import typer

from .errors import FtscopeError

JSON_OPT = typer.Option(False, "--json", help="Print one JSON document (the output contract) and nothing else.")
CAL_OPT = typer.Option(None, "--calibration", help="Efficiency calibration file (default: the bundled fit).")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def console() -> Any:
    from rich.console import Console
    con = Console()
    if not con.is_terminal:  # piped or captured: don't wrap tables at 80 columns
        con = Console(width=160)
    return con


def split(value: Optional[str]) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()] if value else []


def ints(value: Optional[str], option: str) -> list[int]:
    try:
        return [int(v) for v in split(value)]
    except ValueError:
        raise FtscopeError(f"{option} must be comma-separated integers; got {value!r}") from None


def print_view(items: List[Any]) -> None:
    """Print a view: rich tables and lines of text."""
    con = console()
    for item in items:
        con.print(item)
