"""Typed input fields and the one place a value that does not fit becomes a one-line error.

Inputs are plain frozen dataclasses whose field types say what is allowed, the way litgpt's `Config` does:
`Literal[...]` lists the values, `Int(1, 4096)` a range, `Number(gt=0)` a finite positive float. pydantic
(v2) checks a mapping against those types (`validate`), so the types are the single source for the checks,
for `choices()` (what `plan`/`recommend` search and `--help` lists) and for the JSON Schema editors read.

YAML is loose where a scenario must not be: `true` is not 1, `"yes"` is not a boolean, 4.5 is not a batch size
(4.0 is), `.nan` is not a number. The types below are strict in those ways.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Annotated, Any, Literal, TypeVar, Union

from ..errors import FtscopeError, did_you_mean

T = TypeVar("T")


def _integral(value: Any) -> Any:
    """Integers stay; integral floats (4.0) become ints; booleans are refused (YAML's true is not 1)."""
    if isinstance(value, bool):
        raise ValueError("booleans are not numbers")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("booleans are not numbers")
    return value


def Int(ge: int | None = None, le: int | None = None, **field: Any) -> Any:  # noqa: N802 - reads as a type
    """An integer in [ge, le] (4.0 accepted, true and "4" refused)."""
    from pydantic import BeforeValidator, Field, Strict
    # constraints before the validator: they stay in the int schema (and in the JSON Schema as minimum/maximum)
    return Annotated[int, Strict(), Field(ge=ge, le=le, **field), BeforeValidator(_integral)]


def Number(gt: float | None = None, ge: float | None = None, lt: float | None = None, le: float | None = None,  # noqa: N802
           **field: Any) -> Any:
    """A finite real number in the range (ints accepted, booleans, strings, NaN and inf refused)."""
    from pydantic import BeforeValidator, Field, Strict
    return Annotated[float, Strict(), Field(gt=gt, ge=ge, lt=lt, le=le, allow_inf_nan=False, **field),
                     BeforeValidator(_not_bool)]


def Choice(*values: Any) -> Any:  # noqa: N802
    """One of `values` (an int choice refuses true/false, which YAML would otherwise read as 1/0)."""
    from pydantic import BeforeValidator
    return Annotated[Literal[values], BeforeValidator(_not_bool)]  # type: ignore[valid-type]


def Flag() -> Any:  # noqa: N802
    """true or false, and nothing YAML or pydantic would coerce ("yes", 1)."""
    from pydantic import Strict
    return Annotated[bool, Strict()]


def Text(**field: Any) -> Any:  # noqa: N802
    """A string (numbers and mappings refused: a mapping's str() is not a name)."""
    from pydantic import Field, Strict
    return Annotated[str, Strict(), Field(**field)]


def forbid_extra(cls: type[T]) -> type[T]:
    """Class decorator: unknown keys are errors (with the nearest valid key), not silently dropped."""
    from pydantic import ConfigDict
    cls.__pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[attr-defined]
    return cls


@functools.lru_cache(maxsize=None)
def _adapter(tp: Any) -> Any:
    from pydantic import TypeAdapter
    return TypeAdapter(tp)


def validate(tp: type[T], data: Any, where: str = "", source: str = "", names: dict[str, str] | None = None) -> T:
    """`data` checked and converted to `tp`; the first problem is one FtscopeError naming its key path.

    `where` prefixes the key path ("mix" -> "mix.lora_rank"); `source` names the file ("config.json at x: ...");
    `names` shows a top-level field by the key the user wrote (an alias such as n_embd for hidden_size)."""
    from pydantic import ValidationError
    try:
        return _adapter(tp).validate_python(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        message = explain(tp, errors, where, names or {})
        error = FtscopeError(f"{source}: {message}" if source else message)
        if not source:  # a scenario key: what `ftscope serve` shows the message beside
            picked = _pick(tp, errors)
            shown = _walk(tp, tuple(picked["loc"]))[0]
            if picked["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
                shown = shown[:-1]  # a key that is not a field: its section is where to say so
            key = ".".join([where, *shown] if where else shown).replace(".[", "[")
            error.field = key or None  # type: ignore[attr-defined]
        raise error from None


def json_schema(tp: Any) -> dict[str, Any]:
    """The JSON Schema of an input type (editors use it for completion and checking)."""
    return _adapter(tp).json_schema()


def choices(cls: type, name: str) -> tuple[Any, ...]:
    """The values a Literal field allows, in declaration order (None left out): choices(Mix, "attention")."""
    tp = _hints(cls)[name]
    out: list[Any] = []
    for arm in _arms(tp):
        if typing.get_origin(arm) is Literal:
            out.extend(typing.get_args(arm))
    return tuple(out)


# ---- introspection -------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _strip(tp: Any) -> tuple[Any, list[Any]]:
    """(type without Annotated, its metadata items, FieldInfo contents flattened)."""
    meta: list[Any] = []
    while typing.get_origin(tp) is Annotated:
        for m in tp.__metadata__:
            meta.append(m)
            meta.extend(getattr(m, "metadata", None) or [])
        tp = tp.__origin__
    return tp, meta


def _arms(tp: Any) -> list[Any]:
    base, _ = _strip(tp)
    if typing.get_origin(base) in (Union, types.UnionType):
        return [a for arm in typing.get_args(base) for a in _arms(arm)]
    return [base]


def _fields(tp: Any) -> dict[str, Any] | None:
    """Field name -> annotation for a dataclass (or one in a union), else None."""
    for arm in _arms(tp):
        if dataclasses.is_dataclass(arm):
            return dict(_hints(arm))
    return None


def _element(tp: Any, key: Any) -> Any | None:
    """The annotation of item `key` of a list/tuple/dict annotation."""
    for arm in _arms(tp):
        origin, args = typing.get_origin(arm), typing.get_args(arm)
        if origin in (list, tuple) and isinstance(key, int) and args:
            return args[0]
        if origin is dict and len(args) == 2:
            return args[1]
    return None


def _walk(tp: Any, loc: tuple[Any, ...]) -> tuple[list[str], Any, int]:
    """(shown key path, annotation at its end, index of the first union tag in `loc`) for an error location.

    pydantic puts union-member tags ("InlineGpu", "function-after[...]", "literal['max']") in locations; they
    are not keys, so they are skipped (a tag naming a dataclass arm selects that arm)."""
    shown: list[str] = []
    first_tag = len(loc)
    cur = tp
    for i, part in enumerate(loc):
        arm = _tagged_arm(cur, part)
        if arm is not None or (isinstance(part, str) and _is_tag(part)):
            first_tag = min(first_tag, i)
            cur = arm if arm is not None else cur
            continue
        fields = _fields(cur)
        if fields is not None and part in fields:
            cur = fields[part]
        elif fields is not None:
            return [*shown, str(part)], None, first_tag  # an unknown key of this dataclass
        elif (elem := _element(cur, part)) is not None:
            cur = elem
        shown.append(f"[{part}]" if isinstance(part, int) else str(part))
    return shown, cur, first_tag


def _tagged_arm(tp: Any, part: Any) -> Any | None:
    arms = _arms(tp)
    if len(arms) < 2:
        return None
    return next((a for a in arms if getattr(a, "__name__", None) == part and dataclasses.is_dataclass(a)), None)


def _is_tag(part: str) -> bool:
    return ("[" in part or "(" in part or part.startswith("constrained-")
            or part in ("int", "float", "str", "bool", "none", "tuple", "list", "dict"))


def _pick(tp: Any, errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The error to report: among the union arms of the first error's key, the one that got furthest."""
    first = tuple(errors[0]["loc"])
    prefix = first[:_walk(tp, first)[2]]
    same = [e for e in errors if tuple(e["loc"])[:len(prefix)] == prefix]
    return max(same, key=lambda e: len(e["loc"]))


def _bounds(meta: list[Any], integer: bool) -> str:
    def first(attr: str) -> Any:
        return next((getattr(m, attr) for m in meta if getattr(m, attr, None) is not None), None)

    def fmt(v: float) -> str:
        return f"{int(v):,}" if integer or (float(v).is_integer() and abs(v) < 1e15) else f"{v:g}"

    ge, gt, le, lt = first("ge"), first("gt"), first("le"), first("lt")
    if ge is not None and le is not None:
        return f" from {fmt(ge)} to {fmt(le)}"
    low = f"at least {fmt(ge)}" if ge is not None else (f"above {fmt(gt)}" if gt is not None else "")
    high = f"at most {fmt(le)}" if le is not None else (f"below {fmt(lt)}" if lt is not None else "")
    if low and high:
        return f" {low} and {high}"
    if low or high:
        return f" of {low or high}" if low.startswith("at") or high.startswith("at") else f" {low or high}"
    return ""


def describe(tp: Any) -> str:
    """What a value of this annotation must be, in words: 'an integer from 1 to 4096', 'one of eager, sdpa'."""
    base, meta = _strip(tp)
    for m in meta:
        if getattr(m, "description", None):
            return m.description
    origin = typing.get_origin(base)
    if origin in (Union, types.UnionType):
        args = typing.get_args(base)
        parts = [describe(a) for a in args if a is not type(None)]
        return " or ".join(dict.fromkeys(parts))
    if origin is Literal:
        values = [str(v) for v in typing.get_args(base)]
        return values[0] if len(values) == 1 else "one of " + ", ".join(values)
    if base is bool:
        return "true or false"
    if base is int:
        return "an integer" + _bounds(meta, True)
    if base is float:
        return "a finite number" + _bounds(meta, False)
    if base is str:
        return "a string"
    if origin in (list, tuple):
        return "a list"
    if origin is dict or dataclasses.is_dataclass(base):
        return "a mapping of keys"
    return getattr(base, "__name__", str(base))


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def explain(tp: Any, errors: list[dict[str, Any]], where: str = "", names: dict[str, str] | None = None) -> str:
    """One line for the first pydantic error, phrased as 'key.path must be <what the type allows>; got <value>'."""
    err = _pick(tp, errors)
    shown, ann, _ = _walk(tp, tuple(err["loc"]))
    if shown and names:
        shown[0] = names.get(shown[0], shown[0])
    key = ".".join(shown).replace(".[", "[")
    path = f"{where}.{key}" if where and key else (where or key)
    kind = err["type"]
    value = err.get("input")
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        known = _fields(_walk(tp, tuple(err["loc"])[:-1])[1]) or {}
        name = shown[-1] if shown else str(err["loc"][-1])
        if not path.isprintable() or len(path) > 60:
            path = repr(path)[:60]
        return f"unknown key '{path}'{did_you_mean(name, known)}"
    if kind == "invalid_key":
        return f"{where or 'the input'}{'.' if where and shown[:-1] else ''}{'.'.join(shown[:-1])} has a key that is not a string: {_show(value)}"
    if kind == "missing" or kind == "missing_argument":
        head, _, last = path.rpartition(".")
        return f"{head or 'the input'} needs {last}"
    if ann is None:
        return f"{path or 'the input'}: {err['msg']}; got {_show(value)}"
    what = describe(ann)
    if not path:
        return f"expected {what}; got {_show(value)}"
    hint = did_you_mean(value, [str(c) for a in _arms(ann) if typing.get_origin(a) is Literal
                                for c in typing.get_args(a)]) if isinstance(value, str) else ""
    if isinstance(value, float) and not math.isfinite(value):
        hint = ""
    return f"{path or 'the input'} must be {what}; got {_show(value)}{hint}"
