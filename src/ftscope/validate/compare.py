"""Turn cases into checks (one measured number each) and compare them with the estimator.

Memory numbers are compared in the metric the source measured: allocated -> memory.allocated_gib,
reserved -> memory.peak_gib, nvidia-smi -> memory.device_gib (reserved + CUDA context + NCCL buffers). A source that does
not say ("unknown", or "GB" in a README) is compared as nvidia-smi, the number people usually quote. A paged
optimizer's states live in CUDA managed memory, which torch's allocator counters never see: allocated and
reserved figures are compared without them.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import FtscopeError
from ..estimate import estimate
from ..estimate.efficiency import Calibration, load_calibration
from ..estimate.result import Estimate, TimeEstimate
from ..spec.scenario import Scenario, apply_overrides, scenario_from_dict
from .cases import Case

MEMORY_FIELD = {"allocated": "allocated_gib", "reserved": "peak_gib", "smi": "device_gib", "unknown": "device_gib"}
TIME_METRICS = ("samples_per_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "step_s", "fwd_bwd_opt_s",
                "forward_s", "backward_s", "optimizer_s")
"""step_s is a training loop's whole step (host overhead included); fwd_bwd_opt_s is the synchronized forward +
backward + optimizer that profilers (and the IISWC stage times) report, without data loading or logging.
tokens_per_s is the whole job's, tokens_per_s_per_gpu the job's over its GPUs; mfu is a fraction."""
# ms-swift's setups as overrides of the case's scenario
SETUP_OVERRIDES = {
    "lora_1gpu": [], "qlora_bnb4_1gpu": ["mix.method=qlora"], "full_1gpu": ["mix.method=full"],
    "lora_ddp_2gpu": ["hardware.gpus_per_node=2"], "lora_zero2_2gpu": ["hardware.gpus_per_node=2", "mix.zero_stage=2"],
    "lora_zero3_2gpu": ["hardware.gpus_per_node=2", "mix.zero_stage=3"],
}
_LADDER_CHANGES = (
    ("plus_packing", []),
    ("plus_compile", ["mix.compile=true"]),
    ("plus_chunked_cross_entropy", ["mix.loss=chunked"]),
    ("plus_activation_checkpointing", ["mix.gradient_checkpointing=true"]),
    ("plus_optimizer_in_backward", ["mix.optimizer_in_backward=true"]),
    ("plus_activation_offload", ["mix.activation_offload=true"]),
    ("plus_adamw_8bit", ["mix.optimizer=adamw_8bit"]),
)
LADDER_STEPS = {step: [o for _, ov in _LADDER_CHANGES[:i + 1] for o in ov] for i, (step, _) in enumerate(_LADDER_CHANGES)}
"""torchtune's optimization ladder (README "Optimization flags" at 1814feb1): each row adds one change to the row
above it, so a step's scenario is the case's with every change up to it. The baseline is unpacked alpaca, whose
padded lengths are not stated: not a step."""
LADDER_NOT_COMPARED = {"baseline": "unpacked alpaca at max length 4096: the padded lengths (the dataset's token-length "
                                   "distribution) are not stated"}


@dataclass(frozen=True)
class Check:
    """One measured number and the scenario that produced it."""

    case_id: str
    group: str
    metric: str
    measured: float
    scenario: Scenario
    note: str = ""

    def predict(self, calibration: Calibration | None = None) -> float:
        est = estimate(self.scenario, strict=False, calibration=calibration)
        m = self.metric
        if m == "max_micro_batch_size":
            return float(est.max_micro_batch_size)
        if m == "oom":  # memory alone decides (an unsupported kernel is not an out-of-memory)
            return float(est.memory.fit_bytes > est.model_memory.capacity_bytes * (1 - est.margin))
        if m.startswith("peak_gib"):
            return memory_gib(est, m.split(":")[1])
        if est.time is None:
            return float("nan")
        return time_metric(est.time, m, self.scenario)


def memory_gib(est: Estimate, kind: str) -> float:
    """The estimate's memory as a source of this kind measured it (MEMORY_FIELD), in GiB, unrounded: the JSON's
    three decimals would read a tiny CPU model's few MiB as 0.001 GiB."""
    mem, paged = est.memory, est.model_memory.paged_optimizer
    if MEMORY_FIELD[kind] == "allocated_gib":
        return (mem.allocated_bytes - paged) / 2**30
    if MEMORY_FIELD[kind] == "peak_gib":
        return (mem.peak_bytes - paged) / 2**30
    return est.device_bytes / 2**30


def time_metric(t: TimeEstimate, metric: str, scn: Scenario) -> float:
    """One TIME_METRICS value from a step-time estimate of scenario `scn`, as the source measured it."""
    b = t.breakdown_s
    if metric == "samples_per_s":
        return t.samples_per_s
    if metric == "tokens_per_s":
        return t.tokens_per_s
    if metric == "tokens_per_s_per_gpu":
        return t.tokens_per_s / scn.cluster.world_size
    if metric == "mfu":
        return t.mfu
    if metric == "step_s":
        return t.step_s
    if metric == "fwd_bwd_opt_s":
        return t.step_s - b["other"]
    # profilers put dequantization inside the pass that triggers it: one forward, the rest in backward
    passes = 3.0 if scn.mix.gradient_checkpointing else 2.0
    if metric == "forward_s":
        return b["forward"] + b["dequant"] / passes
    if metric == "backward_s":
        return b["backward"] + b["recompute"] + b["dequant"] * (passes - 1) / passes
    if metric == "optimizer_s":
        return b["optimizer"]
    raise FtscopeError(f"unknown metric {metric}")


