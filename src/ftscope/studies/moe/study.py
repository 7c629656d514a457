"""study moe: the IISWC sparse-vs-dense accuracy study, on any MoE scenario and a local dataset.

The same MoE model (same initial weights: the seed is set before every build) is fine-tuned once per top-k
(IISWC: top-2 "sparse" and top-8 = all experts "dense", switched by editing `num_experts_per_tok`, which is what
`mix.experts_top_k` does here). For each run:

- accuracy on the eval set before fine-tuning (epoch 0) and after every epoch: exact match of a greedy decode
  for QA items (`{"prompt", "answer": str}`), the highest summed log-likelihood choice for multiple-choice items
  (`{"prompt", "choices": [...], "answer": index}`), per task (the `task` field, else qa / mc);
- the training loss per step (loss on the answer tokens only, prompt and padding masked with -100) and the eval
  loss per epoch;
- throughput over the training steps (samples/s, the paper's queries/s, and non-padding tokens/s);
- the largest micro-batch that fits, found by running it (`search.find_max_batch` on the longest training sample,
  under a memory cap on CPU), beside the estimator's `limits.max_micro_batch_size` for the scenario as written;
- the tokens routed to each expert in each layer on the eval set before and after fine-tuning (`hooks.ExpertLoad`),
  with imbalance statistics. A query is prompt + reference answer (the paper's definition), batched by length so
  that no padding token is routed or counted.

Variance: the IISWC figure (Fig. 11) shows the variance of the average tokens per query routed to each expert
and mixes sample and population variance between panels. Here both are given, per layer, over the experts of
that layer: population (divide by E: the experts are the whole population) and sample (divide by E - 1).

Models have random weights (measure.build builds from the config), or the local checkpoint given as `weights`
(every top-k starts from it). torch is imported inside the functions; nothing here runs at import.
"""
from __future__ import annotations

import contextlib
import gc
import inspect
import json
import math
import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ...errors import FtscopeError
from ...spec.scenario import Scenario
from ...measure import require_torch
from ...measure.runtime.batches import iter_jsonl

