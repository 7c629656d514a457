"""What the commands print on a terminal or a pipe: tables that fit COLUMNS (honoured when piped too) with a
header on every column and no cell cut; --wide with every column; --csv with the table's rows; --version; shell
completion. Run through the real CLI (typer's CliRunner, or a subprocess where the process matters)."""
from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ftscope.cli import app
from ftscope.errors import FtscopeError
from ftscope.version import __version__

REPO = Path(__file__).resolve().parents[1]
IISWC = str(REPO / "examples" / "iiswc-mixtral-qlora.yaml")
BREAKDOWN_NAMES = (["category", "GiB"], ["part", "s"])
"""The headers of a breakdown printed one value per line (report.tables.estimate_tables)."""


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    p = tmp_path_factory.mktemp("cli-io") / "dense.yaml"
    p.write_text(yaml.safe_dump({"model": "llama-3.2-1b", "hardware": {"gpu": "a100-80gb"},
                                 "mix": {"method": "lora", "attention": "sdpa"},
                                 "workload": {"micro_batch_size": 2, "seq_len": 512, "num_samples": 1000}}))
    return str(p)


@pytest.fixture(scope="module")
def one_case(tmp_path_factory):
    from importlib import resources

    from ftscope.validate.cases import BUNDLED
    data = yaml.safe_load(resources.files("ftscope").joinpath("data", BUNDLED).read_text())
    p = tmp_path_factory.mktemp("cli-io") / "cases.yaml"
    p.write_text(yaml.safe_dump({"cases": [c for c in data["cases"] if c["id"] == "iiswc-a40-mixtral-math-sparse"]}))
    return str(p)


def run(*args: str, columns: int | None = 80) -> str:
    r = CliRunner().invoke(app, list(args), env={"COLUMNS": None if columns is None else str(columns)})
    assert r.exit_code == 0, (r.output, r.exception)
    return r.stdout


def _cells(line: str, rule: str) -> list[str]:
    return [c.strip() for c in line.strip()[1:-1].split(rule)]


def boxes(text: str) -> list[dict]:
    """Each boxed table printed: its headers (a wrapped header's lines joined with spaces; None for a table without
    a header row) and each column's text, every line of it joined with the spaces squeezed out (wrapping and
    folding move text between lines; cutting loses it)."""
    tables, head, body, state = [], [], [], None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith(("┏", "┌")):
            head, body, state = [], [], ("head" if s.startswith("┏") else "body")
        elif s.startswith("┡"):
            state = "body"
        elif s.startswith("└"):
            headers = [" ".join(" ".join(parts).split()) for parts in zip(*head)] if head else None
            tables.append({"headers": headers, "columns": ["".join("".join(parts).split()) for parts in zip(*body)]})
            state = None
        elif state == "head":
            head.append(_cells(s, "┃"))
        elif state == "body":
            body.append(_cells(s, "│"))
    return tables


def _hidden(text: str) -> str:
    flat = " ".join(text.split())
    m = re.search(r"not shown at \d+ columns: (.*?) \(--wide shows every column\)", flat)
    return m.group(1) if m else ""


def assert_same_cells(narrow: dict, wide: dict, hidden: str) -> None:
    """Every column the narrow table shows holds exactly the wide table's text for that column (nothing cut), in
    the same order; a column left out is named in the line under the table; every header is there."""
    if narrow["headers"] in BREAKDOWN_NAMES:  # one value per line: the wide table's headers are its first column
        assert narrow["columns"] == ["".join("".join(wide["headers"]).split()), "".join(wide["columns"])]
        return
    if wide["headers"] is not None:
        assert narrow["headers"] and all(narrow["headers"]), narrow["headers"]  # a header on every column
    left = list(zip(wide["headers"] or [None] * len(wide["columns"]), wide["columns"]))
    for i, column in enumerate(narrow["columns"]):
        while left and left[0][1] != column:
            header, _ = left.pop(0)
            assert header and header in hidden, (header, hidden)  # left out, and the line under says so
        assert left, f"column {i} of the narrow table is not a column of the wide one (a cell was cut): {column}"
        header, _ = left.pop(0)
        if header is not None:  # the full header, or its abbreviation
            assert narrow["headers"][i] == header or len(narrow["headers"][i]) < len(header)
    assert all(header in hidden for header, _ in left)


VIEWS = [("plan", [IISWC]), ("estimate", [IISWC]), ("show", ["mixtral-8x7b"]), ("models", []), ("gpus", []),
         ("validate", []), ("recommend", ["DENSE", "--gpus", "a100-80gb:2", "--top", "5"])]


