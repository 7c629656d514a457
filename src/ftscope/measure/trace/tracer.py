"""trace(scenario): exact tensor memory and FLOPs of one training step of the real implementation, at full size,
without allocating it.

The model is built at full size on the meta device (build.py: transformers, PEFT, bitsandbytes), its
parameters are swapped for FakeTensors (PEFT's own parameter swap fails inside FakeTensorMode, so the swap is
done after wrapping), and one step - forward with labels, backward, optimizer step - runs under FakeTensorMode.
Every aten op passes through a `_Recorder` dispatch mode that notes when each storage is allocated and freed, and
through torch's FlopCounterMode (with formulas for the ops it lacks: CPU flash attention, grouped_mm,
bitsandbytes' 4-bit GEMM). Categories are decided after the step, from each storage's fate:

  weights      parameters, buffers, 4-bit packed weights and their quantization state
  gradients    storages that end up as a parameter's .grad
  optimizer    storages held in optimizer.state
  temporary    copies of weights (autocast casts, a dequantized 4-bit weight, PEFT's merged expert stacks) and
               the optimizer step's scratch
  activations  everything else, all of which scales with the batch: what autograd saved, intermediates, the
               loss buffers, gradients of activations, a checkpointed block's recompute
(the estimator's taxonomy; `saved_after_forward_gib` gives what autograd holds when forward ends).

Bytes are what `torch.cuda.max_memory_allocated` counts (tensor storages), not what the caching allocator
reserves. Only the per-storage bookkeeping runs per op, so a 7B step takes seconds and little RAM.

Conventions: tensors are fake CPU tensors, so sdpa runs torch's CPU flash kernel (it keeps q, k, v, the output
and a log-sum-exp, like the CUDA flash/efficient kernels); causal attention FLOPs count the lower triangle; the
step is a steady-state one (optimizer states exist from the start, gradients start as None); FLOPs of a
checkpointed block's recompute are reported apart from backward.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ...errors import FtscopeError
from ...spec.hardware import GIB
from ...spec.scenario import Scenario
from .. import require_torch
from ..runtime.build import BuildInfo, build_model
from .allocator import replay_steps
from .fake_weights import fake_weights
from .flops import flop_formulas
from .kernels import unpacked_batch
from .layers import GlobalOnly, LayerContext, make_tagger
from .recorder import BalancedRouting, Rec, Recorder

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "temporary")
PHASES = ("forward", "backward", "optimizer")
LAYERS = ("attention", "mlp", "experts", "router", "lora", "lm_head", "other")


@dataclass
class TraceResult:
    """One traced training step: memory by category and phase, FLOPs by phase and layer type."""

    scenario: Scenario
    batch: int
    seq: int
    build: BuildInfo
    peak_bytes: int
    peak_phase: str
    categories: dict[str, int]
    """Bytes per category at the step's peak."""
    phases: dict[str, int]
    """Peak allocated bytes within each phase."""
    phase_categories: dict[str, dict[str, int]]
    """Bytes per category at each phase's own peak."""
    flops: dict[str, float]
    """forward, backward (without recompute), recompute, optimizer, total."""
    flops_by_layer: dict[str, float]
    """Whole step, by layer type: attention, mlp, experts, router, lora, lm_head, other."""
    flops_by_phase_layer: dict[str, dict[str, float]] = field(default_factory=dict)
    saved_bytes: int = 0
    """Activations alive when forward ends (what autograd saved for backward, and the loss)."""
    recs: list[Any] = field(default_factory=list, repr=False)
    """Every storage the step allocated (size, creation and free event), for allocator replays."""
    reserved_bytes: int = 0
    """Peak reserved memory: the step's allocations replayed for 3 steps through a model of PyTorch's CUDA caching
    allocator (allocator.py); what torch.cuda.max_memory_reserved would show, less CUDA's own buffers."""
    wall_s: float = 0.0

    @property
    def total_params(self) -> int:
        return self.build.total_params

    @property
    def trainable_params(self) -> int:
        return self.build.trainable_params

    def to_dict(self) -> dict[str, Any]:
        """JSON in the shape of `estimate --json` where the fields overlap (memory.*, model.*), plus flops/trace."""
        gib = lambda b: round(b / GIB, 3)  # noqa: E731
        scn = self.scenario
        resolved = scn.to_dict()
        resolved["workload"]["micro_batch_size"] = self.batch
        resolved["workload"]["seq_len"] = self.seq
        return {
            "scenario": resolved,
            "label": f"{scn.model.name} | trace | {scn.mix.label()} | b{self.batch} s{self.seq}",
            "model": {"name": scn.model.name, "total_params": self.total_params,
                      "trainable_params": self.trainable_params, "source": scn.model.source},
            "memory": {
                "peak_gib": gib(self.reserved_bytes),
                "allocated_gib": gib(self.peak_bytes),
                "breakdown_gib": {k: gib(v) for k, v in self.categories.items()},
                "phases_gib": {k: gib(v) for k, v in self.phases.items()},
                "phase_breakdown_gib": {p: {k: gib(v) for k, v in c.items()} for p, c in self.phase_categories.items()},
                "saved_after_forward_gib": gib(self.saved_bytes),
                "peak_phase": self.peak_phase,
                "seq_len": self.seq,
                "metric": "allocated_gib: tensor bytes of a fake-tensor trace (torch.cuda.max_memory_allocated); "
                          "peak_gib: those allocations replayed through a CUDA caching-allocator model "
                          "(max_memory_reserved); no CUDA context",
            },
            "flops": {
                **{k: float(v) for k, v in self.flops.items()},
                "by_layer": {k: float(v) for k, v in self.flops_by_layer.items()},
                "by_phase_layer": {p: {k: float(v) for k, v in d.items()} for p, d in self.flops_by_phase_layer.items()},
            },
            "trace": {
                "wall_s": round(self.wall_s, 2),
                "attention": self.build.attention,
                "experts_implementation": self.build.experts_implementation,
                "top_k": self.build.top_k,
                "param_dtype": self.build.param_dtype,
                "adapter_dtype": self.build.adapter_dtype,
                "autocast_dtype": self.build.autocast_dtype,
                "notes": list(self.build.notes),
            },
        }


