"""Time by layer type of a live model, through module hooks (tokens per expert: expert_load.py; GPU
utilization: utilization.py).

- `LayerTimer`: forward / backward (/ recompute) wall time per layer type, through module hooks. Time is
  *exclusive*: every instant between two hook events is charged to the innermost classified module open at
  that instant, so nested modules (LoRA adapters inside attention, the router inside the MoE block) are never
  counted twice, and the categories sum to at most the step time (the rest is unclassified glue: residual
  adds, rotary embeddings, the loss, the optimizer).

torch is imported inside the functions that need it, never at module import.
"""
from __future__ import annotations

import dataclasses
import re
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
