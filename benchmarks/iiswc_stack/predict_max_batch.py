"""Predicted vs published max micro-batch for the IISWC A40 rows: ftscope's estimator, then the same estimator
plus the per-token term that bitsandbytes 0.42 adds under non-reentrant checkpointing (FINDINGS.md).

    .venv/bin/python benchmarks/iiswc_stack/predict_max_batch.py

The term is a formula in model dimensions only (no per-row constant). It is added to the bytes each token
keeps from the end of the forward to the end of the backward (the estimator's checkpoint_per_token), which is
where ctx.tensors live: they die with the graph, when the Trainer drops the loss after backward. Nothing here
changes the estimator's code.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from ftscope.estimate import DEFAULT_MARGIN, estimate  # noqa: E402
from ftscope.plan.solvers import max_micro_batch  # noqa: E402
from ftscope.validate.cases import load_cases  # noqa: E402
from ftscope.validate.compare import case_checks  # noqa: E402

ACT_BYTES = {"bf16-mixed": 2, "bf16": 2, "fp16-mixed": 2, "fp16": 2, "fp32": 4}


def bnb042_ctx_bytes_per_token(scn: Any) -> float:
    """Bytes per token that bitsandbytes <= 0.43.1's MatMul4Bit keeps in `ctx.tensors` (its input A) for every
    4-bit linear whose input needs grad, when checkpointing is non-reentrant (LLaMA-Factory 0.5's setting).

    Mixtral layout, LoRA on the experts and the router (the study's w1,w2,w3,gate): in layer 0 only the expert
    down-projection's input needs grad (it follows the LoRA'd w1/w3); from layer 1 on, every input does:
        c * ( k*I  +  (L-1) * ( h  +  n_heads*d_head  +  h  +  k*(h + I) ) )
              w2 in    q/k/v in   o_proj in         gate in  w1/w3 in + w2 in (per routed copy)
    c = bytes of the compute dtype. 0 when the mix is not QLoRA with gradient checkpointing."""
    mix, arch = scn.mix, scn.model.arch
    if mix.method != "qlora" or not mix.gradient_checkpointing or not scn.model.is_moe:
        return 0.0
    c = ACT_BYTES.get(mix.precision, 2)
    h, inter, layers, k = arch.hidden_size, arch.moe_intermediate_size, arch.num_layers, scn.top_k
    o_in = arch.num_heads * arch.head_dim
    return c * (k * inter + (layers - 1) * (h + o_in + h + k * (h + inter)))


def with_term(mem: Any, extra_per_token: float) -> Any:
    acts = dataclasses.replace(mem.acts, checkpoint_per_token=mem.acts.checkpoint_per_token + extra_per_token)
    return dataclasses.replace(mem, acts=acts)


def rows() -> list[dict[str, Any]]:
    out = []
    for case in load_cases():
        if not case.id.startswith("iiswc-a40"):
            continue
        for chk in case_checks(case):
            if chk.metric != "max_micro_batch_size":
                continue
            est = estimate(chk.scenario, strict=False, with_time=False)
            term = bnb042_ctx_bytes_per_token(chk.scenario)
            seq = chk.scenario.workload.peak_seq_len()
            mb = max_micro_batch(with_term(est.model_memory, term), seq, DEFAULT_MARGIN)
            out.append({"case": case.id + (f" {chk.note}" if chk.note else ""), "top_k": chk.scenario.top_k,
                        "seq": seq, "published": int(chk.measured), "ftscope": est.max_micro_batch_size,
                        "term_mb_per_token": term / 1e6, "with_term": mb})
    return out


def main() -> None:
    print(f"{'case':44} {'k':>2} {'seq':>5} {'published':>9} {'ftscope':>8} {'term MB/tok':>11} {'+term':>6} "
          f"{'error':>7}")
    errs = []
    for r in rows():
        err = (r["with_term"] - r["published"]) / r["published"]
        errs.append(abs(err))
        print(f"{r['case']:44} {r['top_k']:>2} {r['seq']:>5} {r['published']:>9} {r['ftscope']:>8} "
              f"{r['term_mb_per_token']:>11.2f} {r['with_term']:>6} {err:>+7.0%}")
    errs.sort()
    print(f"median abs error with the term: {errs[len(errs) // 2]:.0%}, max {errs[-1]:.0%} ({len(errs)} rows)")


if __name__ == "__main__":
    main()
