"""Running torchrun for a distributed profile: the ranks' environment, DeepSpeed's op cache, the launch itself
(bounded by a timeout, never a hang), and reading back the JSON report each rank writes.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import require_torch


def project_root() -> Path:
    """The source checkout ftscope runs from (where pyproject.toml sits), else the working directory."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "src" / "ftscope").is_dir():
            return parent
    return Path.cwd()


def extensions_dir() -> Path:
    """Where DeepSpeed's JIT-compiled ops are cached: $TORCH_EXTENSIONS_DIR, else <project>/.cache/torch_extensions."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(env) if env else project_root() / ".cache" / "torch_extensions"


def rank_environment(device: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment torchrun and the ranks get."""
    env = dict(os.environ)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir()))
    env.setdefault("DS_BUILD_OPS", "0")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if device == "cpu":
        env["OMP_NUM_THREADS"] = env.get("FTSCOPE_RANK_THREADS", "1")  # N ranks share the cores
        env["DS_ACCELERATOR"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
    src = str(project_root() / "src")
    if (project_root() / "src" / "ftscope").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def prebuild_deepspeed_ops() -> Path:
    """JIT-compile DeepSpeed's CPU shared-memory comm op into the project cache now (what the first CPU
    DeepSpeed run would otherwise do); returns the cache folder. For `make test` / CI warm-up."""
    require_torch(("deepspeed",))
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir()))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        builder.load(verbose=False)
    return Path(os.environ["TORCH_EXTENSIONS_DIR"])


def free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr if addr not in ("localhost",) else "127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_reports(out: Path) -> list[dict[str, Any]]:
    """Rank reports: all.json (every rank, gathered by rank 0) when the run got that far, else rank<R>.json."""
    gathered = out / "all.json"
    if gathered.is_file():
        try:
            return sorted(json.loads(gathered.read_text())["ranks"], key=lambda d: d["rank"])
        except (OSError, ValueError, KeyError):
            pass
    docs = []
    for f in sorted(out.glob("rank*.json")):
        try:
            docs.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(docs, key=lambda d: d.get("rank", 0))


def _kill(proc: subprocess.Popen, out: Path) -> None:
    """Stop torchrun's process group, then any rank (by the pid it reported) still alive."""
    with_pids = [d.get("pid") for d in read_reports(out) if d.get("pid")]
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    for pid in with_pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError):
            pass


@dataclass
class Launch:
    """How torchrun ended."""

    returncode: int | None
    """None: killed on timeout."""
    timed_out: bool
    wall_s: float
    log: list[str]
    """Everything torchrun and the ranks printed (the last 200 lines)."""


def launch(cmd: list[str], env: dict[str, str], work: Path, out: Path, timeout_s: float,
           say: Callable[[str], None]) -> Launch:
    """Run torchrun in its own session, echoing the ranks' progress lines; past `timeout_s` stop every rank."""
    log: deque[str] = deque(maxlen=200)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, cwd=str(work), text=True, errors="replace", start_new_session=True)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            log.append(line)
            if line.startswith("ftscope[rank"):
                say(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        say(f"timed out after {timeout_s:.0f} s: stopping every rank")
        _kill(proc, out)
    except BaseException:
        _kill(proc, out)
        raise
    reader.join(timeout=5)
    return Launch(None if timed_out else proc.returncode, timed_out, time.perf_counter() - t0, list(log))


if __name__ == "__main__":  # python -m ftscope.measure.distributed.torchrun --prebuild
    if sys.argv[1:] == ["--prebuild"]:
        print(prebuild_deepspeed_ops())
    else:
        sys.exit("usage: python -m ftscope.measure.distributed.torchrun --prebuild   (JIT-compile DeepSpeed's CPU comm op)")
