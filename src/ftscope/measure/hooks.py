"""Instruments attached to a live model: time by layer type, tokens per expert, GPU utilization.

- `LayerTimer`: forward / backward (/ recompute) wall time per layer type, through module hooks. Time is
  *exclusive*: every instant between two hook events is charged to the innermost classified module open at
  that instant, so nested modules (LoRA adapters inside attention, the router inside the MoE block) are never
  counted twice, and the categories sum to at most the step time (the rest is unclassified glue: residual
  adds, rotary embeddings, the loss, the optimizer).
- `ExpertLoad`: for MoE models, tokens routed to each expert in each layer, read from the top-k indices the
  router hands to the experts module, kept on the device (no host sync per layer).
- `UtilizationSampler`: a background thread polling NVML for SM and memory-bandwidth utilization while steps
  run; a no-op that says why on CPU or without nvidia-ml-py.

torch is imported inside the functions that need it, never at module import.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Iterable

CATEGORIES = ("attention", "mlp", "experts", "router", "norms", "embeddings_lm_head", "lora", "quant_linear")
"""Layer types LayerTimer reports. 'quant_linear' is a bitsandbytes 4/8-bit base layer: dequantization and its
matmul happen inside one module call and cannot be told apart through module hooks."""

PHASES = ("forward", "backward", "recompute")
"""'recompute' is forward work re-run inside backward by gradient checkpointing."""

# Class-name rules, first match wins. Names are the transformers / torch / peft class names (e.g.
# MixtralSparseMoeBlock, Qwen2MoeTopKRouter, LlamaRMSNorm); rotary embeddings are deliberately left out
# (a tiny per-step table computed once in the model body).
_CLASS_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(Router|MoEGate)$"), "router"),
    (re.compile(r"(SparseMoeBlock|MoeBlock|SparseMoE|MoE|Moe|MoeLayer|MoELayer|Experts)$"), "experts"),
    (re.compile(r"(Attention\d*|Attn)$"), "attention"),
    (re.compile(r"(MLP|Mlp|FeedForward|FFN)$"), "mlp"),
    (re.compile(r"Norm$"), "norms"),
    (re.compile(r"(?<!Rotary)Embedding$"), "embeddings_lm_head"),
)
_LORA_NAME = re.compile(r"(^|\.)(lora_A|lora_B|lora_embedding_A|lora_embedding_B|lora_magnitude_vector)\.[^.]+$")
_HEAD_NAMES = ("lm_head", "embed_out")


def _graph_task_active(torch: Any) -> bool:
    """True while the autograd engine is running a backward pass on this thread (GC recompute lives here)."""
    return torch._C._current_graph_task_id() != -1


def classify(model: Any) -> dict[str, str]:
    """Qualified module name -> category for every module LayerTimer would time.

    Rules: LoRA adapter leaves by name (lora_A/lora_B.<adapter>) and PEFT ParamWrapper (LoRA on fused expert
    parameters) -> lora; bitsandbytes Linear4bit/Linear8bitLt -> quant_linear; the output embedding (lm_head)
    -> embeddings_lm_head; a plain Linear named 'gate' / 'shared_expert_gate' inside a MoE block -> router;
    an MLP inside a MoE block (shared experts) -> experts; otherwise the class-name rules above."""
    head = None
    get_out = getattr(model, "get_output_embeddings", None)
    if callable(get_out):
        try:
            head = get_out()
        except Exception:  # some wrappers raise NotImplementedError; fall back to names
            head = None
    result: dict[str, str] = {}
    for name, module in model.named_modules():
        cls = type(module)
        cname = cls.__name__
        leaf = name.rsplit(".", 1)[-1]
        parent_cat = _parent_category(result, name)
        if _LORA_NAME.search(name) or cname == "ParamWrapper":
            cat: str | None = "lora"
        elif cls.__module__.startswith("bitsandbytes") and cname in ("Linear4bit", "Linear8bitLt"):
            cat = "quant_linear"
        elif (head is not None and module is head) or leaf in _HEAD_NAMES:
            cat = "embeddings_lm_head"
        elif parent_cat == "experts" and leaf in ("gate", "shared_expert_gate") and not _matches_experts(cname):
            cat = "router"
        else:
            cat = next((c for rx, c in _CLASS_RULES if rx.search(cname)), None)
            if cat == "mlp" and parent_cat == "experts":
                cat = "experts"  # shared experts are part of the MoE layer's cost
        if cat is not None:
            result[name] = cat
    return result


def _matches_experts(cname: str) -> bool:
    return _CLASS_RULES[1][0].search(cname) is not None


def _parent_category(classified: dict[str, str], name: str) -> str | None:
    """Category of the nearest classified ancestor (named_modules yields parents before children)."""
    while "." in name:
        name = name.rsplit(".", 1)[0]
        if name in classified:
            return classified[name]
    return None


def _tensors(obj: Any, torch: Any, depth: int = 0) -> Iterable[Any]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 3 and isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors(o, torch, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o, torch, depth + 1)


# -- LayerTimer -----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class LayerTimes:
    """Seconds by layer type and phase, accumulated since the last reset."""

    forward_s: dict[str, float]
    """Forward time per category (exclusive of nested classified modules)."""
    backward_s: dict[str, float]
    """Backward time per category, from the gradient reaching a module's outputs to it reaching its inputs."""
    recompute_s: dict[str, float]
    """Forward time re-spent inside backward by gradient checkpointing."""
    calls: dict[str, int]
    """Forward calls per category (recomputations not counted)."""

    def total_s(self) -> dict[str, float]:
        """All phases added, per category."""
        out: dict[str, float] = defaultdict(float)
        for d in (self.forward_s, self.backward_s, self.recompute_s):
            for k, v in d.items():
                out[k] += v
        return dict(out)

    def sum_s(self) -> float:
        """Everything attributed; never more than the wall time of the steps measured."""
        return sum(self.total_s().values())

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["total_s"] = self.total_s()
        return d