@dataclass(frozen=True)
class CheckResult:
    case_id: str
    group: str
    metric: str
    predicted: float
    measured: float
    note: str

    @property
    def error_pct(self) -> float:
        return (self.predicted - self.measured) / self.measured * 100.0 if self.measured else float("nan")

    @staticmethod
    def fmt(v: float) -> str:
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case_id, "group": self.group, "metric": self.metric, "predicted": self.predicted,
                "measured": self.measured, "error_pct": self.error_pct, "note": self.note}


def case_scenario(case: Case, overrides: Sequence[str]) -> Scenario:
    """The case's scenario with key.path=value overrides applied (one measured variant of it)."""
    return scenario_from_dict(apply_overrides(dict(case.scenario), list(overrides)))


def case_checks(case: Case) -> list[Check]:
    """Every number a case measured, each with the scenario variant that measured it."""
    me = case.measured
    out: list[Check] = []

    skip = me.get("not_compared") or {}

    def add(metric: str, value: Any, overrides: Sequence[str] = (), note: str = "") -> None:
        if value is None or metric in skip:
            return
        try:
            scn = case_scenario(case, overrides)
        except FtscopeError as exc:
            raise FtscopeError(f"case '{case.id}': {exc}") from None
        out.append(Check(case.id, case.group, metric, float(value), scn, note))

    metric_name = str(me.get("memory_metric", "unknown"))
    mem_note = f"memory as {MEMORY_FIELD[metric_name].replace('_gib', '')} (source: {metric_name})"
    for b, v in (me.get("samples_per_s_by_batch") or {}).items():
        add("samples_per_s", v, [f"workload.micro_batch_size={b}"], f"batch {b}")
    if "max_micro_batch_size" in me:
        add("max_micro_batch_size", me["max_micro_batch_size"], ["workload.micro_batch_size=1"])
    for key, v in (me.get("max_micro_batch_size_by_top_k") or {}).items():
        add("max_micro_batch_size", v, ["workload.micro_batch_size=1", f"mix.experts_top_k={key[3:]}"], key)
    for key, by_batch in (me.get("step_s_by_top_k_and_batch") or {}).items():
        for b, stages in by_batch.items():
            ov = [f"workload.micro_batch_size={b}", f"mix.experts_top_k={key[3:]}"]
            add("fwd_bwd_opt_s", sum(stages.values()), ov, f"{key} batch {b}")
            for stage in ("forward", "backward", "optimizer"):
                add(f"{stage}_s", stages.get(stage), ov, f"{key} batch {b}")
    for key in ("samples_per_s", "tokens_per_s", "step_s"):
        add(key, me.get(key))
    if "peak_gib" in me:
        add(f"peak_gib:{metric_name}", me["peak_gib"], (), mem_note)
    for setup, v in (me.get("peak_by_setup_gib") or {}).items():
        if setup in SETUP_OVERRIDES:
            add(f"peak_gib:{metric_name}", v, SETUP_OVERRIDES[setup], f"{setup}; {mem_note}")
    ladder = me.get("ladder_peak_active_gib_and_tokens_per_s") or {}
    for step, ov in LADDER_STEPS.items():
        if step in ladder:
            gib, tps = ladder[step]
            add("peak_gib:allocated", gib, ov, f"{step}; torchtune 'peak active' = allocated")
            add("tokens_per_s", tps, ov, step)
    return out


def skipped_measurements(case: Case) -> list[tuple[str, str]]:
    """(what, why) for measured numbers of a case that no check compares, so nothing is dropped silently."""
    out = [(f"{case.id}: {metric}", str(why)) for metric, why in (case.measured.get("not_compared") or {}).items()]
    for step in (case.measured.get("ladder_peak_active_gib_and_tokens_per_s") or {}):
        if step not in LADDER_STEPS:
            out.append((f"{case.id}: {step}", LADDER_NOT_COMPARED.get(step, "a ladder step ftscope does not map")))
    for setup in (case.measured.get("peak_by_setup_gib") or {}):
        if setup not in SETUP_OVERRIDES:
            out.append((f"{case.id}: {setup}", "setup not mapped to a scenario"))
    for recipe in ("lora", "qlora"):
        if recipe in case.measured:
            out.append((f"{case.id}: {recipe}", "a recipe of its own beside the case; its settings are not the case's scenario"))
    if "oom" in case.measured:
        out.append((f"{case.id}: oom", "an out-of-memory flag is not a figure; compare `memory.fits` by hand"))
    return out


def all_checks(cases: Sequence[Case]) -> list[Check]:
    return [c for case in cases for c in case_checks(case)]


def run_validation(cases: Sequence[Case], calibration: Calibration | str | None = None,
                   extra: Sequence[Check] = ()) -> list[CheckResult]:
    """Predicted vs measured for every check of the cases (plus `extra` checks, e.g. from a profile store)."""
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    return [CheckResult(c.case_id, c.group, c.metric, c.predict(cal), c.measured, c.note)
            for c in [*all_checks(cases), *extra]]


def metric_family(metric: str) -> str:
    return "peak_gib" if metric.startswith("peak_gib") else metric


def summary(results: Sequence[CheckResult]) -> dict[str, dict[str, float]]:
    """Median and max absolute % error per metric family; out-of-memory outcomes as right / wrong counts."""
    by: dict[str, list[float]] = {}
    out: dict[str, dict[str, float]] = {}
    ooms = [r for r in results if r.metric == "oom"]
    if ooms:
        right = sum(1 for r in ooms if r.predicted == r.measured)
        out["oom"] = {"n": len(ooms), "right": right, "wrong": len(ooms) - right}
    for r in results:
        if r.metric == "oom":
            continue
        e = abs(r.error_pct)
        if e == e:
            by.setdefault(metric_family(r.metric), []).append(e)
    out.update({k: {"n": len(v), "median": statistics.median(v), "max": max(v)} for k, v in by.items()})
    return dict(sorted(out.items()))
