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
- the largest micro-batch that fits, found by running it (`max_batch.find_max_batch` on the longest training sample,
  under a memory cap on CPU), beside the estimator's `limits.max_micro_batch_size` for the scenario as written;
- the tokens routed to each expert in each layer on the eval set before and after fine-tuning (`runtime.expert_load.ExpertLoad`),
  with imbalance statistics. A query is prompt + reference answer (the paper's definition), batched by length so
  that no padding token is routed or counted.

Variance: the IISWC figure (Fig. 11) shows the variance of the average tokens per query routed to each expert
and mixes sample and population variance between panels. Here both are given, per layer, over the experts of
that layer: population (divide by E: the experts are the whole population) and sample (divide by E - 1).

Models have random weights (measure.runtime.build builds from the config), or the local checkpoint given as `weights`
(every top-k starts from it). torch is imported inside the functions; nothing here runs at import. The pieces: tokenizer.py and data.py
(items, baselines, batches), decoding.py (accuracy and eval loss), routing.py (expert load), results.py (what
comes back); here the recipe: `setup` once, `run_top_k` per top-k, then the notes. report/moe_study.py writes
the outputs.
"""
from __future__ import annotations

import gc
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ...errors import FtscopeError
from ...measure import require_torch
from ...measure.runtime.as_built import estimate_beside
from ...measure.runtime.batches import BatchShape
from ...measure.runtime.loop import StepTotals, Stepper, make_optimizer, resolve_device, timed_steps
from ...spec.scenario import Scenario
from .data import Sample, baselines, load_samples, pad, shuffled_batches, train_item
from .decoding import evaluate
from .results import EpochPoint, MoEStudyResult, TopKRun
from .routing import expert_load
from .tokenizer import load_tokenizer

DEFAULT_CPU_CAP_GIB = 0.0625
"""Simulated memory cap of the max-batch search on CPU (the tensor tracker's cap; a CPU has no OOM to find)."""


@dataclass
class StudySetup:
    """Everything the runs share: the settings, the tokenized data and the baselines."""

    scn: Scenario
    device: str
    epochs: int
    batch_size: int
    top_ks: tuple[int, ...]
    lr: float
    warmup_frac: float
    seed: int
    eval_batch: int
    shrink: dict[str, Any] | None
    weights: str | Path | None
    cap_gib: float | None
    """Memory cap of the max-batch search (None: the whole device)."""
    tok: Any
    eos: int | None
    cutoff: int
    train: list[Sample]
    evals: list[Sample]
    items: list[tuple[list[int], list[int]]]
    """(ids, labels) of every training item."""
    tasks: dict[str, dict[str, Any]]
    notes: list[str] = field(default_factory=list)


def _check(scn: Scenario, epochs: int | None, top_ks: Sequence[int] | None, batch_size: int | None,
           lr: float) -> tuple[int, tuple[int, ...], int]:
    """(epochs, top-k values, batch size) from the arguments and the scenario's defaults, checked."""
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
    return epochs, top_ks, batch_size


def setup(scn: Scenario, data: str | Path, eval_data: str | Path, tokenizer: str | Path, epochs: int | None = None,
          top_ks: Sequence[int] | None = None, device: str = "auto", shrink: dict[str, Any] | None = None,
          seed: int = 0, batch_size: int | None = None, lr: float = 1.5e-3, warmup_frac: float = 0.05,
          eval_batch: int = 64, memory_cap_gib: float | None = None,
          weights: str | Path | None = None) -> StudySetup:
    """Check the arguments, load the tokenizer and both data sets, and note what was cut or is missing."""
    epochs, top_ks, batch_size = _check(scn, epochs, top_ks, batch_size, lr)
    tok, eos = load_tokenizer(tokenizer)
    cutoff = scn.workload.seq_len or scn.workload.peak_seq_len()  # truncation cutoff (IISWC: cutoff_len 1024)
    (train, cut_train), (evals, cut_eval) = load_samples(data, tok, cutoff), load_samples(eval_data, tok, cutoff)
    require_torch()  # after every input is checked: a bad file is reported without torch
    dev = resolve_device(device)
    cap_gib = memory_cap_gib if memory_cap_gib is not None else (DEFAULT_CPU_CAP_GIB if dev == "cpu" else None)
    notes = [f"training loss on answer tokens only{' (+ EOS)' if eos is not None else ' (no EOS token found)'}; "
             "the router's load-balancing loss is not added (output_router_logits off, as in the IISWC runs)"]
    if cut_train or cut_eval:
        notes.append(f"{cut_train} training and {cut_eval} eval items were longer than the {cutoff}-token cutoff "
                     "(workload.seq_len) and lost the start of their prompt")
    if eos is None:
        notes.append("the tokenizer has no EOS token: greedy decoding stops after the longest reference answer")
    return StudySetup(scn, dev, epochs, batch_size, top_ks, lr, warmup_frac, seed, eval_batch, shrink, weights,
                      cap_gib, tok, eos, cutoff, train, evals, [train_item(s, eos) for s in train],
                      baselines(train, evals), notes)


def _optimizer(st: StudySetup, model: Any, scn_k: Scenario) -> tuple[Any, Any]:
    """The mix's optimizer at the peak learning rate and a linear-warmup cosine schedule (HF Trainer's)."""
    import torch

    opt = make_optimizer(model, scn_k)
    for g in opt.param_groups:
        g["lr"] = st.lr
    total_steps = st.epochs * math.ceil(len(st.items) / st.batch_size)
    warm = max(1, int(st.warmup_frac * total_steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (
        1 + math.cos(math.pi * min(1.0, (s - warm) / max(1, total_steps - warm)))))
    return opt, sched


def _train(st: StudySetup, k: int, model: Any, stepper: Stepper, sched: Any, autocast_dtype: str | None,
           say: Callable[[str], None]) -> tuple[list[EpochPoint], list[float], StepTotals]:
    """Evaluate, then per epoch train on the shuffled items (the same order for every top-k) and evaluate."""
    losses: list[Any] = []
    hook = model.register_forward_hook(lambda _m, _a, out: losses.append(out.loss.detach())
                                       if getattr(out, "loss", None) is not None else None)
    acc, eval_loss = evaluate(model, st.evals, st.eos, st.device, st.eval_batch, autocast_dtype)
    points = [EpochPoint(0, acc, eval_loss)]
    losses.clear()
    step_losses: list[float] = []
    totals = StepTotals()

    def step(idx: list[int]) -> tuple[tuple[float, float, float], list[BatchShape]]:
        times = stepper(pad([st.items[i][0] for i in idx], [st.items[i][1] for i in idx], st.device))
        sched.step()
        lengths = tuple(len(st.items[i][0]) for i in idx)
        return times, [BatchShape(lengths, max(lengths))]

    for epoch in range(1, st.epochs + 1):
        n0 = len(step_losses)
        timed_steps(step, shuffled_batches(st.items, st.batch_size, random.Random(st.seed * 1000 + epoch)), totals)
        step_losses.extend(float(x) for x in losses)  # one host sync per epoch, not per step
        losses.clear()
        acc, eval_loss = evaluate(model, st.evals, st.eos, st.device, st.eval_batch, autocast_dtype)
        ep_losses = step_losses[n0:]
        points.append(EpochPoint(epoch, acc, eval_loss, sum(ep_losses) / max(len(ep_losses), 1)))
        say(f"top-{k} epoch {epoch}: train loss {points[-1].train_loss:.3f}, eval loss {eval_loss:.3f}, "
            + ", ".join(f"{t} {a:.3f}" for t, a in acc.items()))
    hook.remove()
    return points, step_losses, totals


def _search_max_batch(st: StudySetup, stepper: Stepper, max_batch_cap: int) -> dict[str, Any]:
    """find_max_batch on the longest training sample repeated: the worst batch dynamic padding can produce.
    Runs real steps (weights change), so the study calls it after its last measurement."""
    from ...measure.runtime.max_batch import find_max_batch, oom_probe

    ids, labels = max(st.items, key=lambda it: len(it[0]))
    probe = oom_probe(lambda b: stepper(pad([ids] * b, [labels] * b, st.device)), st.device,
                      (stepper.model, stepper.opt), int(st.cap_gib * 2**30) if st.cap_gib else None, stepper.opt)
    res = find_max_batch(probe, start=st.batch_size, cap=max_batch_cap)
    return {**res.to_dict(), "seq_len": len(ids), "memory_cap_gib": st.cap_gib,
            "memory": "simulated (tensor tracker)" if st.device == "cpu" else "CUDA allocator"}


def run_top_k(st: StudySetup, k: int, max_batch: bool, max_batch_cap: int, say: Callable[[str], None]) -> TopKRun:
    """Build the model at top-k (same initial weights for every k: the seed is set first), fine-tune and evaluate
    it, count its expert load before and after, and search its max batch."""
    import torch

    from ...measure.runtime.build import build_model
    from ...measure.runtime.meters import cuda_empty_cache

    scn_k = st.scn.with_(experts_top_k=int(k))
    torch.manual_seed(st.seed)  # same initial weights for every top-k: only the routing differs
    model, info = build_model(scn_k, device=st.device, shrink=st.shrink, weights=st.weights)
    if info.vocab_size and st.tok.get_vocab_size() > info.vocab_size:
        raise FtscopeError(f"the tokenizer has {st.tok.get_vocab_size()} tokens but the model's vocabulary is "
                           f"{info.vocab_size}")
    checksum = float(sum(p.detach().abs().double().sum() for p in model.parameters()))
    opt, sched = _optimizer(st, model, scn_k)
    stepper = Stepper(model, opt, st.device, info.autocast_dtype)
    say(f"top-{k}: expert load and accuracy before fine-tuning")
    load_before = expert_load(model, st.evals, st.eos, st.device, st.eval_batch, info.autocast_dtype)
    points, step_losses, totals = _train(st, k, model, stepper, sched, info.autocast_dtype, say)
    say(f"top-{k}: expert load after fine-tuning")
    load_after = expert_load(model, st.evals, st.eos, st.device, st.eval_batch, info.autocast_dtype)
    found = None
    if max_batch:
        say(f"top-{k}: max-batch search" + (f" under a {st.cap_gib} GiB cap" if st.cap_gib else ""))
        found = _search_max_batch(st, stepper, max_batch_cap)
    est = estimate_beside(scn_k)
    build = asdict(info)
    build.pop("config", None)
    train_s = totals.compute_s
    del model, opt, stepper, sched
    gc.collect()  # the next top-k builds its own model: free this one (and its CUDA blocks) first
    cuda_empty_cache()
    return TopKRun(top_k=int(k), build=build, init_checksum=checksum, epochs=points, step_losses=step_losses,
                   train_seconds=train_s, samples_per_s=totals.samples / train_s if train_s else 0.0,
                   tokens_per_s=totals.tokens / train_s if train_s else 0.0, load_before=load_before,
                   load_after=load_after, max_batch=found,
                   max_batch_estimated=est.max_micro_batch_size if est is not None else None)


def _closing_notes(st: StudySetup, runs: list[TopKRun], max_batch: bool) -> list[str]:
    scn, notes = st.scn, list(st.notes)
    if max_batch and runs and runs[0].max_batch:
        where = f"{st.device}, under a {st.cap_gib} GiB cap" if st.cap_gib else st.device
        if st.device == "cpu" and st.cap_gib:
            where += " (simulated by the tensor tracker)"
        notes.append(f"max batch (measured): the longest training sample ({runs[0].max_batch['seq_len']} tokens) "
                     f"repeated, on {where}")
    notes.append(f"max batch (estimated): ftscope's estimate for the scenario as written ({scn.model.name}, "
                 f"{scn.mix.label()}, seq {scn.workload.peak_seq_len()}, {scn.cluster.gpu.key})")
    if len({r.init_checksum for r in runs}) > 1:
        notes.append("the runs did not start from identical weights (checksums differ)")
    return notes


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
    skips the search. shrink: build a smaller copy of the scenario's model (see runtime/configs.apply_shrink).
    """
    st = setup(scn, data, eval_data, tokenizer, epochs, top_ks, device, shrink, seed, batch_size, lr, warmup_frac,
               eval_batch, memory_cap_gib, weights)
    say = progress or (lambda _msg: None)
    runs = [run_top_k(st, k, max_batch, max_batch_cap, say) for k in st.top_ks]
    settings = {"epochs": st.epochs, "top_ks": list(st.top_ks), "batch_size": st.batch_size, "lr": lr,
                "schedule": "cosine", "warmup_frac": warmup_frac, "seed": seed, "shrink": shrink, "data": str(data),
                "eval": str(eval_data), "tokenizer": str(tokenizer), "cutoff": st.cutoff,
                "train_items": len(st.train), "eval_items": len(st.evals), "memory_cap_gib": st.cap_gib}
    return MoEStudyResult(scenario=scn.to_dict(), device=st.device, settings=settings, tasks=st.tasks, runs=runs,
                          notes=_closing_notes(st, runs, max_batch))