@dataclasses.dataclass(eq=False)
class _Frame:
    cat: str
    phase: str
    task: int = -1  # autograd graph task of a backward frame (end-of-backward cleanup closes only its own)
    pending: int = 0  # backward: input grads (or parameter grads) still to arrive before the module is done
    opened: bool = False
    closed: bool = False
    params: list[Any] = dataclasses.field(default_factory=list)  # anchors when no input requires grad


class LayerTimer:
    """Attach hooks to time every classified module; use as a context manager or call `remove()`.

    Backward boundaries come from tensor hooks rather than `register_full_backward_hook`: transformers calls
    attention with keyword arguments, which full backward hooks ignore (they would see no inputs and report
    zero). A module's backward opens when the gradient of its first output arrives. To know when it ends, the
    forward pre-hook hands the module a private alias (`view_as`, no copy) of each grad-requiring input,
    positional or keyword; the alias's gradient is complete exactly when this module's backward is, even when
    siblings (q/k/v projections, router and experts) share the input tensor. A module with no grad-requiring
    input (the first layer of a LoRA model, fed by a frozen embedding) ends when its trainable parameters'
    gradients have been accumulated. Any frame still open when backward ends is closed then.

    On CUDA each hook event calls `torch.cuda.synchronize()` (the only way to attribute asynchronous kernels to
    modules from the host); that serializes the stream, so time steps with and without the timer to report
    its overhead.
    """

    def __init__(self, model: Any, sync: bool | None = None, categories: dict[str, str] | None = None) -> None:
        import torch

        self._torch = torch
        self.model = model
        self.categories = classify(model) if categories is None else dict(categories)
        if sync is None:
            sync = any(p.is_cuda for p in model.parameters())
        self._sync: Callable[[], None] | None = torch.cuda.synchronize if sync else None
        self._handles: list[Any] = []
        self._stack: list[_Frame] = []
        self._last = 0.0
        self._open_fwd: dict[int, list[tuple[_Frame, _Frame | None]]] = defaultdict(list)
        self._param_waiters: dict[int, list[_Frame]] = defaultdict(list)
        self._module_params: dict[int, list[Any]] = {}
        self._queued_tasks: set[int] = set()
        self.reset()
        modules = dict(model.named_modules())
        hooked_params: set[int] = set()
        for name, cat in self.categories.items():
            m = modules[name]
            self._handles.append(m.register_forward_pre_hook(self._make_pre(cat), with_kwargs=True))
            self._handles.append(m.register_forward_hook(self._make_post(), with_kwargs=True, always_call=True))
            trainable = [p for p in m.parameters() if p.requires_grad]
            self._module_params[id(m)] = trainable
            for p in trainable:
                if id(p) not in hooked_params:
                    hooked_params.add(id(p))
                    self._handles.append(p.register_post_accumulate_grad_hook(self._param_done))

    # results ------------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Zero the totals (e.g. after warm-up steps)."""
        self._times: dict[str, dict[str, float]] = {ph: defaultdict(float) for ph in PHASES}
        self._calls: dict[str, int] = defaultdict(int)

    def result(self) -> LayerTimes:
        """A snapshot of the totals since the last reset."""
        return LayerTimes(
            forward_s=dict(self._times["forward"]), backward_s=dict(self._times["backward"]),
            recompute_s=dict(self._times["recompute"]), calls=dict(self._calls),
        )

    def remove(self) -> None:
        """Detach every hook; the model is left as it was."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._stack.clear()

    def __enter__(self) -> "LayerTimer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    # the clock ------------------------------------------------------------------------------------------------
    def _tick(self) -> None:
        """Charge the time since the previous event to the innermost open frame."""
        if self._sync is not None:
            self._sync()
        now = time.perf_counter()
        if self._stack:
            top = self._stack[-1]
            self._times[top.phase][top.cat] += now - self._last
        self._last = now

    def _push(self, frame: _Frame) -> None:
        self._tick()
        self._stack.append(frame)

    def _pop(self, frame: _Frame) -> None:
        if frame.closed:
            return
        self._tick()
        frame.closed = True
        for i in range(len(self._stack) - 1, -1, -1):  # usually the top; interleaved branches may differ
            if self._stack[i] is frame:
                del self._stack[i]
                break

    # forward hooks --------------------------------------------------------------------------------------------
    def _make_pre(self, cat: str) -> Callable[..., Any]:
        torch = self._torch

        def pre(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            in_backward = _graph_task_active(torch)
            if not in_backward and self._stack and any(f.phase == "backward" for f in self._stack):
                self._stack = [f for f in self._stack if f.phase != "backward"]  # left by a failed backward
            frame = _Frame(cat, "recompute" if in_backward else "forward")
            bw: _Frame | None = None
            replaced = None
            if torch.is_grad_enabled():
                bw = _Frame(cat, "backward")
                # The module gets its own alias (a free view) of each grad-requiring input: the alias's gradient
                # is complete exactly when this module's backward is, even if siblings share the input tensor.
                new_args = [self._alias(a, bw) for a in args]
                new_kwargs = {k: self._alias(v, bw) for k, v in kwargs.items()}
                if bw.pending:
                    replaced = (tuple(new_args), new_kwargs)
                else:
                    bw.params = self._module_params.get(id(module), [])
            if not in_backward:
                self._calls[cat] += 1
            self._open_fwd[id(module)].append((frame, bw))
            self._push(frame)
            return replaced

        return pre

    def _alias(self, x: Any, bw: _Frame) -> Any:
        if not (isinstance(x, self._torch.Tensor) and x.requires_grad):
            return x
        alias = x.view_as(x)
        alias.register_hook(lambda g: self._input_grad(bw))
        bw.pending += 1
        return alias

    def _make_post(self) -> Callable[..., None]:
        torch = self._torch

        def post(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            opened = self._open_fwd.get(id(module))
            if not opened:
                return
            frame, bw = opened.pop()
            self._pop(frame)
            if bw is None:
                return
            for t in _tensors(output, torch):
                if not t.requires_grad:
                    continue
                # Nested modules can return the very same tensor (PEFT ParamWrapper -> experts). One hook per
                # tensor opens its frames outermost first, so the innermost ends up on top of the stack.
                waiting = getattr(t, "_ftscope_bw", None)
                if waiting is None:
                    waiting = []
                    t._ftscope_bw = waiting
                    t.register_hook(lambda g, w=waiting: self._output_grad(w))
                waiting.append(bw)

        return post

    # backward events ------------------------------------------------------------------------------------------
    def _output_grad(self, waiting: list[_Frame]) -> None:
        for bw in reversed(waiting):  # registered inner-first; push outer-first
            self._open_backward(bw)

    def _open_backward(self, bw: _Frame) -> None:
        if bw.opened:
            return
        bw.opened = True
        bw.task = self._torch._C._current_graph_task_id()
        if bw.pending == 0 and bw.params:
            bw.pending = len(bw.params)
            for p in bw.params:
                self._param_waiters[id(p)].append(bw)
        self._push(bw)
        if bw.task not in self._queued_tasks:
            self._queued_tasks.add(bw.task)
            task = bw.task
            self._torch.autograd.Variable._execution_engine.queue_callback(lambda: self._end_backward(task))
        if bw.pending == 0:  # nothing to wait for: the module's backward cannot be bounded
            self._pop(bw)

    def _input_grad(self, bw: _Frame) -> None:
        bw.pending -= 1
        if bw.opened and bw.pending <= 0:
            self._pop(bw)

    def _param_done(self, p: Any) -> None:
        for bw in self._param_waiters.pop(id(p), ()):
            bw.pending -= 1
            if bw.opened and bw.pending <= 0:
                self._pop(bw)

    def _end_backward(self, task: int) -> None:
        self._queued_tasks.discard(task)
        for f in [f for f in self._stack if f.phase == "backward" and f.task == task]:
            self._pop(f)
        self._tick()
        # Only this task's waiters: a reentrant-checkpoint backward nested inside the outer one ends first.
        for pid in list(self._param_waiters):
            left = [f for f in self._param_waiters[pid] if f.task != task]
            if left:
                self._param_waiters[pid] = left
            else:
                del self._param_waiters[pid]


# -- ExpertLoad -----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ExpertImbalance:
    """How unevenly tokens spread over experts, per MoE layer."""

    max_over_mean: list[float]
    """Busiest expert's tokens / mean tokens per expert (1.0 = perfectly even; top-k of E: at most E/k)."""
    cv: list[float]
    """Coefficient of variation: population standard deviation (divide by E, not E-1: the experts are the
    whole population, not a sample) / mean."""
    mean_max_over_mean: float
    """max_over_mean averaged over layers."""
    mean_cv: float
    """cv averaged over layers."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def imbalance_of(counts: list[list[int]]) -> ExpertImbalance:
    """Imbalance of a [layers][experts] count matrix (layers with no tokens score 0)."""
    mom, cvs = [], []
    for row in counts:
        n = len(row)
        mean = sum(row) / n if n else 0.0
        if mean == 0:
            mom.append(0.0)
            cvs.append(0.0)
            continue
        var = sum((c - mean) ** 2 for c in row) / n  # population variance: all experts, not a sample
        mom.append(max(row) / mean)
        cvs.append(var**0.5 / mean)
    return ExpertImbalance(
        max_over_mean=mom, cv=cvs,
        mean_max_over_mean=sum(mom) / len(mom) if mom else 0.0, mean_cv=sum(cvs) / len(cvs) if cvs else 0.0,
    )


def _topk_position(module: Any) -> tuple[int, str] | None:
    """(positional index, keyword) of the routed top-k index argument of an experts module's forward, if any."""
    try:
        params = list(inspect.signature(type(module).forward).parameters)  # follows functools.wraps
    except (TypeError, ValueError):
        return None
    for kw in ("top_k_index", "router_indices", "selected_experts", "topk_indices"):
        if kw in params:
            return params.index(kw) - 1, kw  # minus self
    return None


