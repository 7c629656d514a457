"""The commented scenario template `ftscope init` writes, and the README's table of defaults.

Both are generated from the typed input dataclasses (ScenarioInput, Hardware, Mix, Workload, Price): their
fields, their values after the framework recipe's defaults, their `Literal` choices and the docstring under
each field (read from the source with `ast`: Python keeps no runtime trace of an attribute's docstring). A key
added to a dataclass appears in both without an edit here.
"""
from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from dataclasses import asdict, fields, is_dataclass
from typing import Any

from .hardware import Hardware
from .mix import Mix
from .quick import QuickFlags
from .scenario import Price, ScenarioInput, _prepare, apply_overrides
from .schema import choices, validate
from .workload import DEFAULT_NUM_SAMPLES, DatasetStats, Workload

SECTIONS = {"hardware": Hardware, "mix": Mix, "workload": Workload, "price": Price}
TOP_KEYS = ("model", "framework", "name", "description")
EXAMPLE_MODEL = "llama-3.1-8b"
"""The model a template names when --model is not given (a preset: the template loads as written)."""
EXAMPLE_SEQ = 2048
"""seq_len a template sets when --seq is not given: a scenario needs seq_len or dataset statistics."""
DEFAULT_KEYS = ("framework", "hardware.gpu", "hardware.gpus_per_node", "mix.method", "mix.lora_rank",
                "mix.lora_targets", "mix.gradient_checkpointing", "mix.attention", "mix.zero_stage", "mix.precision",
                "mix.optimizer", "mix.loss", "workload.micro_batch_size", "workload.padding",
                "workload.gradient_accumulation", "workload.epochs", "workload.num_samples")
"""The defaults the README lists: the keys whose default decides what a minimal scenario runs."""
WIDTH = 110


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """{field name: the docstring under it} of a dataclass, from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr) \
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            out[node.target.id] = " ".join(after.value.value.split())
    return out


def _resolved(flags: QuickFlags) -> ScenarioInput:
    """The scenario input the flags describe, with every default filled in (the recipe's included)."""
    raw = apply_overrides({}, flags.overrides())
    raw.setdefault("model", EXAMPLE_MODEL)
    if flags.seq is None:
        raw.setdefault("workload", {})["seq_len"] = EXAMPLE_SEQ
    prepared, recipe = _prepare(raw)
    given = validate(ScenarioInput, prepared)
    return given if given.framework else _with_framework(given, recipe.name)


def _with_framework(given: ScenarioInput, name: str) -> ScenarioInput:
    from dataclasses import replace
    return replace(given, framework=name)


def _plain(value: Any) -> Any:
    if is_dataclass(value):
        return {k: v for k, v in asdict(value).items() if v is not None}
    return list(value) if isinstance(value, tuple) else value


def _yaml_value(value: Any) -> str:
    import yaml
    text = yaml.safe_dump(_plain(value), default_flow_style=True, width=10_000).strip()
    return text[:-4].strip() if text.endswith("\n...") or text.endswith(" ...") else text.removesuffix("...").strip()


def _comment(cls: type, name: str, indent: str) -> list[str]:
    doc = field_docs(cls).get(name, "")
    allowed = [str(c) for c in choices(cls, name)]
    if allowed and not all(c in doc for c in allowed):
        doc = f"{doc} Choices: {' | '.join(allowed)}.".strip()
    return textwrap.wrap(doc, WIDTH - len(indent) - 2, initial_indent=f"{indent}# ", subsequent_indent=f"{indent}# ")


def scenario_template(flags: QuickFlags = QuickFlags()) -> str:
    """A scenario YAML listing every key with its value, unit and meaning, as comments."""
    given = _resolved(flags)
    lines = ["# ftscope scenario: every key with its value (the default unless a flag set it), its unit and meaning.",
             "# Use: ftscope estimate THIS.yaml [key.path=value ...]; delete what you do not change.", ""]
    for key in TOP_KEYS:
        lines += _comment(ScenarioInput, key, "") + [f"{key}: {_yaml_value(getattr(given, key))}"]
    for section, cls in SECTIONS.items():
        lines += ["", f"{section}:"]
        values = getattr(given, section)
        for f in fields(cls):
            lines += _comment(cls, f.name, "  ") + [f"  {f.name}: {_yaml_value(getattr(values, f.name))}"]
            if cls is Workload and f.name == "dataset":
                docs = field_docs(DatasetStats)
                keys = ", ".join(d.name + (f" ({docs[d.name].rstrip('.')})" if d.name in docs else "")
                                 for d in fields(DatasetStats))
                lines += textwrap.wrap(f"a mapping of: {keys}", WIDTH - 4, initial_indent="  # ",
                                       subsequent_indent="  #   ")
    return "\n".join(lines) + "\n"


def defaults() -> dict[str, Any]:
    """{'mix.method': 'lora', ...}: what a minimal scenario (model and seq_len only) runs with."""
    given = _resolved(QuickFlags())
    out: dict[str, Any] = {}
    for key in DEFAULT_KEYS:
        node: Any = given
        for part in key.split("."):
            node = getattr(node, part)
        out[key] = node
    return out


def defaults_markdown() -> str:
    """The README's table of defaults (tests/spec/test_template.py checks the README holds exactly this)."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for key, value in defaults().items():
        section, _, name = key.rpartition(".")
        cls = SECTIONS.get(section, ScenarioInput)
        shown = f"`null` ({DEFAULT_NUM_SAMPLES:,})" if key == "workload.num_samples" and value is None \
            else f"`{_yaml_value(value)}`"
        meaning = field_docs(cls).get(name, "").split(". ")[0].rstrip(".").replace("|", "/")
        rows.append(f"| `{key}` | {shown} | {meaning} |")
    return "\n".join(rows) + "\n"
