"""Predicted vs published max micro-batch for the IISWC A40 rows, under today's stack (framework hf-trainer) and
under the study's (llama-factory-2024: llmtuner 0.5.0's non-reentrant checkpointing over bitsandbytes 0.42, whose
4-bit matmul keeps its input; FINDINGS.md).

    .venv/bin/python benchmarks/iiswc_stack/predict_max_batch.py

Both columns are ftscope's estimator as it is; the bundled cases name the study's recipe, and `ftscope validate`
reports the same recipe column. `held MB/tok` is the estimator's `kbit_inputs_per_token`.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from ftscope.estimate import estimate  # noqa: E402
from ftscope.validate.cases import Case, load_cases  # noqa: E402
from ftscope.validate.compare import case_checks  # noqa: E402

TODAY = "hf-trainer"


def _max_batch_checks(case: Case) -> list[Any]:
    return [chk for chk in case_checks(case) if chk.metric == "max_micro_batch_size"]


def rows() -> list[dict[str, Any]]:
    out = []
    for case in load_cases():
        if not case.id.startswith("iiswc-a40"):
            continue
        today = dataclasses.replace(case, scenario={**case.scenario, "framework": TODAY})
        for chk, chk_today in zip(_max_batch_checks(case), _max_batch_checks(today)):
            est = estimate(chk.scenario, strict=False, with_time=False)
            out.append({"case": case.id + (f" {chk.note}" if chk.note else ""), "top_k": chk.scenario.top_k,
                        "seq": chk.scenario.workload.peak_seq_len(), "published": int(chk.measured),
                        "today": int(chk_today.predict()), "recipe": chk.scenario.recipe.name,
                        "held_mb_per_token": est.model_memory.acts.kbit_inputs_per_token / 1e6,
                        "predicted": est.max_micro_batch_size})
    return out


def main() -> None:
    print(f"{'case':44} {'k':>2} {'seq':>5} {'published':>9} {TODAY:>10} {'held MB/tok':>11} {'study':>5} "
          f"{'error':>6}")
    errs = []
    for r in rows():
        err = (r["predicted"] - r["published"]) / r["published"]
        errs.append(abs(err))
        print(f"{r['case']:44} {r['top_k']:>2} {r['seq']:>5} {r['published']:>9} {r['today']:>10} "
              f"{r['held_mb_per_token']:>11.2f} {r['predicted']:>5} {err:>+6.0%}")
    errs.sort()
    print(f"study's stack (the cases' recipe): median abs error {errs[len(errs) // 2]:.0%}, max {errs[-1]:.0%} "
          f"({len(errs)} rows)")


if __name__ == "__main__":
    main()
