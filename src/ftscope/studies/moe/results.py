"""What the MoE study returns: per top-k run, accuracy and loss per epoch, throughput, max batch and the expert load
before and after fine-tuning; and its tables."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .routing import LoadSnapshot


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
