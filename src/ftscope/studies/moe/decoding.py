"""Scoring the eval set: exact match of a greedy decode for QA items, the most likely choice for multiple choice,
and the mean loss per answer token."""
from __future__ import annotations

from typing import Any, Sequence

from ...measure.runtime.loop import autocast
from .data import Sample, pad, train_item


def score(model: Any, seqs: list[tuple[list[int], int]], device: str, batch: int, autocast_dtype: str | None) -> list[tuple[float, int]]:
    """(sum of log p, token count) of ids[start:] given ids[:start], for each (ids, start)."""
    import torch
    import torch.nn.functional as F

    out: list[tuple[float, int]] = []
    for i in range(0, len(seqs), batch):
        chunk = seqs[i: i + batch]
        b = pad([s for s, _ in chunk], None, device)
        with torch.no_grad(), autocast(device, autocast_dtype):
            logp = F.log_softmax(model(**b).logits.float(), dim=-1)
        for j, (ids, start) in enumerate(chunk):
            tgt = torch.tensor(ids[start:], device=logp.device)
            rows = logp[j, start - 1: len(ids) - 1]
            out.append((float(rows.gather(1, tgt[:, None]).sum()), len(tgt)))
    return out


def greedy(model: Any, prompts: list[list[int]], steps: int, eos: int | None, device: str, batch: int,
            autocast_dtype: str | None) -> list[list[int]]:
    """Greedy continuations (no KV cache: answers are a few tokens and models are built with use_cache off)."""
    import torch

    out: list[list[int]] = []
    for i in range(0, len(prompts), batch):
        seqs = [list(p) for p in prompts[i: i + batch]]
        gen: list[list[int]] = [[] for _ in seqs]
        done = [False] * len(seqs)
        for _ in range(steps):
            b = pad(seqs, None, device)
            with torch.no_grad(), autocast(device, autocast_dtype):
                logits = model(**b).logits
            last = torch.tensor([len(s) - 1 for s in seqs], device=logits.device)
            nxt = logits[torch.arange(len(seqs), device=logits.device), last].argmax(-1).tolist()
            for j, t in enumerate(nxt):
                if not done[j]:
                    if t == eos:
                        done[j] = True
                    else:
                        gen[j].append(t)
                seqs[j].append(t)
            if all(done):
                break
        out.extend(gen)
    return out


def evaluate(model: Any, evals: Sequence[Sample], eos: int | None, device: str, batch: int,
             autocast_dtype: str | None) -> tuple[dict[str, float], float]:
    """(accuracy per task, mean eval loss per answer token)."""
    model.eval()
    qa = [s for s in evals if not s.mc]
    mc = [s for s in evals if s.mc]
    hits: dict[str, list[int]] = {}
    if qa:
        steps = max(len(s.targets[0]) for s in qa) + 1
        gens = greedy(model, [s.prompt for s in qa], steps, eos, device, batch, autocast_dtype)
        for s, g in zip(qa, gens):
            hits.setdefault(s.task, []).append(int(g == s.targets[0]))
    seqs = [(s.prompt + c, len(s.prompt)) for s in mc for c in s.targets]
    scores = iter(score(model, seqs, device, batch, autocast_dtype))
    for s in mc:
        ll = [next(scores)[0] for _ in s.targets]
        hits.setdefault(s.task, []).append(int(max(range(len(ll)), key=ll.__getitem__) == s.answer))
    loss_seqs = [(train_item(s, eos)[0], len(s.prompt)) for s in evals]
    lp = score(model, loss_seqs, device, batch, autocast_dtype)
    model.train()
    return ({t: sum(h) / len(h) for t, h in hits.items()},
            -sum(x for x, _ in lp) / max(sum(n for _, n in lp), 1))