# ---- the step ------------------------------------------------------------------------------------------------

def _check_traceable(scn: Scenario) -> list[str]:
    mix, notes = scn.mix, []
    if mix.shard_stage or mix.offload != "none" or scn.cluster.world_size > 1:
        raise FtscopeError("trace runs one GPU's step without sharding; ZeRO/FSDP/offload and multi-GPU "
                           "partitioning are modelled by `estimate` only (set zero_stage 0, one GPU)")
    if mix.optimizer in ("adamw_8bit", "paged_adamw_8bit"):
        raise FtscopeError(f"{mix.optimizer} is not traceable: bitsandbytes' 8-bit optimizer step reads tensor values "
                           "(fake tensors have none); trace with optimizer adamw or sgd")
    if scn.workload.gradient_accumulation > 1:
        notes.append("one micro-batch traced; with gradient accumulation the gradients also exist during forward")
    return notes


def _check_build(scn: Scenario, info: BuildInfo) -> None:
    if scn.model.is_moe and info.experts_implementation == "grouped_mm" and info.param_dtype != "bfloat16":
        raise FtscopeError(f"experts_backend grouped_mm runs bf16 weights only; this mix keeps {info.param_dtype} "
                           "weights (full fine-tuning under bf16-mixed: fp32 master weights). Use experts_backend "
                           "batched_mm or eager, or precision bf16")


def _optimizer(scn: Scenario, params: list[Any]) -> Any:
    import torch

    opt = scn.mix.optimizer
    if opt == "adamw":
        # foreach: what torch picks on CUDA (one temporary per parameter during the step)
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, foreach=True)
    return torch.optim.SGD(params, lr=1e-4, momentum=0.0, foreach=True)  # sgd: no state, as the estimator


