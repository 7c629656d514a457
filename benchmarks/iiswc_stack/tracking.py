"""Who holds which tensor between forward and backward: ftscope's CPU tensor tracker, plus labels and holders.

Runs in either venv (the study's 2024 stack or the worktree's): ftscope's `measure/memory.py` imports only the
standard library at module level, so it is loaded by file path, without the ftscope package (whose import needs
the worktree's dependencies).

`LabelledTracker` is ftscope's `TensorTracker` (live bytes of every storage created by an aten op, freed through a
weakref) that also remembers, for each storage it sees created, the aten op, dtype, shape and the innermost module
that was running. `ctx_held_storages` walks the autograd graph from the loss and finds the tensors that custom
autograd Functions keep as plain attributes of their ctx (`ctx.tensors = (A, B)`): saved-tensor hooks, and so
non-reentrant checkpointing, never see those.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _load_ftscope_memory() -> Any:
    name = "ftscope_measure_memory_standalone"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "src" / "ftscope" / "measure" / "memory.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


memory = _load_ftscope_memory()


@dataclass(frozen=True)
class Label:
    """Where a storage came from."""

    op: str
    """aten overload that created it (e.g. 'aten.mul.Tensor')."""
    module: str
    """qualified name of the innermost running module, digits replaced by '*' (layers.*.block_sparse_moe...)."""
    dtype: str
    shape: tuple[int, ...]


_DIGITS = re.compile(r"\.\d+(?=\.|$)")


def _generic(name: str) -> str:
    return _DIGITS.sub(".*", name)


class LabelledTracker(memory.TensorTracker):
    """ftscope's TensorTracker that labels every storage created while it is active."""

    def __init__(self, model: Any, *seed: Any) -> None:
        super().__init__(model, *seed)
        self.labels: dict[int, Label] = {}
        self._op = "?"
        self._stack: list[str] = ["<outside modules>"]
        self._handles = []
        for name, mod in model.named_modules():
            self._handles.append(mod.register_forward_pre_hook(self._push(name or "<root>")))
            self._handles.append(mod.register_forward_hook(self._pop))

    def _push(self, name: str) -> Any:
        def hook(module: Any, args: Any) -> None:
            self._stack.append(name)
        return hook

    def _pop(self, module: Any, args: Any, out: Any) -> None:
        if len(self._stack) > 1:
            self._stack.pop()

    def _commit(self, st: Any, key: int, delta: int) -> None:
        if key not in self._storages and self._mode is not None:
            self.labels[key] = (self._op, self._stack[-1])
        super()._commit(st, key, delta)

    def _after_op(self, out: Any) -> None:
        super()._after_op(out)
        for t in memory._flat_tensors(out, self._tensor_type):  # give the new storages their dtype and shape
            if t.is_meta:
                continue
            try:
                key = t.untyped_storage()._cdata
            except (RuntimeError, NotImplementedError):
                continue
            raw = self.labels.get(key)
            if isinstance(raw, tuple):
                self.labels[key] = Label(raw[0], raw[1], str(t.dtype).replace("torch.", ""), tuple(t.shape))

    def __enter__(self) -> "LabelledTracker":
        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                tracker._op = str(func)
                out = func(*args, **(kwargs or {}))
                tracker._after_op(out)
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def live_created(self) -> dict[int, tuple[int, Label]]:
        """storage key -> (bytes, label) of every live storage created while tracking."""
        out = {}
        for key, (ref, nbytes) in self._storages.items():
            lab = self.labels.get(key)
            if ref() is not None and isinstance(lab, Label):
                out[key] = (nbytes, lab)
        return out


def ctx_held_storages(loss: Any) -> dict[int, str]:
    """storage key -> '<Function>.<attr>' for tensors kept as plain ctx attributes by custom autograd Functions
    reachable from `loss` (what saved-tensor hooks, and non-reentrant checkpointing, cannot drop)."""
    import torch

    held: dict[int, str] = {}
    seen: set[int] = set()
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        attrs = getattr(node, "__dict__", None) or {}
        for attr, val in attrs.items():
            for t in val if isinstance(val, (tuple, list)) else (val,):
                if isinstance(t, torch.Tensor) and not t.is_meta:
                    held.setdefault(t.untyped_storage()._cdata, f"{type(node).__name__}.{attr}")
        stack.extend(fn for fn, _ in getattr(node, "next_functions", ()) if fn is not None)
    return held


_LAYER = re.compile(r"layers\.(\d+)")


def breakdown(live: dict[int, tuple[int, Label]], held: dict[int, str], tokens: int) -> list[dict[str, Any]]:
    """Live storages grouped by (holder, creating module, op, dtype, last dim): bytes per token, per layer."""
    groups: dict[tuple, dict[str, Any]] = {}
    for key, (nbytes, lab) in live.items():
        module = _generic(lab.module).replace("base_model.model.", "")
        gkey = (held.get(key, "graph/other"), module, lab.op, lab.dtype, lab.shape[-1] if lab.shape else 0)
        g = groups.setdefault(gkey, {"holder": gkey[0], "module": module, "op": lab.op, "dtype": lab.dtype,
                                     "last_dim": gkey[4], "bytes": 0, "storages": 0, "layers": set()})
        g["bytes"] += nbytes
        g["storages"] += 1
        m = _LAYER.search(lab.module)
        if m:
            g["layers"].add(int(m.group(1)))
    out = []
    for g in sorted(groups.values(), key=lambda g: -g["bytes"]):
        layers = sorted(g.pop("layers"))
        g["layers"] = layers
        g["bytes_per_token"] = round(g["bytes"] / tokens, 1)
        g["bytes_per_token_per_layer"] = round(g["bytes"] / tokens / max(len(layers), 1), 1)
        out.append(g)
    return out
