"""A report section: a title, a paragraph and its charts (what html.render writes and every chart source makes)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Section:
    title: str
    text: str
    """One paragraph under the title."""
    figures: list[tuple[str, Any]] = field(default_factory=list)
    """(file stem, matplotlib figure)."""
