"""The common scenario keys as command-line flags: `--model --gpu --gpus --method --seq --batch ...`.

`QuickFlags` is the one place a flag maps to a scenario key. The flags become `key.path=value` overrides placed
before the user's own, so a scenario is built as: scenario file (or nothing) < flags < overrides. Each flag's value
is checked here against the field type it sets, so a bad value is a one-line error naming the flag, not the key.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, Sequence

from ..errors import FtscopeError
from .mix import Mix
from .schema import choices
from .workload import MAX_SEQ

NODE_SIZE = 8
"""GPUs per node assumed when --gpus asks for more than one node holds (the common 8-GPU server)."""
MAX_BATCH = 65_536


@dataclass(frozen=True)
class QuickFlags:
    """Flag values as given (None: not given). Field names are the flags' names."""

    model: str | None = None
    """-> model: a preset (ftscope models), an HF id or a config.json path."""
    gpu: str | None = None
    """-> hardware.gpu: a catalog name (ftscope gpus)."""
    gpus: int | None = None
    """-> hardware.gpus_per_node (up to 8), or 8-GPU nodes (hardware.nodes) for a multiple of 8 above."""
    method: str | None = None
    """-> mix.method: full | lora | qlora."""
    seq: int | None = None
    """-> workload.seq_len, tokens."""
    batch: str | None = None
    """-> workload.micro_batch_size: N or max."""
    checkpointing: bool | None = None
    """-> mix.gradient_checkpointing."""
    attention: str | None = None
    """-> mix.attention."""
    zero: int | None = None
    """-> mix.zero_stage: 0-3."""

    @property
    def given(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))

    def keys(self) -> dict[str, Any]:
        """{'mix.method': 'qlora', ...}: the scenario keys these flags set, with checked values."""
        out: dict[str, Any] = {}
        if self.model is not None:
            if not self.model.strip():
                raise FtscopeError("--model needs a preset name, an HF id or a config.json path")
            out["model"] = self.model
        if self.gpu is not None:
            from .. import catalog
            out["hardware.gpu"] = catalog.resolve_gpu_name(self.gpu)
        if self.gpus is not None:
            out.update(_gpu_layout(self.gpus))
        for flag, key in (("method", "method"), ("attention", "attention")):
            value = getattr(self, flag)
            if value is not None:
                _choice(value, f"--{flag}", choices(Mix, key))
                out[f"mix.{key}"] = value
        if self.zero is not None:
            _choice(self.zero, "--zero", choices(Mix, "zero_stage"))
            out["mix.zero_stage"] = self.zero
        if self.checkpointing is not None:
            out["mix.gradient_checkpointing"] = self.checkpointing
        if self.seq is not None:
            if not 1 <= self.seq <= MAX_SEQ:
                raise FtscopeError(f"--seq must be a number of tokens from 1 to {MAX_SEQ:,}; got {self.seq}")
            out["workload.seq_len"] = self.seq
        if self.batch is not None:
            out["workload.micro_batch_size"] = _batch(self.batch)
        return out

    def overrides(self) -> list[str]:
        """The flags as `key.path=value` overrides (values JSON-quoted, so a model named `yes` stays text)."""
        return [f"{k}={json.dumps(v)}" for k, v in self.keys().items()]


def _choice(value: Any, flag: str, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise FtscopeError(f"{flag} must be one of {', '.join(map(str, allowed))}; got {str(value)[:40]!r}")


def _gpu_layout(n: int) -> dict[str, int]:
    if 1 <= n <= NODE_SIZE:
        return {"hardware.gpus_per_node": n, "hardware.nodes": 1}
    if n > NODE_SIZE and n % NODE_SIZE == 0 and n // NODE_SIZE <= 4096:
        return {"hardware.gpus_per_node": NODE_SIZE, "hardware.nodes": n // NODE_SIZE}
    raise FtscopeError(f"--gpus must be 1 to {NODE_SIZE}, or a multiple of {NODE_SIZE} (that many {NODE_SIZE}-GPU "
                       f"nodes); got {n} (other layouts: hardware.gpus_per_node=N hardware.nodes=M)")


def _batch(text: str) -> int | str:
    value = text.strip().lower()
    if value == "max":
        return "max"
    if value.isascii() and value.isdigit() and 1 <= int(value) <= MAX_BATCH:
        return int(value)
    raise FtscopeError(f"--batch must be a micro-batch size from 1 to {MAX_BATCH:,} or max; got {text[:40]!r}")

