"""The study's data: tokenized QA and multiple-choice items from local JSONL, the baselines to beat, and the
padded batches the model sees (loss on the answer tokens only)."""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ...errors import FtscopeError
from ...measure.runtime.batches import iter_jsonl


@dataclass
class Sample:
    """One tokenized item."""

    task: str
    """Group the accuracy is reported under: the item's `task`, else qa / mc."""
    prompt: list[int]
    """Prompt token ids (with the tokenizer's BOS, if it adds one)."""
    targets: list[list[int]]
    """QA: [answer ids]; MC: ids of every choice."""
    answer: int
    """Index into targets of the right one (always 0 for QA)."""
    mc: bool


def continuation(tok: Any, prompt: str, text: str) -> list[int]:
    """Ids of `text` as it continues `prompt`: the tail of encoding both together when the prompt's ids are a
    prefix of it (BPE / SentencePiece merge across the space), else the text encoded alone."""
    whole = tok.encode(prompt + " " + text).ids
    head = tok.encode(prompt).ids
    if whole[: len(head)] == head and len(whole) > len(head):
        return whole[len(head):]
    return tok.encode(" " + text, add_special_tokens=False).ids


def load_samples(path: str | Path, tok: Any, cutoff: int | None = None) -> tuple[list[Sample], int]:
    """(tokenized items, how many were truncated) of a JSONL: {prompt|question|instruction(+input),
    answer|output|response} or {prompt, choices: [...], answer: index}. An item longer than `cutoff` (prompt +
    longest target + EOS) loses the start of its prompt: the answer is what the loss and the score need."""
    p = Path(path)
    if not p.is_file():
        raise FtscopeError(f"data file not found: {p}")
    out: list[Sample] = []
    cut = 0
    for n, obj in iter_jsonl(p):
        if not isinstance(obj, dict):
            raise FtscopeError(f"{p}:{n}: expected a JSON object")
        prompt = obj.get("prompt") or obj.get("question") or " ".join(
            str(obj[k]) for k in ("instruction", "input") if obj.get(k))
        answer = next((obj[k] for k in ("answer", "output", "response") if k in obj), None)
        if not prompt or answer is None:
            raise FtscopeError(f"{p}:{n}: needs a prompt and an answer")
        ids = tok.encode(str(prompt)).ids
        choices = obj.get("choices")
        if choices:
            if isinstance(answer, str) and len(answer) == 1 and answer.isalpha():  # "B": the letter of a choice
                answer = ord(answer.upper()) - ord("A")
            if not isinstance(answer, int) or not 0 <= answer < len(choices):
                raise FtscopeError(f"{p}:{n}: 'answer' must index 'choices' (0..{len(choices) - 1})")
            sample = Sample(str(obj.get("task", "mc")), ids, [continuation(tok, prompt, str(c)) for c in choices],
                            answer, True)
        else:
            sample = Sample(str(obj.get("task", "qa")), ids, [continuation(tok, prompt, str(answer))], 0, False)
        room = (cutoff or 0) - max(len(t) for t in sample.targets) - 1
        if cutoff and len(ids) > room:
            if room < 1:
                raise FtscopeError(f"{p}:{n}: the answer alone is longer than the {cutoff}-token cutoff")
            sample.prompt = ids[len(ids) - room:]
            cut += 1
        out.append(sample)
    if not out:
        raise FtscopeError(f"{p} holds no samples")
    return out, cut


def baselines(train: Sequence[Sample], evals: Sequence[Sample]) -> dict[str, dict[str, Any]]:
    """Per eval task: item count, kind, and the accuracy to beat. MC: chance (mean of 1 / choices). QA: always
    answering the most common training answer of that task (a model that learned only the answer prior)."""
    out: dict[str, dict[str, Any]] = {}
    for task in sorted({s.task for s in evals}):
        items = [s for s in evals if s.task == task]
        if items[0].mc:
            base = sum(1 / len(s.targets) for s in items) / len(items)
            out[task] = {"kind": "mc", "items": len(items), "chance": base, "baseline": base}
        else:
            common = Counter(tuple(s.targets[0]) for s in train if s.task == task and not s.mc).most_common(1)
            top = common[0][0] if common else ()
            hit = sum(tuple(s.targets[0]) == top for s in items) / len(items)
            out[task] = {"kind": "qa", "items": len(items), "chance": None, "baseline": hit}
    return out


def train_item(s: Sample, eos: int | None) -> tuple[list[int], list[int]]:
    """(ids, labels) of prompt + right answer (+ EOS); loss on the answer tokens only."""
    tgt = s.targets[s.answer] + ([eos] if eos is not None else [])
    return s.prompt + tgt, [-100] * len(s.prompt) + tgt


def pad(seqs: Sequence[list[int]], labels: Sequence[list[int]] | None, device: str) -> dict[str, Any]:
    """Right-padded input_ids / attention_mask (/ labels, -100 on padding)."""
    import torch

    n = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), n, dtype=torch.long)
    mask = torch.zeros(len(seqs), n, dtype=torch.long)
    lab = torch.full((len(seqs), n), -100, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
        if labels is not None:
            lab[i, : len(s)] = torch.tensor(labels[i])
    out = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
    if labels is not None:
        out["labels"] = lab.to(device)
    return out


def shuffled_batches(items: list[tuple[list[int], list[int]]], size: int, rng: random.Random) -> list[list[int]]:
    order = list(range(len(items)))
    rng.shuffle(order)
    return [order[i: i + size] for i in range(0, len(order), size)]