def _state_tensors(opt: Any) -> list[Any]:
    import torch

    return [v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def trace(scn: Scenario, batch: int | None = None, seq: int | None = None,
          shrink: dict[str, Any] | None = None) -> TraceResult:
    """Trace one training step of the scenario at full size (or `shrink`-ed, see runtime/configs.apply_shrink).

    batch/seq default to the scenario's micro-batch size and padded sequence length. The input is one batch of
    full-length sequences with labels and no padding (no attention mask: sdpa runs its causal kernel). The
    step is a steady-state one: optimizer states exist throughout, gradients start as None (zero_grad
    set_to_none), as in every step of HF Trainer after the first.
    """
    require_torch(("bitsandbytes",) if scn.mix.method == "qlora" else ())
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    t_start = time.perf_counter()
    notes = _check_traceable(scn)
    wl = scn.workload
    if batch is None:
        if wl.solve_batch:
            raise FtscopeError("workload.micro_batch_size is 'max': give the trace a batch size (--batch)")
        batch = int(wl.micro_batch_size)
    seq = int(seq if seq is not None else wl.peak_seq_len())
    if batch < 1 or seq < 2:
        raise FtscopeError(f"trace needs batch >= 1 and seq >= 2; got batch {batch}, seq {seq}")

    model, info = build_model(scn, device="meta", shrink=shrink)
    info.notes.extend(notes)
    _check_build(scn, info)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    weights = fake_weights(model, fake_mode)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise FtscopeError("nothing to train: the mix leaves no parameter trainable")
    auto = getattr(torch, info.autocast_dtype) if info.autocast_dtype else None
    counter = FlopCounterMode(display=False, custom_mapping=flop_formulas())
    counter.mod_tracker = GlobalOnly()
    layers = LayerContext(model)
    routing = None
    if scn.model.is_moe and info.experts_implementation == "eager":
        experts = int(next(v for k, v in info.config.items()
                           if k in ("num_local_experts", "num_experts", "n_routed_experts") and v))
        routing = BalancedRouting(experts, layers)
        info.notes.append("eager experts traced with balanced routing (each expert gets tokens x top_k / experts)")
    rec = Recorder(counter, routing, layers)
    vocab = int(getattr(model.config, "vocab_size", 0) or info.config.get("vocab_size", 2))
    with fake_mode:
        ids = torch.randint(0, max(vocab, 2), (batch, seq), dtype=torch.long)
        opt = _optimizer(scn, trainable)
        with counter, layers, rec:
            rec.register_weights(weights)
            rec.track(ids, "setup")
            rec.set_phase("forward")
            with unpacked_batch(), make_tagger(layers), torch.autocast("cpu", dtype=auto, enabled=auto is not None):
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            t_fwd_end = rec.t
            rec.set_phase("backward")
            with unpacked_batch(), make_tagger(layers):  # a checkpointed block's recompute runs forward again
                loss.backward()
            del loss
            for p in trainable:
                if p.grad is not None:
                    g = rec.rec_of(p.grad)
                    if g is not None:
                        g.kind = "grad"
            rec.set_phase("optimizer")
            opt.step()
            for t in _state_tensors(opt):
                r = rec.rec_of(t)
                if r is not None:
                    r.kind = "opt"
    result = _summarize(scn, batch, seq, info, rec, t_fwd_end)
    result.reserved_bytes = replay_steps(rec.recs).peak_reserved
    result.recs = rec.recs
    result.wall_s = time.perf_counter() - t_start
    return result


def _category(r: Rec) -> str:
    if r.kind == "param":
        return "weights"
    if r.kind == "grad":
        return "gradients"
    if r.kind == "opt":
        return "optimizer"
    if r.kind == "wcopy" or r.phase == "optimizer":
        return "temporary"
    return "activations"


def _breakdown(recs: list[Rec], t: int) -> dict[str, int]:
    """Bytes per category of the storages alive at event time t."""
    out = dict.fromkeys(CATEGORIES, 0)
    for r in recs:
        if r.t0 < t <= r.t1:
            out[_category(r)] += r.nbytes
    return out


def _summarize(scn: Scenario, batch: int, seq: int, info: BuildInfo, rec: Any, t_fwd_end: int) -> TraceResult:
    phases = {p: rec.peaks.get(p, (0, 0))[0] for p in PHASES}
    phase_cats = {p: _breakdown(rec.recs, rec.peaks[p][1]) for p in PHASES if p in rec.peaks}
    saved = sum(r.nbytes for r in rec.recs
                if r.t0 < t_fwd_end < r.t1 and r.phase in ("setup", "forward") and _category(r) == "activations")
    # Steady state: torch creates optimizer states inside the first step (before its update math, so the
    # optimizer phase already peaks with them); in every later step they exist through forward and backward.
    states = sum(r.nbytes for r in rec.recs if r.kind == "opt")
    for p in ("forward", "backward"):
        phases[p] += states
        phase_cats[p]["optimizer"] += states
    peak_phase = max(PHASES, key=lambda p: phases[p])
    flops = {"forward": 0.0, "backward": 0.0, "recompute": 0.0, "optimizer": 0.0}
    by_layer = dict.fromkeys(LAYERS, 0.0)
    by_phase_layer: dict[str, dict[str, float]] = {}
    for (phase, layer), v in rec.flops.items():
        flops[phase] = flops.get(phase, 0.0) + v
        by_layer[layer] += v
        by_phase_layer.setdefault(phase, dict.fromkeys(LAYERS, 0.0))[layer] += v
    flops["total"] = sum(flops.values())
    return TraceResult(scenario=scn, batch=batch, seq=seq, build=info, peak_bytes=phases[peak_phase],
                       peak_phase=peak_phase, categories=phase_cats[peak_phase], phases=phases,
                       phase_categories=phase_cats, flops=flops, flops_by_layer=by_layer,
                       flops_by_phase_layer=by_phase_layer, saved_bytes=saved)
