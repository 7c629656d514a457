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

import math
import time
import weakref
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..errors import FtscopeError
from ..spec.hardware import GIB
from ..spec.scenario import Scenario
from . import require_torch
from .build import NF4_BLOCKSIZE, BuildInfo, build_model

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
    allocator (measure/allocator.py); what torch.cuda.max_memory_reserved would show, less CUDA's own buffers."""
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


# ---- FLOP formulas torch's FlopCounterMode lacks -------------------------------------------------------------

def _causal_fraction(s_q: int, s_k: int, is_causal: bool) -> float:
    """Share of the score matrix a causal kernel computes: the lower triangle with its diagonal."""
    if not is_causal or s_q != s_k or s_q == 0:
        return 1.0
    return (s_q + 1) / (2 * s_q)


def _sdpa_cpu_flops(query, key, value, dropout_p=0.0, is_causal=False, *args, out_shape=None, **kwargs) -> int:
    """CPU flash attention forward: QK^T and PV, 2 FLOPs per multiply-add (GQA keys are broadcast)."""
    b, h, s_q, d_q = query
    s_k, d_v = key[-2], value[-1]
    return int(2 * b * h * s_q * s_k * (d_q + d_v) * _causal_fraction(s_q, s_k, is_causal))


def _sdpa_cpu_backward_flops(grad_out, query, key, value, out, logsumexp, dropout_p=0.0, is_causal=False,
                             *args, out_shape=None, **kwargs) -> int:
    """Backward: recomputed scores, dV, dP, dQ, dK (torch's sdpa_backward_flop_count: 2bhs^2 (3 d_qk + 2 d_v))."""
    b, h, s_q, d_q = query
    s_k, d_v = key[-2], value[-1]
    return int(2 * b * h * s_q * s_k * (3 * d_q + 2 * d_v) * _causal_fraction(s_q, s_k, is_causal))


def _sdpa_efficient_flops(query, key, value, attn_bias=None, compute_log_sumexp=False, dropout_p=0.0,
                          is_causal=False, *args, out_shape=None, **kwargs) -> int:
    """Memory-efficient attention forward (what CUDA runs when q/k and v head dims differ, e.g. MLA)."""
    return _sdpa_cpu_flops(query, key, value, dropout_p, is_causal)


def _sdpa_efficient_backward_flops(grad_out, query, key, value, attn_bias, out, logsumexp, philox_seed,
                                   philox_offset, dropout_p, grad_input_mask, is_causal=False, *args,
                                   out_shape=None, **kwargs) -> int:
    return _sdpa_cpu_backward_flops(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal)


def _grouped_mm_flops(mat_a, mat_b, *args, out_shape=None, **kwargs) -> int:
    """grouped_mm: each row of a 2-D operand meets one group's matrix, so FLOPs are 2 x rows x K x N whatever
    the split (forward 2-D x 3-D, input grad 2-D x 3-D, weight grad 2-D x 2-D -> 3-D); 3-D x 3-D is a bmm."""
    if len(mat_a) == 2 and len(mat_b) == 3:
        return 2 * mat_a[0] * mat_a[1] * mat_b[-1]
    if len(mat_a) == 2 and len(mat_b) == 2:
        return 2 * mat_a[0] * mat_a[1] * mat_b[1]
    if len(mat_a) == 3 and len(mat_b) == 2:   # b's columns are split among a's groups
        return 2 * mat_a[1] * mat_a[2] * mat_b[-1]
    return 2 * mat_a[0] * mat_a[1] * mat_a[2] * mat_b[-1]


def _gemm_4bit_flops(a, b, shape_b, *args, out_shape=None, **kwargs) -> int:
    """bitsandbytes' fused NF4 GEMM: x [.., K] times the dequantized [N, K] weight."""
    n, k = shape_b
    return 2 * math.prod(a[:-1]) * k * n


def _flop_formulas() -> dict[Any, Any]:
    import torch

    aten = torch.ops.aten
    out = {aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flops,
           aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward_flops,
           aten._scaled_dot_product_efficient_attention: _sdpa_efficient_flops,
           aten._scaled_dot_product_efficient_attention_backward: _sdpa_efficient_backward_flops,
           aten._grouped_mm: _grouped_mm_flops}
    if hasattr(torch.ops, "bitsandbytes") and hasattr(torch.ops.bitsandbytes, "gemm_4bit"):
        out[torch.ops.bitsandbytes.gemm_4bit] = _gemm_4bit_flops
    return out


# ---- layer attribution -----------------------------------------------------------------------------------------