EOS_NAMES = ("</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "<eos>", "[EOS]", "<|eot_id|>")
DEFAULT_CPU_CAP_GIB = 0.0625
"""Simulated memory cap of the max-batch search on CPU (the tensor tracker's cap; a CPU has no OOM to find)."""


# ---- data --------------------------------------------------------------------------------------------------

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


def _load_tokenizer(path: str | Path) -> tuple[Any, int | None]:
    """(tokenizers.Tokenizer, eos id) of a tokenizer.json or a folder holding one (no network)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise FtscopeError("study moe needs the tokenizers package: pip install 'ftscope[measure]'") from None
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    p = p / "tokenizer.json" if p.is_dir() else p
    if not p.is_file():
        raise FtscopeError(f"tokenizer not found: {p} (give a tokenizer.json or a folder with one)")
    tok = Tokenizer.from_file(str(p))
    names = list(EOS_NAMES)
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():  # HF model folders name their EOS here
        eos = json.loads(cfg.read_text()).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos, str):
            names.insert(0, eos)
    return tok, next((tok.token_to_id(n) for n in names if tok.token_to_id(n) is not None), None)


def _continuation(tok: Any, prompt: str, text: str) -> list[int]:
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
            sample = Sample(str(obj.get("task", "mc")), ids, [_continuation(tok, prompt, str(c)) for c in choices],
                            answer, True)
        else:
            sample = Sample(str(obj.get("task", "qa")), ids, [_continuation(tok, prompt, str(answer))], 0, False)
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


# ---- results -----------------------------------------------------------------------------------------------

@dataclass
class EpochPoint:
    """State after `epoch` epochs (0: before fine-tuning)."""

    epoch: int
    accuracy: dict[str, float]
    """Per task: exact match (QA) or multiple-choice accuracy."""
    eval_loss: float
    """Mean loss per answer token on the eval set (QA answers, MC right choices)."""
    train_loss: float | None = None
    """Mean training loss over this epoch's steps (None for epoch 0)."""


@dataclass
class LoadSnapshot:
    """Tokens routed to each expert of each MoE layer over the eval set's queries (prompt + reference answer)."""

    counts: list[list[int]]
    """[layer][expert] routed token slots; each row sums to tokens x top_k."""
    tokens: list[int]
    """Tokens that reached each layer (no padding: queries are batched by length)."""
    queries: int
    top_k: int
    weight_share: list[list[float]]
    """[layer][expert] share of the summed routing weights. With top-k = all experts every count is equal by
    construction; the weights still show which experts the router favours."""
    per_query: list[list[float]] = field(default_factory=list)
    """counts / queries: the IISWC figure's 'average tokens per query routed to each expert'."""
    max_over_mean: list[float] = field(default_factory=list)
    cv: list[float] = field(default_factory=list)
    """Population standard deviation / mean of the counts."""
    var_population: list[float] = field(default_factory=list)
    """Variance of per_query over the layer's E experts, dividing by E."""
    var_sample: list[float] = field(default_factory=list)
    """The same dividing by E - 1 (some IISWC panels use this one)."""

    def __post_init__(self) -> None:
        from ...measure.runtime.expert_load import imbalance_of

        imb = imbalance_of(self.counts)
        self.max_over_mean, self.cv = imb.max_over_mean, imb.cv
        self.per_query = [[c / max(self.queries, 1) for c in row] for row in self.counts]
        self.var_population, self.var_sample = [], []
        for row in self.per_query:
            e, mean = len(row), sum(row) / max(len(row), 1)
            ss = sum((x - mean) ** 2 for x in row)
            self.var_population.append(ss / e if e else 0.0)
            self.var_sample.append(ss / (e - 1) if e > 1 else 0.0)

    def summary(self) -> dict[str, float]:
        """Layer means of the imbalance statistics."""
        m = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
        return {"max_over_mean": m(self.max_over_mean), "cv": m(self.cv), "var_population": m(self.var_population),
                "var_sample": m(self.var_sample)}


@dataclass
class TopKRun:
    """One fine-tuning run at one top-k."""

    top_k: int
    build: dict[str, Any]
    """BuildInfo of the model as built (config left out: it is the scenario's, shrunk)."""
    init_checksum: float
    """Sum of |w| over the initial weights: equal across runs when they start from the same weights."""
    epochs: list[EpochPoint]
    step_losses: list[float]
    train_seconds: float
    """Forward + backward + optimizer time of all training steps (evaluation excluded)."""
    samples_per_s: float
    tokens_per_s: float
    """Non-padding tokens per second of training."""
    load_before: LoadSnapshot | None
    load_after: LoadSnapshot | None
    max_batch: dict[str, Any] | None = None
    """find_max_batch result, with the cap, the sequence length searched at, and `max_batch`."""
    max_batch_estimated: int | None = None
    """The estimator's limits.max_micro_batch_size for the scenario as written (not shrunk) at this top-k, on its GPU."""


@dataclass
class MoEStudyResult:
    scenario: dict[str, Any]
    device: str
    settings: dict[str, Any]
    """epochs, top_ks, batch_size, lr, seed, shrink, memory cap, paths."""
    tasks: dict[str, dict[str, Any]]
    """Per eval task: kind, items, chance, baseline (see `baselines`)."""
    runs: list[TopKRun]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for run, rd in zip(self.runs, d["runs"]):
            for key in ("load_before", "load_after"):
                snap = getattr(run, key)
                if snap is not None:
                    rd[key]["summary"] = snap.summary()
        return d

    def tables(self) -> list[tuple[str, list[str], list[list[Any]]]]:
        """(title, columns, rows) for the terminal (report.tables.simple_table) and tables.md."""
        tasks = list(self.tasks)
        acc = []
        for r in self.runs:
            for e in r.epochs:
                acc.append([f"top-{r.top_k}", e.epoch, "-" if e.train_loss is None else f"{e.train_loss:.3f}",
                            f"{e.eval_loss:.3f}", *[f"{e.accuracy.get(t, 0.0):.3f}" for t in tasks]])
        base = ["baseline", "-", "-", "-", *[f"{self.tasks[t]['baseline']:.3f}" for t in tasks]]
        perf = [[f"top-{r.top_k}", f"{r.samples_per_s:.1f}", f"{r.tokens_per_s:,.0f}", f"{r.train_seconds:.1f}",
                 "-" if not r.max_batch else f"{r.max_batch['max_batch']}{'+' if r.max_batch['capped'] else ''}",
                 "-" if r.max_batch_estimated is None else r.max_batch_estimated] for r in self.runs]
        load = []
        for r in self.runs:
            for name, snap in (("before", r.load_before), ("after", r.load_after)):
                if snap is None:
                    continue
                s = snap.summary()
                w_mom = [max(row) * len(row) for row in snap.weight_share if row]
                load.append([f"top-{r.top_k}", name, f"{s['max_over_mean']:.3f}", f"{s['cv']:.3f}",
                             f"{s['var_population']:.2f}", f"{s['var_sample']:.2f}",
                             f"{sum(w_mom) / max(len(w_mom), 1):.3f}",
                             " / ".join(" ".join(f"{x:.1f}" for x in row) for row in snap.per_query)])
        return [
            ("accuracy per epoch (0 = before fine-tuning)", ["run", "epoch", "train loss", "eval loss", *tasks],
             acc + [base]),
            ("throughput and max batch", ["run", "samples/s", "tokens/s", "train s", "max batch (measured)",
                                          "max batch (estimated, scenario as written)"], perf),
            ("expert load on the eval set (layer means; var of tokens per query per expert)",
             ["run", "when", "max/mean", "CV (pop.)", "var (pop., /E)", "var (sample, /E-1)",
              "weight share max/mean", "tokens per query per expert, by layer"], load),
        ]


# ---- model passes ------------------------------------------------------------------------------------------

def _pad(seqs: Sequence[list[int]], labels: Sequence[list[int]] | None, device: str) -> dict[str, Any]:
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


def _train_item(s: Sample, eos: int | None) -> tuple[list[int], list[int]]:
    """(ids, labels) of prompt + right answer (+ EOS); loss on the answer tokens only."""
    tgt = s.targets[s.answer] + ([eos] if eos is not None else [])
    return s.prompt + tgt, [-100] * len(s.prompt) + tgt


def _score(model: Any, seqs: list[tuple[list[int], int]], device: str, batch: int, autocast: Any) -> list[tuple[float, int]]:
    """(sum of log p, token count) of ids[start:] given ids[:start], for each (ids, start)."""
    import torch
    import torch.nn.functional as F

    out: list[tuple[float, int]] = []
    for i in range(0, len(seqs), batch):
        chunk = seqs[i: i + batch]
        b = _pad([s for s, _ in chunk], None, device)
        with torch.no_grad(), autocast():
            logp = F.log_softmax(model(**b).logits.float(), dim=-1)
        for j, (ids, start) in enumerate(chunk):
            tgt = torch.tensor(ids[start:], device=logp.device)
            rows = logp[j, start - 1: len(ids) - 1]
            out.append((float(rows.gather(1, tgt[:, None]).sum()), len(tgt)))
    return out


def _greedy(model: Any, prompts: list[list[int]], steps: int, eos: int | None, device: str, batch: int,
            autocast: Any) -> list[list[int]]:
    """Greedy continuations (no KV cache: answers are a few tokens and models are built with use_cache off)."""
    import torch

    out: list[list[int]] = []
    for i in range(0, len(prompts), batch):
        seqs = [list(p) for p in prompts[i: i + batch]]
        gen: list[list[int]] = [[] for _ in seqs]
        done = [False] * len(seqs)
        for _ in range(steps):
            b = _pad(seqs, None, device)
            with torch.no_grad(), autocast():
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
             autocast: Any) -> tuple[dict[str, float], float]:
    """(accuracy per task, mean eval loss per answer token)."""
    model.eval()
    qa = [s for s in evals if not s.mc]
    mc = [s for s in evals if s.mc]
    hits: dict[str, list[int]] = {}
    if qa:
        steps = max(len(s.targets[0]) for s in qa) + 1
        gens = _greedy(model, [s.prompt for s in qa], steps, eos, device, batch, autocast)
        for s, g in zip(qa, gens):
            hits.setdefault(s.task, []).append(int(g == s.targets[0]))
    seqs = [(s.prompt + c, len(s.prompt)) for s in mc for c in s.targets]
    scores = iter(_score(model, seqs, device, batch, autocast))
    for s in mc:
        ll = [next(scores)[0] for _ in s.targets]
        hits.setdefault(s.task, []).append(int(max(range(len(ll)), key=ll.__getitem__) == s.answer))
    loss_seqs = [(_train_item(s, eos)[0], len(s.prompt)) for s in evals]
    lp = _score(model, loss_seqs, device, batch, autocast)
    model.train()
    return ({t: sum(h) / len(h) for t, h in hits.items()},
            -sum(x for x, _ in lp) / max(sum(n for _, n in lp), 1))


