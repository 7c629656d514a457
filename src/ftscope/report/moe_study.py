"""The MoE study's outputs: study.json, tables.md and its charts (accuracy, loss, expert load before / after)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..studies.moe.results import MoEStudyResult


def tables_markdown(result: MoEStudyResult) -> str:
    """The study's tables as Markdown."""
    parts = []
    for title, cols, rows in result.tables():
        parts.append(f"### {title}\n\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
                     + "".join("| " + " | ".join(str(x) for x in r) + " |\n" for r in rows))
    return "\n".join(parts)


def write_outputs(result: MoEStudyResult, out: str | Path, plot: bool = True) -> list[Path]:
    """study.json, tables.md and (plot=True) accuracy.png, loss.png, expert_load_top{k}.png (tokens per query per
    expert, before | after) and expert_weights_top{k}.png (routing-weight share, before | after) under `out`.

    """
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    written = [d / "study.json", d / "tables.md"]
    written[0].write_text(json.dumps(result.to_dict(), indent=1) + "\n")
    written[1].write_text(tables_markdown(result))
    if not plot:
        return written
    from . import charts

    plt = charts.pyplot()
    tasks = list(result.tasks)
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.8 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for i, r in enumerate(result.runs):
            ax.plot([e.epoch for e in r.epochs], [e.accuracy.get(task, 0.0) for e in r.epochs], marker="o",
                    color=charts.PALETTE[i % len(charts.PALETTE)], label=f"top-{r.top_k}")
        info = result.tasks[task]
        ax.axhline(info["baseline"], color="grey", ls="--", lw=1,
                   label="chance" if info["kind"] == "mc" else "most common answer")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("epoch (0 = before fine-tuning)")
        ax.set_ylabel("exact match" if info["kind"] == "qa" else "multiple-choice accuracy")
        ax.set_title(f"{task} ({info['items']} eval items)", fontsize=9)
        ax.legend(fontsize=7)
    written.append(charts.save(fig, d / "accuracy.png"))
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for i, r in enumerate(result.runs):
        w = max(1, len(r.step_losses) // 100)  # moving average: per-step losses of small batches are noisy
        xs = r.step_losses
        smooth = [sum(xs[max(0, j - w + 1): j + 1]) / len(xs[max(0, j - w + 1): j + 1]) for j in range(len(xs))]
        ax.plot(range(1, len(xs) + 1), smooth, color=charts.PALETTE[i % len(charts.PALETTE)], label=f"top-{r.top_k}")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (moving average)")
    ax.set_title("training loss on answer tokens", fontsize=9)
    ax.legend(fontsize=7)
    written.append(charts.save(fig, d / "loss.png"))
    for r in result.runs:
        if r.load_before is None or r.load_after is None:
            continue
        written.append(charts.save(charts.expert_load(
            r.load_before.per_query, title=f"top-{r.top_k}: tokens per query per expert",
            after=r.load_after.per_query), d / f"expert_load_top{r.top_k}.png"))
        written.append(charts.save(charts.expert_load(
            r.load_before.weight_share, title=f"top-{r.top_k}: routing-weight share",
            after=r.load_after.weight_share), d / f"expert_weights_top{r.top_k}.png"))
    return written
