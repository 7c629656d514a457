"""Every command the README shows runs as written (from the repo root), exits 0 without a traceback and prints
the output lines the README shows under it (scripts/refresh_readme.py refreshes them; what a command measures on
this machine, a wall-clock time, is not compared).

What the commands write under /tmp goes to a folder of this test session instead (the same command with /tmp/
replaced), so parallel checkouts do not share files and nothing lands in the repository. Commands that build or
train a real model (or read what one wrote) are marked slow.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "scripts"))
import refresh_readme  # noqa: E402  (scripts/ is not a package)
REAL_MODEL = ("ftscope profile", "ftscope trace", "ftscope study moe", "benchmarks/profile_overhead.py",
              "--db /tmp/ftscope-readme.sqlite")
"""Commands that run the real implementation, or read the store the profile command wrote."""


def readme_shown() -> list[refresh_readme.Shown]:
    return refresh_readme.shown_commands((ROOT / "README.md").read_text().splitlines())


def readme_commands() -> list[str]:
    return [s.command for s in readme_shown()]


_runnable = refresh_readme.runnable
"""Chains into other tools (accelerate) and placeholder files (s.yaml) are illustrations, not commands."""


def _param(shown: refresh_readme.Shown) -> object:
    slow = any(k in shown.command for k in REAL_MODEL)
    return pytest.param(shown, marks=[pytest.mark.slow] if slow else [], id=shown.command)


@pytest.fixture(scope="module")
def private_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this session's commands write what the README writes to /tmp (shared by the commands, in order)."""
    return tmp_path_factory.mktemp("readme-tmp")


def test_readme_shows_commands_for_the_main_verbs():
    verbs = {shlex.split(c)[1] for c in readme_commands() if c.startswith("ftscope ")}
    assert {"plan", "estimate", "show", "validate", "calibrate"} <= verbs


def test_readme_commands_write_only_under_tmp():
    for cmd in filter(_runnable, readme_commands()):
        args = shlex.split(cmd)
        for opt, value in zip(args, args[1:]):
            if opt in ("--out", "--emit", "--plot", "--png", ">"):
                assert value.startswith("/tmp/"), f"{cmd}: {opt} {value} would write into the checkout"


@pytest.mark.parametrize("shown", [_param(s) for s in readme_shown() if _runnable(s.command)])
def test_readme_command_runs_and_prints_what_the_readme_shows(shown: refresh_readme.Shown, private_tmp: Path):
    # run as a user would type it (redirects included), with this environment's ftscope first on PATH;
    # commands run in README order, so a later one may read what an earlier one wrote to /tmp
    cmd = shown.command
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": refresh_readme.WIDTH}
    line = cmd.replace(".venv/bin/python", sys.executable, 1) if cmd.startswith(".venv/bin/python") else cmd
    line = line.replace("/tmp/", f"{private_tmp}/")
    # no timeout: under load `study moe` alone took over 600 s; a hang would show as a stuck job, not a flaky fail
    proc = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    if shown.lines and not refresh_readme.measured(cmd):
        fresh = [x.rstrip() for x in (proc.stderr + proc.stdout).replace(f"{private_tmp}/", "/tmp/").splitlines()]
        assert refresh_readme.differences(shown, fresh) == [], "run scripts/refresh_readme.py"


def test_the_long_context_example_says_what_the_tool_says():
    """Its comment: LoRA at 32k just misses one H100 (so the README's `--check` line exits 1), QLoRA fits."""
    import ftscope

    path = ROOT / "examples" / "long-context-llama31-8b.yaml"
    assert "needs just over" in path.read_text() and "QLoRA with checkpointing fits" in path.read_text()
    scn = ftscope.load_scenario(path)
    lora = ftscope.estimate(scn, strict=False)
    assert not lora.fits and 30_000 < lora.max_seq_len < scn.workload.seq_len
    assert ftscope.estimate(scn.with_(method="qlora"), strict=False).fits


def test_refresh_keeps_table_rows_in_their_place():
    """A ranked row whose contents changed is refreshed from the fresh row of the same rank, not from another row of
    the same shape (that once showed ranks 3, 2, 3); a shown line found only above the previous match is reported."""
    fresh = ["│ 1 │ full +gc │ 9.9 min │", "│ 2 │ full +gc flash │ 9.9 min │", "│ 3 │ lora r16 │ 10.1 min │"]
    shown = refresh_readme.Shown("x", 0, ["│ 1 │ lora r16 │ 10.0 min │", "│ 2 │ full +gc flash │ 9.9 min │"])
    assert refresh_readme.refreshed(shown, fresh) == (fresh[:2], [])
    backwards = refresh_readme.Shown("x", 0, [fresh[2], fresh[0]])
    assert refresh_readme.refreshed(backwards, fresh) == ([fresh[2], fresh[0]], [fresh[0]])