class _WeightShare:
    """Sum of routing weights per expert, read from the experts modules ExpertLoad hooked."""

    def __init__(self, model: Any, layers: list[str], num_experts: list[int]) -> None:
        import torch

        self._torch = torch
        self.sums: list[Any] = [None] * len(num_experts)  # float64 on the routing tensors' device: no host sync
        self._handles = []
        modules = dict(model.named_modules())
        for row, name in enumerate(layers):
            params = list(inspect.signature(type(modules[name]).forward).parameters)[1:]
            idx_kw = next(k for k in ("top_k_index", "router_indices", "selected_experts", "topk_indices") if k in params)
            w_kw = next((k for k in ("top_k_weights", "routing_weights", "topk_weights", "router_scores")
                         if k in params), None)
            if w_kw is not None:
                self._handles.append(modules[name].register_forward_pre_hook(
                    self._hook(row, num_experts[row], params.index(idx_kw), idx_kw, params.index(w_kw), w_kw),
                    with_kwargs=True))

    def _hook(self, row: int, n: int, ipos: int, ikw: str, wpos: int, wkw: str) -> Callable[..., None]:
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            idx = kwargs[ikw] if ikw in kwargs else args[ipos]
            w = kwargs[wkw] if wkw in kwargs else args[wpos]
            flat = idx.reshape(-1).long()
            keep = flat < n  # drop 'no expert' sentinels
            if self.sums[row] is None:
                self.sums[row] = self._torch.zeros(n, dtype=self._torch.float64, device=flat.device)
            self.sums[row].index_add_(0, flat[keep], w.reshape(-1)[keep].detach().double())
        return hook

    def shares(self) -> list[list[float]]:
        return [[] if s is None else (s / s.sum()).tolist() if float(s.sum()) > 0 else s.tolist() for s in self.sums]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def expert_load(model: Any, evals: Sequence[Sample], eos: int | None, device: str, batch: int,
                autocast: Any) -> LoadSnapshot | None:
    """Per-layer expert load over the eval queries; None for a dense model. Queries of equal length share a
    batch so that no padding token is routed (ExpertLoad counts every token the router sees)."""
    import torch

    from ...measure.runtime.expert_load import ExpertLoad

    load = ExpertLoad(model)
    if not load.is_moe:
        load.remove()
        return None
    share = _WeightShare(model, load.layers, load.num_experts)
    by_len: dict[int, list[list[int]]] = {}
    for s in evals:
        ids = _train_item(s, eos)[0]
        by_len.setdefault(len(ids), []).append(ids)
    model.eval()
    try:
        with torch.no_grad(), autocast():
            for group in by_len.values():
                for i in range(0, len(group), batch):
                    model(**_pad(group[i: i + batch], None, device))
        snap = LoadSnapshot(counts=load.counts(), tokens=load.tokens(), queries=len(evals), top_k=load.top_k or 0,
                            weight_share=share.shares())
    finally:
        load.remove()
        share.remove()
        model.train()
    return snap


