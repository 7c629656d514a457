"""Files the page sends (a config.json, a tokenizer.json, a JSONL sample): size-limited, kept only under the
server's temporary directory, named by their content hash so the same file is stored once.

An upload is referred to as `upload:<hash>`; the scenario the page builds (and its URL) carries that
reference, so a reload finds the same file while the server runs.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

from ..errors import FtscopeError

MIB = 2**20
LIMITS = {"config": 1 * MIB, "tokenizer": 64 * MIB, "sample": 64 * MIB}
"""Largest upload of each kind, bytes: a config.json is a few KiB; the largest tokenizer.json files are ~30 MiB."""
TOTAL_LIMIT = 1024 * MIB
"""All uploads of one server together: a server left running must not fill the disk."""
FILE_NAMES = {"config": "config.json", "tokenizer": "tokenizer.json", "sample": "sample.jsonl"}
SAMPLE_LINES = 20_000
"""Samples read from an uploaded JSONL: enough for stable mean / median / p99 token lengths."""
_REF = re.compile(r"upload:([0-9a-f]{16})")


class TooLarge(FtscopeError):
    """A request body over its limit (HTTP 413)."""


class Uploads:
    """The upload store of one running server."""

    def __init__(self, root: str | Path, total_limit: int = TOTAL_LIMIT):
        self.root = Path(root)
        self.total_limit = total_limit
        self._stored = 0

    def save(self, kind: str, data: bytes) -> str:
        """Store one upload and return its reference."""
        if len(data) > LIMITS[kind]:
            raise TooLarge(f"{FILE_NAMES[kind]} uploads are limited to {LIMITS[kind] // MIB} MiB; got {len(data) / MIB:.1f} MiB")
        digest = hashlib.sha256(data).hexdigest()[:16]
        path = self.root / kind / digest / FILE_NAMES[kind]
        if not path.is_file():
            if self._stored + len(data) > self.total_limit:
                raise TooLarge(f"this server's uploads reached {self.total_limit // MIB} MiB; restart it to clear them")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            self._stored += len(data)
        return f"upload:{digest}"

    def path(self, kind: str, ref: str) -> Path:
        """The stored file of a reference, or a one-line error saying it is gone."""
        match = _REF.fullmatch(str(ref))
        path = self.root / kind / match.group(1) / FILE_NAMES[kind] if match else None
        if path is None or not path.is_file():
            raise FtscopeError(f"uploaded {FILE_NAMES[kind]} '{str(ref)[:40]}' is not on this server (it was restarted?): "
                               f"drop the file again")
        return path

    def save_config(self, data: bytes) -> dict[str, Any]:
        """Store a config.json after checking that ftscope can build the model it describes."""
        from ..spec.resolve import model_from_config

        cfg = json_object(data, "malformed config.json", "config.json must be a JSON object")
        name = str(cfg.get("_name_or_path") or cfg.get("model_type") or "config.json")
        model = model_from_config(cfg, name)
        return {"ref": self.save("config", data), "name": name, "total_params": model.total_params,
                "moe": model.is_moe}


def json_object(data: bytes, malformed: str, not_object: str) -> dict[str, Any]:
    """A JSON object from a request body, or the one-line error that says which it was not."""
    try:
        value = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FtscopeError(f"{malformed}: {exc}") from None
    if not isinstance(value, dict):
        raise FtscopeError(not_object)
    return value


def length_stats(lengths: list[int]) -> dict[str, Any]:
    """The `workload.dataset` statistics of a list of token lengths (p99 by nearest rank)."""
    ordered = sorted(lengths)
    n = len(ordered)
    return {"num_samples": n, "mean_tokens": round(statistics.fmean(ordered), 1),
            "median_tokens": round(float(statistics.median(ordered)), 1),
            "p99_tokens": ordered[max(0, math.ceil(0.99 * n) - 1)], "max_tokens": ordered[-1]}


def dataset_stats(sample: Path, tokenizer: Path, text_field: str = "text") -> dict[str, Any]:
    """Token-length statistics of a JSONL sample under a local tokenizer (no network)."""
    from ..measure.runtime.batches import read_jsonl_lengths  # reads the tokenizers package lazily; never torch

    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", text_field):
        raise FtscopeError(f"the JSONL text field must be a plain key like text or prompt; got {text_field[:40]!r}")
    try:
        lengths = read_jsonl_lengths(sample, tokenizer, field=text_field, limit=SAMPLE_LINES)
    except FtscopeError as exc:  # the paths in the message are this server's temp dir: say which file instead
        text = str(exc).replace(str(sample), "the JSONL sample").replace(f"tokenizer file {tokenizer}", "the tokenizer")
        raise FtscopeError(text) from None
    return length_stats(lengths)
