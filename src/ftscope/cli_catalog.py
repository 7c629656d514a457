"""The `ftscope` commands that read the catalog: models (the bundled presets), gpus (the GPU catalog), show (one
model's parameters by component). cli.py registers them on the app."""
from __future__ import annotations

from typing import Any

import typer

from . import options as opt
from .cli_io import CSV_OPT, JSON_OPT, WIDE_OPT, one_format, print_csv, print_json, print_view


def _print(rows: list, csv_rows: list, table: Any, json_out: bool, csv_out: bool, wide: bool) -> None:
    """A catalog listing as JSON, CSV or a table that fits the terminal."""
    one_format(json_out, csv_out)
    if json_out:
        print_json(rows)
    elif csv_out:
        print_csv(csv_rows)
    else:
        print_view([table], wide)


def models(json_out: bool = JSON_OPT, csv_out: bool = CSV_OPT, wide: bool = WIDE_OPT) -> None:
    """Bundled model presets (real HF config.json files) with parameter counts."""
    from .report.catalog_views import model_rows, models_table

    rows = model_rows()
    _print(rows, rows, models_table(rows), json_out, csv_out, wide)


def gpus(json_out: bool = JSON_OPT, csv_out: bool = CSV_OPT, wide: bool = WIDE_OPT) -> None:
    """GPU catalog: memory, peak rates, bandwidths and the cheapest dated price."""
    from .report.catalog_views import gpu_csv_rows, gpu_rows, gpus_table

    rows = gpu_rows()
    _print(rows, gpu_csv_rows(rows), gpus_table(rows), json_out, csv_out, wide)


def show(
    model: str = typer.Argument(..., help="Preset name, HF id in the local cache, config.json path or model folder."),
    lora_rank: int = typer.Option(16, "--lora-rank", help="Rank for the LoRA parameter count."),
    json_out: bool = JSON_OPT,
    wide: bool = WIDE_OPT,
) -> None:
    """One model: architecture, parameters per component, active parameters, LoRA parameter counts."""
    from .report.catalog_views import model_details, model_table

    opt.integer(lora_rank, "--lora-rank", 1, 4096)
    data = model_details(model, lora_rank)
    if json_out:
        print_json(data)
        return
    print_view([model_table(data)], wide)