def _search_max_batch(stepper: Any, model: Any, opt: Any, items: list[tuple[list[int], list[int]]], device: str,
                      cap_gib: float | None, start: int, cap: int) -> dict[str, Any]:
    """find_max_batch on the longest training sample repeated: the worst batch dynamic padding can produce.
    Runs real steps (weights change), so the study calls it after its last measurement."""
    from ...measure.runtime.meters import MemoryMeter
    from ...measure.runtime.max_batch import find_max_batch

    longest = max(items, key=lambda it: len(it[0]))
    cap_bytes = int(cap_gib * 2**30) if cap_gib else None

    def try_batch(b: int) -> bool:
        with MemoryMeter(device, seed=(model, opt), cap_bytes=cap_bytes):
            try:
                stepper(_pad([longest[0]] * b, [longest[1]] * b, device))
            finally:
                opt.zero_grad(set_to_none=True)
        return True

    res = find_max_batch(try_batch, start=start, cap=cap)
    return {**res.to_dict(), "seq_len": len(longest[0]), "memory_cap_gib": cap_gib,
            "memory": "simulated (tensor tracker)" if device == "cpu" else "CUDA allocator"}


def _batches(items: list[tuple[list[int], list[int]]], size: int, rng: random.Random) -> list[list[int]]:
    order = list(range(len(items)))
    rng.shuffle(order)
    return [order[i: i + size] for i in range(0, len(order), size)]


