"""Which layer type (attention, mlp, experts, router, lora, lm_head, other) each traced op belongs to: module
hooks keep a stack of the modules running, in forward and in the backward / recompute that follows."""
from __future__ import annotations

from typing import Any


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


class LayerContext:
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

    def __enter__(self) -> "LayerContext":
        import torch

        self._handles = [torch.nn.modules.module.register_module_forward_pre_hook(self._pre),
                         torch.nn.modules.module.register_module_forward_hook(self._post, always_call=True)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


class GlobalOnly:
    """Stands in for FlopCounterMode's ModuleTracker: FLOPs are attributed by LayerContext instead, and the
    tracker's multi-grad hooks form reference cycles with autograd nodes that keep saved tensors alive past
    backward until Python's cycle collector runs (an artifact of the tooling that a plain training step lacks)."""

    parents = frozenset({"Global"})

    def __enter__(self) -> "GlobalOnly":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def make_tagger(layers: LayerContext) -> Any:
    import torch
    from torch.overrides import TorchFunctionMode

    class Tagger(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if torch.is_grad_enabled():
                layers.tag(out)
            return out

    return Tagger()