_LORA_MARKS = ("lora_A", "lora_B", "LoraFactorsProxy", "LoraParameterProxy", "parametrizations")


def _layer_of(parents: frozenset[str]) -> str:
    """Layer type of an op from the dotted names of the modules running it (ancestors included): LoRA adapters
    and PEFT's parametrization proxies first, then router, experts (shared ones too), attention, MLP, LM head."""
    parts: set[str] = set()
    for name in parents:
        parts.update(name.split("."))
    if any(m in p for p in parts for m in _LORA_MARKS):
        return "lora"
    if parts & {"gate", "router", "shared_expert_gate"}:
        return "router"
    if parts & {"experts", "shared_expert", "shared_experts"}:
        return "experts"
    if parts & {"self_attn", "self_attention"}:
        return "attention"
    if "mlp" in parts:
        return "mlp"
    if "lm_head" in parts:
        return "lm_head"
    return "other"


class _LayerContext:
    """Which layer type the running op belongs to, in forward and in backward.

    Forward (and a checkpointed block's recompute): a stack of the modules whose forward is running, from global
    forward pre/post hooks. Backward: the autograd node being executed, tagged in forward by a TorchFunctionMode
    with the layer that created it. (torch's ModuleTracker misses the backward exit of modules called with
    keyword arguments only, as HF calls its attention, and then books all later backward work to them.)
    """

    KEY = "ftscope_layer"

    def __init__(self, model: Any) -> None:
        self.names = {id(m): name for name, m in model.named_modules(remove_duplicate=False)}
        self.stack: list[str] = []
        self._cache: dict[tuple[str, ...], str] = {}
        self._handles: list[Any] = []

    def in_experts(self) -> bool:
        return bool(self.stack) and "experts" in self.stack[-1].split(".")

    def forward_layer(self) -> str:
        key = tuple(self.stack)
        layer = self._cache.get(key)
        if layer is None:
            layer = self._cache[key] = _layer_of(frozenset(self.stack))
        return layer

    def current(self, phase: str) -> str:
        if phase == "backward":
            import torch

            node = torch._C._current_autograd_node()
            return node.metadata.get(self.KEY, "other") if node is not None else "other"
        return self.forward_layer() if phase in ("forward", "recompute") else "other"

    def _pre(self, mod: Any, args: Any) -> None:
        self.stack.append(self.names.get(id(mod)) or type(mod).__name__)

    def _post(self, mod: Any, args: Any, out: Any) -> None:
        if self.stack:
            self.stack.pop()

    def tag(self, out: Any) -> None:
        """Tag the autograd nodes an op just created (and the untagged nodes behind them) with the layer."""
        import torch
        from torch.utils._pytree import tree_leaves

        layer = None
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.grad_fn is None:
                continue
            todo = [t.grad_fn]
            while todo:
                node = todo.pop()
                if node is None:
                    continue
                md = node.metadata
                if self.KEY in md:
                    continue
                if layer is None:
                    layer = self.forward_layer()
                md[self.KEY] = layer
                todo.extend(n for n, _ in node.next_functions)

    def __enter__(self) -> "_LayerContext":
        import torch

        self._handles = [torch.nn.modules.module.register_module_forward_pre_hook(self._pre),
                         torch.nn.modules.module.register_module_forward_hook(self._post, always_call=True)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


class _GlobalOnly:
    """Stands in for FlopCounterMode's ModuleTracker: FLOPs are attributed by _LayerContext instead, and the
    tracker's multi-grad hooks form reference cycles with autograd nodes that keep saved tensors alive past
    backward until Python's cycle collector runs (an artifact of the tooling that a plain training step lacks)."""

    parents = frozenset({"Global"})

    def __enter__(self) -> "_GlobalOnly":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _make_tagger(layers: _LayerContext) -> Any:
    import torch
    from torch.overrides import TorchFunctionMode

    class Tagger(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if torch.is_grad_enabled():
                layers.tag(out)
            return out

    return Tagger()


# ---- the recorder ----------------------------------------------------------------------------------------------

class _Rec:
    __slots__ = ("nbytes", "t0", "t1", "phase", "kind")

    def __init__(self, nbytes: int, t0: int, phase: str, kind: str) -> None:
        self.nbytes, self.t0, self.t1, self.phase, self.kind = nbytes, t0, math.inf, phase, kind


def _make_recorder(counter: Any, routing: "_BalancedRouting | None", layers: "_LayerContext") -> Any:
    """The dispatch mode that books every storage and attributes FLOPs (built lazily: torch is optional)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    aten = torch.ops.aten
    # ops whose output is a weight-sized copy when an input is a parameter (autocast casts, PEFT's W + BA)
    copy_ops = {aten._to_copy.default, aten.clone.default, aten.baddbmm.default, aten.add.Tensor, aten.mul.Tensor}
    dequant_ops = set()
    if hasattr(torch.ops, "bitsandbytes"):
        dequant_ops.add(torch.ops.bitsandbytes.dequantize_4bit.default)  # packed 4-bit weight -> bf16 copy

    class Recorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.live: dict[int, _Rec] = {}
            self.refs: dict[int, Any] = {}
            self.recs: list[_Rec] = []
            self.t = 0
            self.cur = 0
            self.phase = "setup"
            self.peaks: dict[str, tuple[int, int]] = {}
            self.param_numel: dict[int, int] = {}
            self.flops: dict[tuple[str, str], float] = defaultdict(float)

        # bookkeeping
        def set_phase(self, phase: str) -> None:
            self.phase = phase
            self.peaks[phase] = (self.cur, self.t)

        def track(self, tensor: Any, kind: str) -> _Rec | None:
            st = tensor.untyped_storage()
            key = id(st)
            rec = self.live.get(key)
            if rec is not None:
                return rec
            nbytes = st.nbytes()
            rec = _Rec(nbytes, self.t, self.phase, kind)
            self.t += 1
            self.live[key] = rec
            self.refs[key] = weakref.ref(st, lambda _r, key=key: self._free(key))
            self.recs.append(rec)
            self.cur += nbytes
            peak = self.peaks.get(self.phase)
            if peak is None or self.cur > peak[0]:
                self.peaks[self.phase] = (self.cur, self.t)
            return rec

        def _free(self, key: int) -> None:
            rec = self.live.pop(key, None)
            self.refs.pop(key, None)
            if rec is not None:
                rec.t1 = self.t
                self.t += 1
                self.cur -= rec.nbytes

        def rec_of(self, tensor: Any) -> _Rec | None:
            return self.live.get(id(tensor.untyped_storage()))

        def register_weights(self, tensors: list[Any]) -> None:
            for t in tensors:
                self.track(t, "param")
                self.param_numel[id(t.untyped_storage())] = t.numel()

        def _global_flops(self) -> int:
            return sum(counter.flop_counts["Global"].values()) if counter is not None else 0

        def _kind(self, func: Any, args: Any) -> tuple[str, int | None]:
            """(kind of the op's new storages, numel a weight copy must have; -1: any)."""
            kind = "recompute" if self.phase == "backward" and layers.stack else self.phase
            if self.phase in ("forward", "backward"):
                if func in dequant_ops:
                    return kind, -1
                if func in copy_ops:
                    for a in tree_leaves(args):
                        if isinstance(a, torch.Tensor):
                            n = self.param_numel.get(id(a.untyped_storage()))
                            if n is not None and n > 1:
                                return kind, n
            return kind, None

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if routing is not None:
                handled = routing.handle(func, args)
                if handled is not _NOT_HANDLED:
                    return handled
            before = self._global_flops()
            out = func(*args, **kwargs)
            delta = self._global_flops() - before
            if delta:
                # a module's forward running inside backward: a checkpointed block being recomputed (grad mode
                # cannot tell: custom autograd Functions such as bitsandbytes' run their forward without grad)
                phase = "recompute" if self.phase == "backward" and layers.stack else self.phase
                self.flops[(phase, layers.current(phase))] += delta
            kind, copy_numel = self._kind(func, args)
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    is_copy = copy_numel is not None and (copy_numel < 0 or t.numel() == copy_numel)
                    self.track(t, "wcopy" if is_copy else kind)
            return out

    return Recorder()


_NOT_HANDLED = object()


class _BalancedRouting:
    """Answers the data-dependent ops of transformers' eager expert loop as if routing were perfectly balanced.

    The eager backend loops over the experts a batch hits (`nonzero` on the routing mask) and gathers each
    expert's tokens (`torch.where`): under fake tensors those sizes are unknown. Balanced routing hits every
    expert with tokens x top_k / experts slots, which is also what the estimator assumes; grouped_mm and
    batched_mm need no such help (their shapes do not depend on the routing).
    """

    def __init__(self, experts: int, layers: "_LayerContext") -> None:
        import torch

        self.torch = torch
        self.experts = experts
        self.layers = layers
        self.calls = 0
        self.index = 0
        aten = torch.ops.aten
        self.nonzero = aten.nonzero.default
        self.scalar_ops = {aten.is_nonzero.default, aten._local_scalar_dense.default}

    def handle(self, func: Any, args: Any) -> Any:
        torch = self.torch
        if (func is not self.nonzero and func not in self.scalar_ops) or not self.layers.in_experts():
            return _NOT_HANDLED
        if func is self.nonzero:
            x = args[0]
            e = self.experts
            if x.dim() == 1 and x.shape[0] in (e, e + 1):
                return torch.empty((e, 1), dtype=torch.long, device=x.device)
            if x.dim() == 2:
                slots = x.numel()   # (top_k, tokens): each token sits in top_k of the experts' masks
                i = self.calls % e
                self.calls += 1
                share = math.floor((i + 1) * slots / e) - math.floor(i * slots / e)
                return torch.empty((max(share, 0), 2), dtype=torch.long, device=x.device)
            raise FtscopeError(f"data-dependent op nonzero on a {tuple(x.shape)} tensor: not traceable")
        if func in self.scalar_ops and args and args[0].dim() == 0:
            if args[0].dtype == torch.bool:
                return False  # `if expert_idx == num_experts`: the no-expert sentinel is never hit
            if not args[0].dtype.is_floating_point:
                self.index = (self.index + 1) % self.experts  # `expert_mask[expert_idx]`: the next expert
                return self.index
        return _NOT_HANDLED


# ---- fake weights ------------------------------------------------------------------------------------------------

def _fake_weights(model: Any, fake_mode: Any) -> list[Any]:
    """Replace every meta parameter and buffer with a FakeTensor of the same shape and dtype (tied weights stay
    tied); bitsandbytes Linear4bit weights become fake NF4-packed tensors with a fake double-quantized state,
    made by bitsandbytes' own quantize_4bit fake kernel. Returns every tensor that now holds weight memory."""
    import torch

    try:
        import bitsandbytes as bnb
        linear4bit = bnb.nn.Linear4bit
    except ImportError:  # pragma: no cover - only QLoRA needs it
        bnb, linear4bit = None, ()
    memo: dict[int, Any] = {}
    held: list[Any] = []
    if bnb is not None and any(isinstance(m, linear4bit) for m in model.modules()):
        bnb.functional.quantize_blockwise(torch.ones(256))  # caches the dynamic map (its build reads values)
    with fake_mode:
        for mod in model.modules():
            for name, p in list(mod._parameters.items()):
                if p is None:
                    continue
                if id(p) not in memo:
                    if isinstance(mod, linear4bit) and name == "weight":
                        memo[id(p)] = _fake_4bit(mod, p, bnb, held)
                    else:
                        fake = torch.empty(p.shape, dtype=p.dtype, device="cpu")
                        memo[id(p)] = torch.nn.Parameter(fake, requires_grad=p.requires_grad)
                    held.append(memo[id(p)])
                mod._parameters[name] = memo[id(p)]
            for name, b in list(mod._buffers.items()):
                if b is None:
                    continue
                if id(b) not in memo:
                    memo[id(b)] = torch.empty(b.shape, dtype=b.dtype, device="cpu")
                    held.append(memo[id(b)])
                mod._buffers[name] = memo[id(b)]
    return held


def _fake_4bit(mod: Any, p: Any, bnb: Any, held: list[Any]) -> Any:
    import torch

    out_f, in_f = mod.out_features, mod.in_features
    w = torch.empty((out_f, in_f), dtype=torch.bfloat16, device="cpu")
    packed, qs = bnb.functional.quantize_4bit(w, blocksize=NF4_BLOCKSIZE, compress_statistics=True,
                                              quant_type="nf4", quant_storage=torch.uint8)
    param = torch.nn.Parameter(packed, requires_grad=False)
    for attr, value in (("quant_state", qs), ("blocksize", NF4_BLOCKSIZE), ("compress_statistics", True),
                        ("quant_type", "nf4"), ("quant_storage", torch.uint8), ("bnb_quantized", True),
                        ("module", mod)):
        setattr(param, attr, value)
    mod.quant_state = qs
    for t in (qs.absmax, getattr(qs, "offset", None), qs.code,
              getattr(qs.state2, "absmax", None) if qs.nested else None,
              getattr(qs.state2, "code", None) if qs.nested else None):
        if isinstance(t, torch.Tensor):
            held.append(t)
    return param


# ---- the step ------------------------------------------------------------------------------------------------

@contextmanager
def _unpacked_batch() -> Iterator[None]:
    """Answer transformers' packed-sequence probe the way real data does for one unpacked, unpadded batch.

    `find_packed_sequence_indices` reads position_ids values to see whether several sequences share a row; on
    fake tensors it cannot, says "maybe", and the model then builds an explicit B x S x S mask instead of
    letting sdpa run its `is_causal` kernel. Real position_ids 0..S-1 make it return None."""
    from transformers import masking_utils

    saved = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        with _cuda_attention_kernels():
            yield
    finally:
        masking_utils.find_packed_sequence_indices = saved


@contextmanager
def _cuda_attention_kernels() -> Iterator[None]:
    """Pick the attention kernel CUDA would: with q/k and v head dims that differ (DeepSeek's MLA: 192 vs 128)
    CPU sdpa falls back to the math path (it materializes B x H x S x S scores in fp32), while CUDA runs the
    memory-efficient kernel. Its fake-tensor implementation runs anywhere, so the trace uses that."""
    import torch
    import torch.nn.functional as F

    sdpa = F.scaled_dot_product_attention

    def routed(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if (query.shape[-1] != value.shape[-1] and attn_mask is None and not enable_gqa
                and query.shape[-3] == key.shape[-3] == value.shape[-3]):
            out = torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, None, query.requires_grad or key.requires_grad or value.requires_grad,
                dropout_p, is_causal, scale=scale)
            return out[0]
        return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                    enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = routed
    try:
        yield
    finally:
        F.scaled_dot_product_attention = sdpa


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
    """Trace one training step of the scenario at full size (or `shrink`-ed, see build.apply_shrink).

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
    weights = _fake_weights(model, fake_mode)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise FtscopeError("nothing to train: the mix leaves no parameter trainable")
    auto = getattr(torch, info.autocast_dtype) if info.autocast_dtype else None
    counter = FlopCounterMode(display=False, custom_mapping=_flop_formulas())
    counter.mod_tracker = _GlobalOnly()
    layers = _LayerContext(model)
    routing = None
    if scn.model.is_moe and info.experts_implementation == "eager":
        experts = int(next(v for k, v in info.config.items()
                           if k in ("num_local_experts", "num_experts", "n_routed_experts") and v))
        routing = _BalancedRouting(experts, layers)
        info.notes.append("eager experts traced with balanced routing (each expert gets tokens x top_k / experts)")
    rec = _make_recorder(counter, routing, layers)
    vocab = int(getattr(model.config, "vocab_size", 0) or info.config.get("vocab_size", 2))
    with fake_mode:
        ids = torch.randint(0, max(vocab, 2), (batch, seq), dtype=torch.long)
        opt = _optimizer(scn, trainable)
        with counter, layers, rec:
            rec.register_weights(weights)
            rec.track(ids, "setup")
            rec.set_phase("forward")
            with _unpacked_batch(), _make_tagger(layers), torch.autocast("cpu", dtype=auto, enabled=auto is not None):
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            t_fwd_end = rec.t
            rec.set_phase("backward")
            with _unpacked_batch(), _make_tagger(layers):  # a checkpointed block's recompute runs forward again
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


def replay_steps(recs: list[_Rec], steps: int = 3, allocator: Any = None) -> Any:
    """The traced step as a training loop would repeat it, through the caching-allocator model: weights first;
    each step allocates and frees as traced, except that optimizer states are created in the first step only and
    kept, gradients are freed at the end of every step (zero_grad(set_to_none=True)), and whatever the step left
    alive (input, loss) is freed then too. With `allocator`, continue that allocator's history (a profile sweep:
    the weights and optimizer states are already there)."""
    from .allocator import CachingAllocator

    fresh = allocator is None
    alloc = CachingAllocator() if fresh else allocator
    if fresh:
        for r in recs:
            if r.kind == "param":
                alloc.malloc(id(r), r.nbytes)
    call = object()  # keys of this replay never collide with an earlier one's
    body = [r for r in recs if r.kind != "param"]
    for step in range(steps):
        events = []
        for r in body:
            if r.kind == "opt" and (step > 0 or not fresh):
                continue
            events.append((r.t0, 1, r))
            if r.kind != "opt":
                events.append((r.t1, 0, r))  # math.inf (alive at the end) sorts last: freed when the step ends
        events.sort(key=lambda e: (e[0], e[1]))
        for _, is_malloc, r in events:
            key = (call, step, id(r)) if r.kind != "opt" else id(r)
            if is_malloc:
                alloc.malloc(key, r.nbytes)
            else:
                alloc.free(key)
    return alloc


def _category(r: _Rec) -> str:
    if r.kind == "param":
        return "weights"
    if r.kind == "grad":
        return "gradients"
    if r.kind == "opt":
        return "optimizer"
    if r.kind == "wcopy" or r.phase == "optimizer":
        return "temporary"
    return "activations"


def _breakdown(recs: list[_Rec], t: int) -> dict[str, int]:
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
