"""Re-run every command the README shows and refresh the output it prints under the command.

The README shows sample output under each `$ ` line of a ```console block, often a selection: some rows, an
elision line (`...`, or a table row of `..` cells) for the rest. This script runs each command as
tests/test_readme.py does (from the repository root, what it writes to /tmp going to a folder of its own) and
replaces every shown line by the line of the fresh output it stands for, in the fresh output's order: the table row
with the same first cell, the line of the same shape (its numbers masked), or failing that the most similar one. Lines that stand for nothing in the fresh output are reported,
for a person to edit.

    python scripts/refresh_readme.py           # rewrite README.md in place (--measured: profile, study moe too)
    python scripts/refresh_readme.py --check   # exit 1 and list the lines a fresh run would change

Commands that measure time on this machine (`profile`, and what reads its store) print different figures on every
run: they are refreshed but never checked. tests/test_readme.py checks the rest on every test run.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
WIDTH = "160"
"""Terminal width the commands render at (rich tables wrap to it): the README's samples are this wide."""
MEASURED = ("ftscope profile", "--db /tmp/ftscope-readme.sqlite", "ftscope study moe", "benchmarks/")
"""Commands whose output holds figures measured on this machine (wall-clock times): refreshed, not checked."""
ELISION = re.compile(r"^\s*(\.\.\.|…|[│|]\s*\.\.\s*[│|].*)\s*$")
NUMBER = re.compile(r"[-+$]?\d[\d,]*(\.\d+)?")


@dataclass(frozen=True)
class Shown:
    """One `$ ` command of a console block and the output lines the README shows under it."""

    command: str
    first_line: int
    """Index in the README's lines of the first output line (the one after the command)."""
    lines: list[str]


def shown_commands(lines: list[str]) -> list[Shown]:
    """Every `$ ` line of every ```console block, with the output lines up to the next command or the fence."""
    out: list[Shown] = []
    inside = False
    current: Shown | None = None
    for i, line in enumerate(lines):
        if line.startswith("```"):
            inside = line.strip() == "```console" and not inside
            if current is not None:
                out.append(current)
                current = None
            continue
        if not inside:
            continue
        if line.startswith("$ "):
            if current is not None:
                out.append(current)
            current = Shown(line[2:].split("  #")[0].strip(), i + 1, [])
        elif current is not None:
            current.lines.append(line)
    return out


def runnable(command: str) -> bool:
    """What tests/test_readme.py runs: chains into other tools and placeholder files are illustrations."""
    return "&&" not in command and " s.yaml" not in command


def measured(command: str) -> bool:
    return any(k in command for k in MEASURED)


def run(command: str, tmp: Path) -> list[str]:
    """stderr then stdout of the command, one line each, trailing spaces dropped (as the README holds them)."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": WIDTH}
    line = command.replace(".venv/bin/python", sys.executable, 1) if command.startswith(".venv/bin/python") else command
    proc = subprocess.run(["bash", "-c", line.replace("/tmp/", f"{tmp}/")], cwd=ROOT, capture_output=True,
                          text=True, env=env)
    text = (proc.stderr + proc.stdout).replace(f"{tmp}/", "/tmp/")
    return [x.rstrip() for x in text.splitlines()]


def shape(line: str) -> str:
    """The line with its numbers masked and its padding collapsed (table columns widen with their values)."""
    return " ".join(NUMBER.sub("#", line).split())


def lead(line: str) -> str:
    """What a line is about: a table row's first cell, or the words before a line's first colon."""
    text = line.strip()
    if text[:1] in "│┃|":
        cells = [c.strip() for c in re.split(r"[│┃|]", text) if c.strip()]
        return f"row:{cells[0]}" if cells else ""
    head, sep, _ = text.partition(":")
    return f"text:{head}" if sep and len(head) < 60 else ""


def counterpart(line: str, fresh: list[str], start: int = 0) -> int | None:
    """Index of the fresh line a shown line stands for, at or after `start` (the shown lines keep the fresh output's
    order): itself; the table row with the same first cell (a rank keeps its place when the rows change); the same
    shape with other numbers; the line about the same thing (same words before its colon); the closest."""
    rest = list(enumerate(fresh))[start:]
    for i, f in rest:
        if f == line.rstrip():
            return i
    for key in (lambda x: lead(x) if lead(x).startswith("row:") else "", shape, lead):
        k = key(line)
        for i, f in rest:
            if k and key(f) == k:
                return i
    close = difflib.get_close_matches(line.strip(), [f.strip() for _, f in rest], n=1, cutoff=0.75)
    if close:
        return next(i for i, f in rest if f.strip() == close[0])
    return None


def differences(shown: Shown, fresh: list[str]) -> list[str]:
    """What a fresh run changes in the shown lines (padding aside), and the shown lines it has no line for."""
    new, missing = refreshed(shown, fresh)
    out = [f"- {old}\n+ {now}" for old, now in zip(shown.lines, new) if old.split() != now.split()]
    return out + [f"? no fresh line stands for: {line}" for line in missing]


def refreshed(shown: Shown, fresh: list[str]) -> tuple[list[str], list[str]]:
    """(the shown lines with each replaced by its fresh counterpart, the shown lines that have none)."""
    out, missing = [], []
    start = 0
    for line in shown.lines:
        if not line.strip() or ELISION.match(line):
            out.append(line)
            continue
        match = counterpart(line, fresh, start)
        if match is None:
            missing.append(line)
            out.append(line)
        else:
            out.append(fresh[match])
            start = match + 1
    return out, missing


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a fresh run differs")
    ap.add_argument("-k", default="", help="only commands containing this text")
    ap.add_argument("--measured", action="store_true", help="also re-run and refresh the commands that measure "
                                                            "on this machine (profile, study moe: minutes)")
    args = ap.parse_args()
    lines = README.read_text().splitlines()
    changed = unmatched = 0
    with tempfile.TemporaryDirectory(prefix="ftscope-readme-") as tmp:
        for shown in shown_commands(lines):
            if not runnable(shown.command) or args.k not in shown.command:
                continue
            if measured(shown.command) and (args.check or not args.measured):
                continue
            if not shown.lines and "/tmp/" not in shown.command:
                continue  # what shows no output and writes no file a later command may read need not run
            fresh = run(shown.command, Path(tmp))
            if not shown.lines:
                continue
            new, missing = refreshed(shown, fresh)
            for old, now in zip(shown.lines, new):
                if old.split() != now.split():  # padding alone (a column's width) is no change
                    changed += 1
                    print(f"$ {shown.command}\n  - {old}\n  + {now}")
            for line in missing:
                unmatched += 1
                print(f"$ {shown.command}\n  ? no fresh line stands for: {line}")
            lines[shown.first_line:shown.first_line + len(new)] = new
    if not args.check:
        README.write_text("\n".join(lines) + "\n")
    print(f"{changed} lines {'differ' if args.check else 'refreshed'}, {unmatched} without a counterpart")
    return 1 if args.check and (changed or unmatched) else 0


if __name__ == "__main__":
    sys.exit(main())
