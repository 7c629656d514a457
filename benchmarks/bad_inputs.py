"""The bad-input suite: every verb and every file or path argument, fed what a careless or hostile user would.

Each case (benchmarks/bad_input_cases.py) runs as a real `ftscope` subprocess and must end with one of the exit
codes it allows, without a traceback, within 30 s; an error (exit 2) is exactly one line on stderr; a success
(exit 0) prints no NaN, inf or negative figure. The last line printed is the summary the README quotes.
tests/test_bad_inputs.py runs the same cases in-process.

Run: .venv/bin/python benchmarks/bad_inputs.py [-j 2] [-k substring] [-v]
(FTSCOPE="python -m ftscope.cli" with PYTHONPATH=... runs another checkout's code.)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bad_input_cases import Case, build  # noqa: E402

HANG_S = 30.0
SIGNED_KEYS = ("error_pct", "delta", "diff", "headroom_gib", "headroom_pct")
"""JSON keys whose values may be negative (a signed prediction error; memory left, below 0 when it does not fit)."""
TEXT_NONSENSE = re.compile(r"(?<![\w.-])(nan|-?inf|infinity)(?![\w-])", re.IGNORECASE)


@dataclass(frozen=True)
class Outcome:
    case: Case
    code: int | None
    """Exit code; None when the case hung."""
    stdout: str
    stderr: str
    seconds: float


def problems(o: Outcome) -> list[str]:
    """What is wrong with one outcome: traceback, hang, wrong exit, a multi-line error, nonsense figures."""
    found = []
    if o.code is None:
        return ["hang"]
    if "Traceback (most recent call last)" in o.stdout + o.stderr:
        found.append("traceback")
    if o.code not in o.case.exits:
        found.append(f"exit {o.code} (allowed {'/'.join(map(str, o.case.exits))})")
    if o.code == 2:
        lines = o.stderr.strip().splitlines()
        if len(lines) != 1 or not lines[0].startswith("ftscope: error: "):
            found.append(f"error not one line ({len(lines)} lines)")
    if o.code == 0:
        bad = nonsense(o.stdout)
        if bad:
            found.append(f"nonsense: {bad}")
    return found


def nonsense(stdout: str) -> str | None:
    """A NaN, inf or negative figure in a successful output (JSON walked; text scanned for nan/inf)."""
    try:
        data = json.loads(stdout, parse_constant=lambda c: float(c))
    except ValueError:
        m = TEXT_NONSENSE.search(stdout)
        return m.group(0) if m else None
    stack = [("", data)]
    while stack:
        key, node = stack.pop()
        if isinstance(node, dict):
            stack += [(str(k), v) for k, v in node.items()]
        elif isinstance(node, list):
            stack += [(key, v) for v in node]
        elif isinstance(node, float) and not math.isfinite(node):
            return f"{key} = {node}"
        elif isinstance(node, (int, float)) and not isinstance(node, bool) and node < 0 and not key.endswith(SIGNED_KEYS):
            return f"{key} = {node}"
    return None


def ftscope_command() -> list[str]:
    if os.environ.get("FTSCOPE"):
        return shlex.split(os.environ["FTSCOPE"])
    exe = Path(sys.executable).parent / "ftscope"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "ftscope.cli"]


def run_subprocess(case: Case, cwd: Path) -> Outcome:
    start = time.perf_counter()
    try:
        proc = subprocess.run([*ftscope_command(), *case.argv], capture_output=True, text=True, errors="replace",
                              timeout=HANG_S, cwd=cwd, stdin=subprocess.DEVNULL)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired:
        code, out, err = None, "", ""
    return Outcome(case, code, out, err, time.perf_counter() - start)


def summary(outcomes: list[Outcome]) -> str:
    def count(word: str) -> int:
        return sum(any(p.startswith(word) for p in problems(o)) for o in outcomes)
    return (f"{len(outcomes)} cases: {count('traceback')} tracebacks, {count('hang')} hangs, {count('nonsense')} "
            f"nonsense ({count('exit')} other exit codes, {count('error not one line')} multi-line errors)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-j", type=int, default=2, help="cases run at once")
    ap.add_argument("-k", default="", help="only cases whose name contains this")
    ap.add_argument("-v", action="store_true", help="print every case, not only the failing ones")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ftscope-bad-inputs-") as tmp:
        root = Path(tmp)
        cases = [c for c in build(root / "fixtures") if args.k in c.name]
        with ThreadPoolExecutor(max_workers=max(1, args.j)) as pool:
            outcomes = list(pool.map(lambda c: run_subprocess(c, root), cases))
    for o in outcomes:
        found = problems(o)
        if found or args.v:
            first = (o.stderr.strip().splitlines() or [""])[-1][:160]
            print(f"{'FAIL' if found else 'ok  '} {o.case.name} [{o.seconds:.1f} s] {'; '.join(found)} | {first}")
    slowest = max(outcomes, key=lambda o: o.seconds, default=None)
    if slowest is not None:
        print(f"slowest: {slowest.case.name} {slowest.seconds:.1f} s")
    print(summary(outcomes))
    return 0 if not any(problems(o) for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
