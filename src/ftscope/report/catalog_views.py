"""The catalog as rows and tables: bundled models (`ftscope models`), GPUs (`ftscope gpus`), one model's
parameters by component (`ftscope show`)."""
from __future__ import annotations

from typing import Any

from .. import catalog
from ..spec.resolve import load_model
from .columns import Col, FitTable
from .tables import simple_table


def model_rows() -> list[dict[str, Any]]:
    rows = []
    for name, entry in catalog.model_index().items():
        m = load_model(name)
        rows.append({"name": name, "hf_id": entry.get("hf_id"), "family": m.arch.model_type,
                     "total_params": m.total_params, "active_params": m.active_params(),
                     "experts": m.arch.num_experts, "top_k": m.arch.top_k, "layers": m.num_layers,
                     "hidden": m.arch.hidden_size, "source": entry.get("source", "")})
    return rows


MODEL_COLUMNS = (
    Col("name", "name", justify="left"), Col("family", "family", justify="left", priority=2),
    Col("params", cell=lambda r: f"{r['total_params'] / 1e9:.2f}B"),
    Col("active", cell=lambda r: f"{r['active_params'] / 1e9:.2f}B", priority=1),
    Col("experts", cell=lambda r: f"{r['top_k']}/{r['experts']}" if r["experts"] else "-", priority=1),
    Col("HF id", "hf_id", justify="left", wrap=True, priority=3),
)
"""`ftscope models`; on a narrow terminal the HF id goes first, then the family."""


def models_table(rows: list[dict[str, Any]]) -> Any:
    return FitTable("bundled models (ftscope show NAME for details)", MODEL_COLUMNS, rows)


GPU_FIELDS = ("name", "memory_mib", "bf16_tflops", "fp16_tflops", "fp32_tflops", "memory_bandwidth_gbs",
              "intra_node_link", "intra_node_gbs", "flash_attention", "source")


def gpu_rows() -> list[dict[str, Any]]:
    rows = []
    for key, e in catalog.gpu_table().items():
        prices = catalog.prices_for(key)
        rows.append({"key": key, **{k: e.get(k) for k in GPU_FIELDS},
                     "prices": [{k: str(v) if k == "date" else v for k, v in p.items()} for p in prices]})
    return rows


def _price(row: dict[str, Any]) -> str:
    p = row["prices"][0] if row["prices"] else None
    return f"{p['usd_per_gpu_hour']:.2f} ({p['provider']})" if p else "-"


GPU_COLUMNS = (
    Col("GPU", "key", justify="left"), Col("memory GiB", cell=lambda r: f"{r['memory_mib'] / 1024:.1f}"),
    Col("bf16 TF/s", "bf16_tflops", priority=1), Col("HBM GB/s", "memory_bandwidth_gbs", priority=2),
    Col("link", cell=lambda r: f"{r['intra_node_link']} {r['intra_node_gbs']} GB/s", justify="left", wrap=True,
        priority=3),
    Col("flash", cell=lambda r: "yes" if r["flash_attention"] else "no", justify="left", priority=4),
    Col("$/GPU-h", cell=_price, justify="left", wrap=True),
)
"""`ftscope gpus`; on a narrow terminal flash support goes first, then the link, the bandwidth, the peak."""


def gpu_csv_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`gpus --csv`: one row per GPU with its cheapest newest price (--json has every provider's)."""
    out = []
    for r in rows:
        p = r["prices"][0] if r["prices"] else {}
        out.append({**{k: v for k, v in r.items() if k != "prices"}, "usd_per_gpu_hour": p.get("usd_per_gpu_hour"),
                    "price_provider": p.get("provider"), "price_date": p.get("date")})
    return out


def gpus_table(rows: list[dict[str, Any]]) -> Any:
    return FitTable("GPU catalog (dense peaks; prices: cheapest newest per provider)", GPU_COLUMNS, rows)


def model_details(model: str, lora_rank: int) -> dict[str, Any]:
    m = load_model(model)
    a = m.arch
    return {
        "name": m.name, "source": m.source, "model_type": a.model_type, "layers": m.num_layers,
        "hidden_size": a.hidden_size, "heads": a.num_heads, "kv_heads": a.num_kv_heads, "head_dim": a.head_dim,
        "intermediate_size": a.intermediate_size, "vocab_size": a.vocab_size, "tied_embeddings": a.tie_embeddings,
        "experts": a.num_experts, "top_k": a.top_k, "moe_intermediate_size": a.moe_intermediate_size,
        "moe_layers": len(a.moe_layers), "total_params": m.total_params, "active_params": m.active_params(),
        "params_by_component": m.params_by_component(),
        "lora_params": {t: m.lora_params(lora_rank, t) for t in ("all-linear", "attention", "mlp")},
        "lora_rank": lora_rank,
        **({"resolution": m.resolution} if m.resolution else {}),  # also a note on stderr
    }


def model_table(data: dict[str, Any]) -> Any:
    rank = data["lora_rank"]
    rows = [[k, f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else v] for k, v in data.items()
            if k not in ("params_by_component", "lora_params", "resolution")]
    rows += [[f"params: {k}", f"{v:,}"] for k, v in data["params_by_component"].items()]
    rows += [[f"LoRA r{rank}: {k}", f"{v:,}"] for k, v in data["lora_params"].items()]
    return simple_table(data["name"], ["field", "value"], rows)