class ExpertLoad:
    """Count tokens routed to each expert in each MoE layer while the model runs forward.

    Hooks the experts module (transformers 5: `*Experts.forward(hidden_states, top_k_index, top_k_weights)`,
    called by the MoE block with the router's top-k indices) with a forward pre-hook. Forward passes re-run
    inside backward by gradient checkpointing are skipped, so each token counts once per step. Padding tokens
    are routed like any other token and are counted. Indices equal to the expert count (a 'dropped' sentinel
    some implementations use) are kept apart in `dropped`.
    """

    def __init__(self, model: Any) -> None:
        import torch

        self._torch = torch
        self.layers: list[str] = []
        """Qualified names of the hooked experts modules, in layer order (rows of `counts`)."""
        self.num_experts: list[int] = []
        self.top_k: int | None = None
        self._counts: Any = None  # [layers, max_experts + 1] int64 on the model's device; last column: dropped
        self._tokens: list[int] = []
        self._handles: list[Any] = []
        for name, m in model.named_modules():
            pos = _topk_position(m)
            n = getattr(m, "num_experts", None)
            if not isinstance(n, int):  # fall back to the config the module was built from
                cfg = getattr(m, "config", None)
                n = next((getattr(cfg, a) for a in ("num_local_experts", "num_experts", "n_routed_experts")
                          if isinstance(getattr(cfg, a, None), int)), None)
            if pos is None or not isinstance(n, int):
                continue
            row = len(self.layers)
            self.layers.append(name)
            self.num_experts.append(n)
            self._tokens.append(0)
            self._handles.append(m.register_forward_pre_hook(self._make_hook(row, n, *pos), with_kwargs=True))

    @property
    def is_moe(self) -> bool:
        return bool(self.layers)

    def _make_hook(self, row: int, n: int, pos: int, kw: str) -> Callable[..., None]:
        torch = self._torch

        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if _graph_task_active(torch):
                return  # gradient-checkpointing recompute: already counted in the real forward
            idx = kwargs.get(kw) if kw in kwargs else (args[pos] if len(args) > pos else None)
            if idx is None:
                return
            with torch.no_grad():
                flat = idx.reshape(-1).long().clamp(0, n)  # n = the dropped sentinel column
                if self._counts is None or self._counts.device != flat.device:
                    self._counts = torch.zeros(len(self.layers), max(self.num_experts) + 1, dtype=torch.long,
                                               device=flat.device)
                # Sentinel values go to column n of this row, then are moved to the last column on read.
                self._counts[row].index_add_(0, flat, torch.ones_like(flat))
            self._tokens[row] += int(idx.shape[0]) if idx.dim() > 1 else int(idx.numel())
            self.top_k = int(idx.shape[-1]) if idx.dim() > 1 else 1

        return hook

    def reset(self) -> None:
        self._counts = None
        self._tokens = [0] * len(self.layers)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> "ExpertLoad":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def counts(self) -> list[list[int]]:
        """[layers][experts] tokens routed (one host sync). Each row sums to tokens x top_k (minus dropped)."""
        if self._counts is None:
            return [[0] * n for n in self.num_experts]
        rows = self._counts.cpu().tolist()
        return [r[:n] for r, n in zip(rows, self.num_experts)]

    def dropped(self) -> list[int]:
        """Per layer, routing slots that pointed at the 'no expert' sentinel."""
        if self._counts is None:
            return [0] * len(self.layers)
        rows = self._counts.cpu().tolist()
        return [r[n] for r, n in zip(rows, self.num_experts)]

    def tokens(self) -> list[int]:
        """Tokens that reached each MoE layer."""
        return list(self._tokens)

    def imbalance(self) -> ExpertImbalance:
        """max/mean and population coefficient of variation of the per-expert counts, per layer."""
        return imbalance_of(self.counts())

    def to_dict(self) -> dict[str, Any]:
        return {
            "layers": self.layers, "num_experts": self.num_experts, "top_k": self.top_k, "tokens": self.tokens(),
            "counts": self.counts(), "dropped": self.dropped(), "imbalance": self.imbalance().to_dict(),
        }


