"""Charts: one function per figure of the IISWC study (and a few more), each from JSON-shaped data.

Every function takes plain dicts/lists (what `--json` prints or the store holds) and returns a matplotlib
Figure; `save(fig, path)` writes PNG or SVG by the extension. matplotlib runs headless (Agg).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import FtscopeError, install_hint

PALETTE = ("#264653", "#2a9d8f", "#e9c46a", "#f4a261", "#e76f51", "#8ab17d", "#6d597a", "#b56576")
MEMORY_KEYS = ("weights", "gradients", "optimizer", "activations", "temporary", "overhead")
TIME_KEYS = ("forward", "backward", "recompute", "optimizer", "communication", "dequant", "other")
NOT_STACKED = ("communication_exposed", "communication_hidden")
"""Breakdown fields that split `communication` (exposed) or lie beside the step (hidden): not bars of their own."""


def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise FtscopeError(f"charts need matplotlib: {install_hint('report')}") from None
    return plt


def save(fig: Any, path: str | Path) -> Path:
    """Write a figure as PNG or SVG (by extension) and close it."""
    from ..files import os_error, output_file

    p = Path(path)
    if p.suffix.lower() not in (".png", ".svg"):
        raise FtscopeError(f"plot file must end in .png or .svg; got {p.name}")
    p = output_file(p, "plot file")
    try:
        fig.savefig(p, dpi=110, bbox_inches="tight")
    except OSError as exc:
        raise os_error(exc, "plot file", p, "write") from None
    finally:
        pyplot().close(fig)
    return p


def memory_breakdown(rows: Sequence[Mapping[str, Any]], title: str = "memory per GPU by category") -> Any:
    """Stacked bars of memory.breakdown_gib per estimate row, with each GPU's usable capacity marked."""
    plt = pyplot()
    rows = [r for r in rows if r.get("memory") and r["memory"].get("breakdown_gib")]
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(rows) + 3), 4.2))
    bottom = [0.0] * len(rows)
    for key, color in zip(MEMORY_KEYS, PALETTE):
        vals = [r["memory"]["breakdown_gib"].get(key, 0.0) for r in rows]
        ax.bar(range(len(rows)), vals, bottom=bottom, color=color, label=key)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, r in enumerate(rows):
        cap = r["memory"].get("capacity_gib")
        if cap:
            ax.hlines(cap, i - 0.4, i + 0.4, colors="black", linestyles="dashed", linewidth=1)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([_short(r) for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("GiB per GPU (dashed: usable)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=3)
    return fig


def _short(row: Mapping[str, Any]) -> str:
    label = str(row.get("label", ""))
    parts = label.split(" | ")
    return " | ".join(parts[1:]) if len(parts) > 2 else label


def throughput_vs_batch(series: Sequence[Mapping[str, Any]], title: str = "throughput vs batch size") -> Any:
    """Measured points and the model's curve per series: {label, group, measured: {b: v}, predicted: {b: v}, unit};
    one panel per group (model), so a fast small model does not flatten a slow large one."""
    plt = pyplot()
    groups = list(dict.fromkeys(s.get("group", "") for s in series)) or [""]
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.2), squeeze=False)
    for ax, group in zip(axes[0], groups):
        mine = [s for s in series if s.get("group", "") == group]
        for s, color in zip(mine, PALETTE * 3):
            pred = sorted((int(b), v) for b, v in (s.get("predicted") or {}).items())
            meas = sorted((int(b), v) for b, v in (s.get("measured") or {}).items())
            if pred:
                ax.plot([b for b, _ in pred], [v for _, v in pred], "-", color=color, label=f"{s['label']} (model)")
            if meas:
                ax.plot([b for b, _ in meas], [v for _, v in meas], "o", color=color, label=f"{s['label']} (measured)")
        ax.set_xlabel("micro-batch size")
        ax.set_ylabel(mine[0].get("unit", "samples/s") if mine else "samples/s")
        ax.set_title(f"{title}: {group}" if group else title, fontsize=10)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a run with no throughput figure has nothing to label
            ax.legend(fontsize=7)
    return fig


def time_breakdown(rows: Sequence[Mapping[str, Any]], title: str = "step time breakdown") -> Any:
    """Stacked bars of {label, breakdown_s: {forward, backward, ...}} (predicted and measured side by side)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows) + 2), 4.2))
    keys = [k for k in TIME_KEYS if any(r["breakdown_s"].get(k) for r in rows)] or list(TIME_KEYS)
    extra = sorted({k for r in rows for k in r["breakdown_s"]} - set(TIME_KEYS) - set(NOT_STACKED))
    bottom = [0.0] * len(rows)
    for key, color in zip(keys + extra, PALETTE * 3):
        vals = [r["breakdown_s"].get(key, 0.0) or 0.0 for r in rows]
        ax.bar(range(len(rows)), vals, bottom=bottom, color=color, label=key)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["label"] for r in rows], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("seconds per step")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    return fig


def expert_load(matrix: Sequence[Sequence[float]], title: str = "tokens per expert (layer x expert)",
                after: Sequence[Sequence[float]] | None = None) -> Any:
    """Heatmap of tokens routed to each expert in each layer; two panels when a 'after fine-tuning' matrix is given."""
    plt = pyplot()
    panels = [("before" if after is not None else "", matrix)] + ([("after", after)] if after is not None else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    vmax = max(max(max(row) for row in m) for _, m in panels) or 1
    for ax, (name, m) in zip(axes[0], panels):
        im = ax.imshow(m, aspect="auto", cmap="viridis", vmin=0, vmax=vmax)
        ax.set_xticks(range(len(m[0])))
        ax.set_yticks(range(len(m)))
        ax.set_xlabel("expert")
        ax.set_ylabel("layer")
        ax.set_title(f"{title} {name}".strip(), fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
    return fig


def utilization(samples: Sequence[Mapping[str, float]], title: str = "GPU utilization during steps") -> Any:
    """Line chart of NVML samples: {t, sm, mem_bw} in percent."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    if samples:
        ax.plot([s["t"] for s in samples], [s.get("sm", 0) for s in samples], label="SM %")
        ax.plot([s["t"] for s in samples], [s.get("mem_bw", 0) for s in samples], label="memory bandwidth %")
    else:
        ax.text(0.5, 0.5, "no NVML samples (CPU run or NVML unavailable)", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("seconds")
    ax.set_ylim(0, 100)
    ax.set_title(title, fontsize=10)
    if samples:
        ax.legend(fontsize=7)
    return fig


def cost_vs_time(rows: Sequence[Mapping[str, Any]], title: str = "cost vs time across GPUs") -> Any:
    """Scatter of run.hours vs run.usd for feasible plan rows, Pareto frontier joined and labelled."""
    plt = pyplot()
    pts = [r for r in rows if r.get("run") and r["run"].get("usd") is not None and r.get("memory", {}).get("fits")]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    gpus = sorted({r["scenario"]["hardware"]["gpu"] for r in pts})
    cmap = plt.get_cmap("tab20")
    colors = {g: cmap(i % 20) for i, g in enumerate(gpus)}
    for r in pts:
        g = r["scenario"]["hardware"]["gpu"]
        ax.scatter(r["run"]["hours"], r["run"]["usd"], color=colors[g], s=18 + 6 * r["scenario"]["hardware"]["gpus_per_node"],
                   label=g, alpha=0.8)
    front = sorted((r for r in pts if r.get("pareto")), key=lambda r: r["run"]["hours"])
    if front:
        ax.plot([r["run"]["hours"] for r in front], [r["run"]["usd"] for r in front], "k--", linewidth=1, label="Pareto frontier")
        for r in front:
            hw = r["scenario"]["hardware"]
            ax.annotate(f"{hw['gpus_per_node']}x {hw['gpu']}", (r["run"]["hours"], r["run"]["usd"]), fontsize=7,
                        xytext=(4, 4), textcoords="offset points")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=7, ncol=2)
    ax.set_xscale("log")
    ax.set_xlabel("hours (log)")
    ax.set_ylabel("USD")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    return fig


def predicted_vs_measured(results: Sequence[Mapping[str, Any]], title: str = "predicted vs measured") -> Any:
    """Log-log scatter of validate results, one colour per metric family, with the y = x line and +-20 % band."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    fams: dict[str, list[Mapping[str, Any]]] = {}
    for r in results:
        if r["measured"] and r["predicted"] == r["predicted"] and r["predicted"] > 0:
            fams.setdefault(r["metric"].split(":")[0], []).append(r)
    lo = min((min(r["measured"], r["predicted"]) for rs in fams.values() for r in rs), default=0.01)
    hi = max((max(r["measured"], r["predicted"]) for rs in fams.values() for r in rs), default=1)
    for (fam, rs), color in zip(sorted(fams.items()), PALETTE * 3):
        ax.scatter([r["measured"] for r in rs], [r["predicted"] for r in rs], color=color, s=16, label=fam)
    ax.plot([lo, hi], [lo, hi], "k-", linewidth=0.8)
    ax.fill_between([lo, hi], [lo * 0.8, hi * 0.8], [lo * 1.2, hi * 1.2], color="grey", alpha=0.15, label="+-20 %")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured")
    ax.set_ylabel("predicted")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    return fig