@pytest.mark.parametrize("verb,args", VIEWS, ids=[v for v, _ in VIEWS])
def test_at_80_columns_every_table_fits_with_every_header_and_no_cell_cut(verb, args, dense):
    args = [dense if a == "DENSE" else a for a in args]
    narrow, wide = run(verb, *args, columns=80), run(verb, *args, "--wide", columns=80)
    lines = narrow.splitlines()
    assert lines and max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert "…" not in narrow
    n_tables, w_tables = boxes(narrow), boxes(wide)
    assert n_tables and len(n_tables) == len(w_tables)
    for n, w in zip(n_tables, w_tables):
        assert_same_cells(n, w, _hidden(narrow))


def test_the_plan_table_names_its_last_column():
    headers = boxes(run("plan", IISWC, "--wide"))[0]["headers"]
    assert headers[-1] == "note" and all(headers)


def test_calibrate_prints_a_table_of_the_fit_not_json(one_case):
    text = run("calibrate", "--cases", one_case, columns=80)
    assert not text.lstrip().startswith("{") and "fitted efficiencies" in text
    table = boxes(text)[0]
    assert table["headers"] == ["parameter", "value"] and "gemm_ampere" in table["columns"][0]
    assert not re.search(r"\d\.\d{6,}", text)  # rounded, not raw floats
    assert json.loads(run("calibrate", "--cases", one_case, "--json"))["shared"]


def test_columns_is_honoured_when_piped_and_160_is_the_default_without_it():
    assert max(map(len, run("plan", IISWC, columns=100).splitlines())) <= 100
    unset = run("plan", IISWC, columns=None)
    assert 80 < max(map(len, unset.splitlines())) <= 160 and "not shown" not in unset


def test_wide_shows_every_column_however_narrow_the_terminal():
    wide = run("models", "--wide", columns=40)
    assert boxes(wide)[0]["headers"] == ["name", "family", "params", "active", "experts", "HF id"]
    assert "not shown" not in wide and "mistralai/Mixtral-8x7B-v0.1" in wide


def _csv(*args: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(run(*args))))


def test_csv_holds_the_rows_of_the_table_with_the_json_numbers(dense):
    plan = json.loads(run("plan", IISWC, "--all", "--json"))["rows"]
    rows = _csv("plan", IISWC, "--all", "--csv")
    assert len(rows) == len(plan) and rows[0]["gpu"] == plan[0]["scenario"]["hardware"]["gpu"]
    assert float(rows[0]["usd"]) == plan[0]["run"]["usd"] and rows[0]["pareto"] == "True"
    assert len(_csv("plan", IISWC, "--csv")) < len(plan)  # the default view: the best count per GPU
    est = _csv("estimate", IISWC, "--csv")
    assert len(est) == 1 and float(est[0]["memory.peak_gib"]) == json.loads(run("estimate", IISWC, "--json"))[
        "memory"]["peak_gib"]
    assert len(_csv("models", "--csv")) == len(json.loads(run("models", "--json")))
    assert {r["key"] for r in _csv("gpus", "--csv")} >= {"a40", "h100-80gb"}
    assert len(_csv("validate", "--csv")) == len(json.loads(run("validate", "--json"))["results"])
    rec = _csv("recommend", dense, "--gpus", "a100-80gb:2", "--top", "3", "--csv")
    assert [r["rank"] for r in rec] == ["1", "2", "3"] and all(r["feasible"] == "True" for r in rec)


def test_json_and_csv_together_is_a_user_error():
    r = CliRunner().invoke(app, ["models", "--json", "--csv"])
    assert isinstance(r.exception, FtscopeError) and "--json and --csv" in str(r.exception)


def test_version():
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.strip() == f"ftscope {__version__}"


def test_shell_completion_completes_verbs_and_options():
    exe = Path(sys.executable).parent / "ftscope"
    if not exe.exists():
        pytest.skip("the ftscope script is not installed in this environment")
    env = {**os.environ, "_FTSCOPE_COMPLETE": "complete_bash", "COMP_WORDS": "ftscope pl", "COMP_CWORD": "1"}
    assert subprocess.run([str(exe)], env=env, capture_output=True, text=True).stdout.split() == ["plan"]
    env.update(COMP_WORDS="ftscope plan --wi", COMP_CWORD="2")
    assert subprocess.run([str(exe)], env=env, capture_output=True, text=True).stdout.split() == ["--wide"]
    script = subprocess.run([str(exe), "--show-completion", "bash"], capture_output=True, text=True).stdout
    assert "_FTSCOPE_COMPLETE=complete_bash" in script