# -- UtilizationSampler ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class UtilizationSummary:
    """GPU utilization over a sampled window (percentages 0-100)."""

    available: bool
    """False on CPU, without nvidia-ml-py, or when NVML cannot start; see `reason`."""
    reason: str | None
    """Why nothing was sampled, when nothing was."""
    source: str | None
    """'gpm' (Hopper+ GPU performance monitoring: true SM activity and DRAM bandwidth) or 'utilization_rates'
    (nvmlDeviceGetUtilizationRates: share of time any kernel ran, and share of time memory was read/written)."""
    samples: int
    """Number of samples taken."""
    sm_mean: float | None
    """Mean SM utilization (GPM SM_UTIL, else NVML 'gpu' kernel-active time)."""
    sm_max: float | None
    mem_bw_mean: float | None
    """Mean memory-bandwidth utilization (GPM DRAM_BW_UTIL, else NVML 'memory' read/write-active time)."""
    mem_bw_max: float | None
    device_mem_used_peak_bytes: int | None
    """Highest device memory in use seen by NVML (all processes, includes the CUDA context)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class UtilizationSampler:
    """Poll NVML from a daemon thread every `interval_s` while a block runs (`with sampler: ...`).

    `device_index` is the CUDA ordinal as torch sees it; it is mapped to the NVML device by UUID so
    CUDA_VISIBLE_DEVICES renumbering does not pick the wrong GPU. Anything NVML-related failing turns the
    sampler into a recorded no-op; it never breaks the run it observes."""

    def __init__(self, device_index: int | None = None, interval_s: float = 0.1) -> None:
        self.device_index = device_index
        self.interval_s = max(0.1, interval_s)  # GPM needs >= 100 ms between samples
        self.samples: list[tuple[float, float, float, int]] = []
        """(perf_counter time, SM %, memory-bandwidth %, device memory used bytes)."""
        self.available = False
        self.reason: str | None = None
        self.source: str | None = None
        self._nv: Any = None
        self._handle: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _open(self) -> bool:
        try:
            import torch

            if not torch.cuda.is_available():
                self.reason = "no CUDA device"
                return False
        except ImportError:
            self.reason = "torch not installed"
            return False
        try:
            import pynvml  # provided by nvidia-ml-py
        except ImportError:
            self.reason = "nvidia-ml-py not installed (pip install nvidia-ml-py)"
            return False
        try:
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, NoPermission, ...
            self.reason = f"NVML unavailable: {e}"
            return False
        self._nv = pynvml
        try:
            idx = torch.cuda.current_device() if self.device_index is None else self.device_index
            try:
                uuid = str(torch.cuda.get_device_properties(idx).uuid)
                self._handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else
                                                                 "GPU-" + uuid)
            except Exception:
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(idx)
            self.source = "gpm" if self._gpm_supported() else "utilization_rates"
        except Exception as e:
            self.reason = f"NVML device lookup failed: {e}"
            pynvml.nvmlShutdown()
            self._nv = None
            return False
        self.available = True
        return True

    def _gpm_supported(self) -> bool:
        nv = self._nv
        if not all(hasattr(nv, a) for a in ("nvmlGpmQueryDeviceSupport", "NVML_GPM_METRIC_SM_UTIL",
                                            "NVML_GPM_METRIC_DRAM_BW_UTIL")):
            return False
        try:
            return bool(nv.nvmlGpmQueryDeviceSupport(self._handle).isSupportedDevice)
        except Exception:
            return False

    def _run(self) -> None:
        nv, h = self._nv, self._handle
        prev = cur = None
        try:
            if self.source == "gpm":
                prev, cur = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
                nv.nvmlGpmSampleGet(h, prev)
            while not self._stop.wait(self.interval_s):
                used = int(nv.nvmlDeviceGetMemoryInfo(h).used)
                if self.source == "gpm":
                    nv.nvmlGpmSampleGet(h, cur)
                    sm, bw = self._gpm_metrics(prev, cur)
                    prev, cur = cur, prev
                else:
                    u = nv.nvmlDeviceGetUtilizationRates(h)
                    sm, bw = float(u.gpu), float(u.memory)
                self.samples.append((time.perf_counter(), sm, bw, used))
        except Exception as e:  # a sampler must never take the measured run down
            self.reason = f"sampling stopped: {e}"
        finally:
            for s in (prev, cur):
                if s is not None:
                    try:
                        nv.nvmlGpmSampleFree(s)
                    except Exception:
                        pass

    def _gpm_metrics(self, s1: Any, s2: Any) -> tuple[float, float]:
        nv = self._nv
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = 2
        req.sample1, req.sample2 = s1, s2
        req.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
        req.metrics[1].metricId = nv.NVML_GPM_METRIC_DRAM_BW_UTIL
        nv.nvmlGpmMetricsGet(req)
        return float(req.metrics[0].value), float(req.metrics[1].value)

    def start(self) -> "UtilizationSampler":
        if self._open():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="ftscope-nvml", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> UtilizationSummary:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except Exception:
                pass
            self._nv = None
        return self.summary()

    def __enter__(self) -> "UtilizationSampler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def summary(self) -> UtilizationSummary:
        s = self.samples
        if not s:
            return UtilizationSummary(
                available=self.available, reason=self.reason or ("no samples (window shorter than the interval)"
                                                                  if self.available else None),
                source=self.source, samples=0, sm_mean=None, sm_max=None, mem_bw_mean=None, mem_bw_max=None,
                device_mem_used_peak_bytes=None,
            )
        sm = [x[1] for x in s]
        bw = [x[2] for x in s]
        return UtilizationSummary(
            available=True, reason=self.reason, source=self.source, samples=len(s),
            sm_mean=sum(sm) / len(sm), sm_max=max(sm), mem_bw_mean=sum(bw) / len(bw), mem_bw_max=max(bw),
            device_mem_used_peak_bytes=max(x[3] for x in s),
        )
