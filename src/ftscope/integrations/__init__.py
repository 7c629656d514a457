"""Callbacks that measure the user's own training run and check ftscope's estimate against it.

    from ftscope.integrations import FtscopeCallback            # transformers Trainer (the `measure` extra)
    from ftscope.integrations import FtscopeLightningCallback   # Lightning (the `lightning` extra)

Nothing heavy is imported here: each callback's module imports its framework when the callback is first named.
"""
from __future__ import annotations

from typing import Any

__all__ = ["FtscopeCallback", "FtscopeLightningCallback"]


def __getattr__(name: str) -> Any:
    if name == "FtscopeCallback":
        from .trainer_callback import FtscopeCallback
        return FtscopeCallback
    if name == "FtscopeLightningCallback":
        from .lightning_callback import FtscopeLightningCallback
        return FtscopeLightningCallback
    raise AttributeError(f"module 'ftscope.integrations' has no attribute {name!r}")