# ---- the study ---------------------------------------------------------------------------------------------

def study_moe(scn: Scenario, data: str | Path, eval_data: str | Path, tokenizer: str | Path,
              epochs: int | None = None, top_ks: Sequence[int] | None = None, device: str = "auto",
              shrink: dict[str, Any] | None = None, seed: int = 0, batch_size: int | None = None,
              lr: float = 1.5e-3, warmup_frac: float = 0.05,
              eval_batch: int = 64, max_batch: bool = True, memory_cap_gib: float | None = None,
              max_batch_cap: int = 1024, progress: Callable[[str], None] | None = None,
              weights: str | Path | None = None) -> MoEStudyResult:
    """Fine-tune the scenario's MoE model once per top-k on `data`, evaluating on `eval_data` after every epoch.

    epochs / batch_size: default the scenario's workload.epochs and workload.micro_batch_size (8 when "max").
    top_ks: default (the model's top-k, its number of experts) = sparse vs dense. lr: peak learning rate of a
    linear-warmup cosine schedule (HF Trainer's `cosine`, the IISWC setting) on the scenario's optimizer; 1.5e-3
    suits the small random-weight demo model (3e-3 and 6e-3 learned less), pretrained weights want ~1e-5..1e-4
    (IISWC: 5e-5). memory_cap_gib: cap of the max-batch search (CUDA: a per-process memory fraction, default
    none: the whole GPU; CPU: the tensor tracker's simulated cap, default DEFAULT_CPU_CAP_GIB); max_batch=False
    skips the search. shrink: build a smaller copy of the scenario's model (see build.apply_shrink).
    """
    require_torch()
    import torch

    from ...measure.runtime.build import build_model
    from ...measure.runtime.meters import cuda_empty_cache
    from ...measure.runtime.profile import Stepper, make_optimizer, resolve_device

    spec = scn.model
    if not spec.is_moe:
        raise FtscopeError(f"study moe needs a MoE model; {spec.name} is dense")
    if epochs is None:
        epochs = max(1, math.ceil(scn.workload.epochs))
    if batch_size is None:
        mbs = scn.workload.micro_batch_size
        batch_size = mbs if isinstance(mbs, int) else 8
    if epochs < 1 or batch_size < 1 or not lr > 0:
        raise FtscopeError("--epochs and the batch size must be >= 1 and the learning rate above 0")
    experts = spec.arch.num_experts
    top_ks = tuple(top_ks) if top_ks else tuple(dict.fromkeys((spec.arch.top_k, experts)))
    bad = [k for k in top_ks if not 1 <= int(k) <= experts]
    if bad:
        raise FtscopeError(f"top-k {bad} out of range: {spec.name} has {experts} experts")
    dev = resolve_device(device)
    say = progress or (lambda _msg: None)
    tok, eos = _load_tokenizer(tokenizer)
    cutoff = scn.workload.seq_len or scn.workload.peak_seq_len()  # truncation cutoff (IISWC: cutoff_len 1024)
    (train, cut_train), (evals, cut_eval) = load_samples(data, tok, cutoff), load_samples(eval_data, tok, cutoff)
    tasks = baselines(train, evals)
    items = [_train_item(s, eos) for s in train]
    cap_gib = memory_cap_gib if memory_cap_gib is not None else (DEFAULT_CPU_CAP_GIB if dev == "cpu" else None)
    notes = [f"training loss on answer tokens only{' (+ EOS)' if eos is not None else ' (no EOS token found)'}; "
             "the router's load-balancing loss is not added (output_router_logits off, as in the IISWC runs)"]
    if cut_train or cut_eval:
        notes.append(f"{cut_train} training and {cut_eval} eval items were longer than the {cutoff}-token cutoff "
                     "(workload.seq_len) and lost the start of their prompt")
    if eos is None:
        notes.append("the tokenizer has no EOS token: greedy decoding stops after the longest reference answer")
    runs: list[TopKRun] = []
    for k in top_ks:
        scn_k = scn.with_(experts_top_k=int(k))
        torch.manual_seed(seed)  # same initial weights for every top-k: only the routing differs
        model, info = build_model(scn_k, device=dev, shrink=shrink, weights=weights)
        vocab = int((info.config.get("text_config") or info.config).get("vocab_size") or 0)
        if vocab and tok.get_vocab_size() > vocab:
            raise FtscopeError(f"the tokenizer has {tok.get_vocab_size()} tokens but the model's vocabulary is {vocab}")
        checksum = float(sum(p.detach().abs().double().sum() for p in model.parameters()))
        opt = make_optimizer(model, scn_k)
        for g in opt.param_groups:
            g["lr"] = lr
        total_steps = epochs * math.ceil(len(items) / batch_size)
        warm = max(1, int(warmup_frac * total_steps))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (
            1 + math.cos(math.pi * min(1.0, (s - warm) / max(1, total_steps - warm)))))
        stepper = Stepper(model, opt, dev, info.autocast_dtype)
        auto_dtype = getattr(torch, info.autocast_dtype) if info.autocast_dtype else None
        autocast = (lambda: torch.autocast(device_type="cuda" if dev.startswith("cuda") else "cpu", dtype=auto_dtype)) \
            if auto_dtype is not None else contextlib.nullcontext
        losses: list[Any] = []
        hook = model.register_forward_hook(lambda _m, _a, out: losses.append(out.loss.detach())
                                           if getattr(out, "loss", None) is not None else None)
        say(f"top-{k}: expert load and accuracy before fine-tuning")
        load_before = expert_load(model, evals, eos, dev, eval_batch, autocast)
        acc, eval_loss = evaluate(model, evals, eos, dev, eval_batch, autocast)
        points = [EpochPoint(0, acc, eval_loss)]
        losses.clear()
        step_losses: list[float] = []
        train_s = 0.0
        samples = tokens = 0
        for epoch in range(1, epochs + 1):
            rng = random.Random(seed * 1000 + epoch)  # the same sample order for every top-k
            n0 = len(step_losses)
            for idx in _batches(items, batch_size, rng):
                batch = _pad([items[i][0] for i in idx], [items[i][1] for i in idx], dev)
                f, b, o = stepper(batch)
                sched.step()
                train_s += f + b + o
                samples += len(idx)
                tokens += sum(len(items[i][0]) for i in idx)
            step_losses.extend(float(x) for x in losses)  # one host sync per epoch, not per step
            losses.clear()
            acc, eval_loss = evaluate(model, evals, eos, dev, eval_batch, autocast)
            ep_losses = step_losses[n0:]
            points.append(EpochPoint(epoch, acc, eval_loss, sum(ep_losses) / max(len(ep_losses), 1)))
            say(f"top-{k} epoch {epoch}: train loss {points[-1].train_loss:.3f}, eval loss {eval_loss:.3f}, "
                + ", ".join(f"{t} {a:.3f}" for t, a in acc.items()))
        hook.remove()
        say(f"top-{k}: expert load after fine-tuning")
        load_after = expert_load(model, evals, eos, dev, eval_batch, autocast)
        found = None
        if max_batch:
            say(f"top-{k}: max-batch search" + (f" under a {cap_gib} GiB cap" if cap_gib else ""))
            found = _search_max_batch(stepper, model, opt, items, dev, cap_gib, batch_size, max_batch_cap)
        est = None
        try:
            from ...estimate import estimate
            est = estimate(scn_k, strict=False).max_micro_batch_size
        except Exception:  # noqa: BLE001 - the estimate is context, never a reason to lose the study
            est = None
        build = asdict(info)
        build.pop("config", None)
        runs.append(TopKRun(top_k=int(k), build=build, init_checksum=checksum, epochs=points,
                            step_losses=step_losses, train_seconds=train_s,
                            samples_per_s=samples / train_s if train_s else 0.0,
                            tokens_per_s=tokens / train_s if train_s else 0.0,
                            load_before=load_before, load_after=load_after, max_batch=found,
                            max_batch_estimated=est))
        del model, opt, stepper, sched
        gc.collect()  # the next top-k builds its own model: free this one (and its CUDA blocks) first
        cuda_empty_cache()
    if max_batch and runs and runs[0].max_batch:
        where = f"{dev}, under a {cap_gib} GiB cap" if cap_gib else dev
        if dev == "cpu" and cap_gib:
            where += " (simulated by the tensor tracker)"
        notes.append(f"max batch (measured): the longest training sample ({runs[0].max_batch['seq_len']} tokens) "
                     f"repeated, on {where}")
    notes.append(f"max batch (estimated): ftscope's estimate for the scenario as written ({spec.name}, "
                 f"{scn.mix.label()}, seq {scn.workload.peak_seq_len()}, {scn.cluster.gpu.key})")
    if len({r.init_checksum for r in runs}) > 1:
        notes.append("the runs did not start from identical weights (checksums differ)")
    settings = {"epochs": epochs, "top_ks": list(top_ks), "batch_size": batch_size, "lr": lr, "schedule": "cosine",
                "warmup_frac": warmup_frac, "seed": seed, "shrink": shrink, "data": str(data),
                "eval": str(eval_data), "tokenizer": str(tokenizer), "cutoff": cutoff, "train_items": len(train),
                "eval_items": len(evals), "memory_cap_gib": cap_gib}
    return MoEStudyResult(scenario=scn.to_dict(), device=dev, settings=settings, tasks=tasks, runs=runs, notes=notes)


# ---- outputs -----------------------------------------------------------------------------------------------
