"""Terminal views and charts of the two studies: the Singh et al. optimization grid and the MoE sparse-vs-dense
study (whose files report/moe_study.py writes)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..studies.moe.results import MoEStudyResult
from ..studies.optimizations import StudyRow
from . import charts
from .tables import simple_table


def optimizations_view(rows: Sequence[StudyRow], lens: Sequence[int], gpu: str, gpus: int,
                       summary: dict[str, Any]) -> list[Any]:
    """Per model: peak memory and step time of every combination at each context, and its longest context;
    then the fastest combination per context."""
    out: list[Any] = []
    for model in dict.fromkeys(r.model for r in rows):
        cells = []
        for r in (r for r in rows if r.model == model):
            row = [r.combo]
            for s in lens:
                c = r.by_seq[s]
                row.append(f"{c['peak_gib']:.1f} GiB {c['step_s']:.2f} s" if c["fits"] else
                           ("-" if c["reason"] and c["reason"].startswith("unsupported") else "OOM"))
            row.append(f"{r.max_seq_len:,}" if r.max_seq_len else "-")
            cells.append(row)
        out.append(simple_table(f"{model} on {gpus}x {gpu}: peak memory per GPU and step time at micro-batch 1",
                                ["combination", *[f"seq {s:,}" for s in lens], "max context"], cells))
    for s, per_model in summary.items():
        out.append(f"seq {s}: " + "; ".join(
            f"{m}: fastest {v['fastest']}" + ("" if v.get("zero2_lora_fits") else " (ZeRO-2 + LoRA does not fit)")
            if v.get("fits", True) else f"{m}: nothing fits" for m, v in per_model.items()))
    return out


def moe_view(result: MoEStudyResult) -> list[Any]:
    return [simple_table(title, columns, rows) for title, columns, rows in result.tables()]


def max_context_chart(rows: Sequence[StudyRow], path: str | Path) -> None:
    """Longest context per combination and model (log scale), one panel per model."""
    plt = charts.pyplot()
    models = list(dict.fromkeys(r.model for r in rows))
    fig, axes = plt.subplots(len(models), 1, figsize=(12, 3.2 * len(models)), squeeze=False)
    for ax, model in zip(axes[:, 0], models):
        mine = [r for r in rows if r.model == model and r.max_seq_len > 0]
        mine.sort(key=lambda r: -r.max_seq_len)
        ax.bar(range(len(mine)), [r.max_seq_len for r in mine],
               color=["#2a9d8f" if r.attention == "flash" else "#e76f51" for r in mine])
        ax.set_yscale("log")
        ax.set_xticks(range(len(mine)))
        ax.set_xticklabels([r.combo for r in mine], rotation=70, fontsize=6)
        ax.set_ylabel("max context (tokens)")
        ax.set_title(f"{model}: longest context at micro-batch 1 (green: FlashAttention, red: eager)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
