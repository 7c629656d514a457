"""Measurements of the real implementation: models built with transformers/PEFT/bitsandbytes, fake-tensor traces.

Everything here needs the `measure` extra (torch, transformers, peft, bitsandbytes). Nothing is imported at
package import time, so `ftscope plan` and `ftscope estimate` keep starting fast on machines without torch;
each module calls `require_torch()` first and a missing extra becomes one clear FtscopeError.

    ftscope.measure.runtime.build.build_model(scn, device="meta")  -> (model, BuildInfo)
    ftscope.measure.trace.tracer.trace(scn, batch=None, seq=None)  -> TraceResult  (exact tensor bytes and FLOPs)
"""
from __future__ import annotations

import importlib.util

from ..errors import FtscopeError, install_hint

_NEEDED = ("torch", "transformers", "peft")


def require_torch(extra: tuple[str, ...] = ()) -> None:
    """Raise FtscopeError naming the missing packages when the `measure` extra is not installed.

    Also puts the Hugging Face libraries in offline mode before any of them is imported: ftscope reads local
    files only, and bitsandbytes' CPU backend otherwise tries to fetch a kernel from the Hub at import."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    missing = [name for name in (*_NEEDED, *extra) if importlib.util.find_spec(name) is None]
    if missing:
        raise FtscopeError(
            f"this needs {', '.join(missing)}, from ftscope's measure extra: {install_hint('measure')}"
        )


__all__ = ["require_torch"]
