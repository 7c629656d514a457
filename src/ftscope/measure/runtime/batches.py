"""Training batches for profiling: synthetic from the workload's length distribution, or a local JSONL.

Synthetic lengths follow the same log-normal the estimator fits to the dataset statistics (median, mean,
p99), capped at the cutoff; dynamic padding pads each batch to its longest sample and masks the padding out of
the loss (labels -100), as HF's DataCollatorForSeq2Seq does.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ...errors import FtscopeError, install_hint
from ...files import os_error, read_text
from ...spec.scenario import Scenario


@dataclass(frozen=True)
class BatchShape:
    """One batch: its per-sample lengths and the padded length."""

    lengths: tuple[int, ...]
    padded_len: int

    @property
    def tokens(self) -> int:
        """Non-padding tokens."""
        return sum(self.lengths)


class LengthSampler:
    """Draws sample lengths the way the workload describes them (deterministic for a seed)."""

    def __init__(self, scn: Scenario, seed: int = 0, lengths: list[int] | None = None) -> None:
        self.wl = scn.workload
        self.rng = random.Random(seed)
        self.lengths = lengths
        self.cap = self.wl.peak_seq_len()

    def sample(self) -> int:
        if self.lengths:
            return min(self.rng.choice(self.lengths), self.cap)
        d = self.wl.dataset
        if d is None or self.wl.padding in ("max_length", "packed"):
            return self.cap
        mu, sigma = d._lognormal()
        return max(1, min(int(round(math.exp(self.rng.gauss(mu, sigma)))), self.cap))

    def batch(self, size: int) -> BatchShape:
        if self.wl.padding in ("max_length", "packed") and not self.lengths:
            return BatchShape((self.cap,) * size, self.cap)
        lengths = tuple(self.sample() for _ in range(size))
        padded = self.cap if self.wl.padding == "max_length" else max(lengths)
        return BatchShape(lengths, padded)

    def worst(self, size: int) -> BatchShape:
        """The longest batch the run can see (what memory must hold, and what max-batch search uses)."""
        return BatchShape((self.cap,) * size, self.cap)


def tensors(shape: BatchShape, vocab: int, device: str, generator: Any = None) -> dict[str, Any]:
    """input_ids / attention_mask / labels for a batch shape (random token ids; padding masked)."""
    import torch

    b, s = len(shape.lengths), shape.padded_len
    ids = torch.randint(0, vocab, (b, s), generator=generator)
    mask = torch.zeros(b, s, dtype=torch.long)
    for i, n in enumerate(shape.lengths):
        mask[i, :n] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


class SyntheticBatches:
    """Training batches of random token ids in the workload's shapes, for one built model on one device."""

    def __init__(self, sampler: LengthSampler, vocab: int, device: str, generator: Any) -> None:
        self.sampler, self.vocab, self.device, self.generator = sampler, vocab, device, generator

    def draw(self, size: int, count: int = 1, worst: bool = False) -> tuple[list[dict[str, Any]], list[BatchShape]]:
        """`count` micro-batches of `size` samples (one optimizer step's worth): their tensors and shapes;
        worst: the longest batch the run can see."""
        shapes = [self.sampler.worst(size) if worst else self.sampler.batch(size) for _ in range(count)]
        return [tensors(sh, self.vocab, self.device, self.generator) for sh in shapes], shapes


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) of each non-blank line of a local JSONL; bad input is a one-line FtscopeError."""
    p = Path(path)
    if not p.is_file():
        raise FtscopeError(f"data file not found: {p}")
    n = 0
    try:
        with p.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    yield n, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise FtscopeError(f"{p}:{n}: not JSON ({exc.msg})") from None
                except RecursionError:
                    raise FtscopeError(f"{p}:{n}: nested too deeply") from None
    except UnicodeDecodeError:
        raise FtscopeError(f"{p}:{n + 1}: not UTF-8 text; save the file as UTF-8") from None
    except OSError as exc:
        raise os_error(exc, "data file", p) from None


def load_tokenizer(path: str | Path) -> Any:
    """A local tokenizers.Tokenizer from a tokenizer.json (or a folder holding one). No network."""
    tpath = Path(path)
    if tpath.is_dir():
        tpath = tpath / "tokenizer.json"
    if not tpath.is_file():
        raise FtscopeError(f"tokenizer not found: {tpath} (give a tokenizer.json or a folder with one)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise FtscopeError(f"reading --data needs the tokenizers package: {install_hint('measure')}") from None
    text = read_text(tpath, "tokenizer file", 512 * 2**20)
    try:
        return Tokenizer.from_str(text)
    except Exception as exc:  # noqa: BLE001 - the Rust tokenizers library raises plain Exception for a bad file
        raise FtscopeError(f"tokenizer file {tpath} is not a tokenizers JSON file: {str(exc).splitlines()[0][:120]}") from None


def read_jsonl_lengths(path: str | Path, tokenizer: str | Path, field: str = "text", limit: int = 5000) -> list[int]:
    """Token lengths of a local JSONL (one object per line, text in `field`, or prompt + response) with a local
    tokenizer (a tokenizer.json file or a folder holding one). No network."""
    p = Path(path)
    if not p.is_file():
        raise FtscopeError(f"data file not found: {p}")
    tok = load_tokenizer(tokenizer)
    out = []
    for n, obj in iter_jsonl(p):
        text = obj.get(field) if isinstance(obj, dict) else None
        if text is None and isinstance(obj, dict):
            text = " ".join(str(obj[k]) for k in ("instruction", "input", "prompt", "question", "output",
                                                   "response", "answer") if obj.get(k))
        if not text:
            raise FtscopeError(f"{p}:{n}: no '{field}' (or prompt/response) text")
        out.append(len(tok.encode(str(text)).ids))
        if len(out) >= limit:
            break
    if not out:
        raise FtscopeError(f"{p} holds no samples")
    return out
