"""schema.py: typed input fields (strict where YAML is loose) and the one-line message for a value that does not fit."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from ftscope import FtscopeError
from ftscope.spec.mix import Mix
from ftscope.spec.scenario import ScenarioInput
from ftscope.spec.schema import Choice, Flag, Int, Number, Text, choices, describe, forbid_extra, json_schema, validate


@forbid_extra
@dataclass(frozen=True)
class Inner:
    size: Int(1, 64) = 1


@forbid_extra
@dataclass(frozen=True)
class Outer:
    name: Text() = ""
    ratio: Number(gt=0, le=1) = 0.5
    on: Flag() = False
    stage: Choice(0, 1, 2) = 0
    mode: Literal["a", "b"] = "a"
    batch: Int(1, 8) | Literal["max"] = 1
    inner: Inner = Inner()
    items: tuple[Int(0, 9), ...] = ()


@pytest.mark.parametrize("data, message", [
    ({"ratio": float("nan")}, "outer.ratio must be a finite number above 0 and at most 1; got nan"),
    ({"ratio": True}, "outer.ratio must be a finite number above 0 and at most 1; got True"),
    ({"ratio": "0.5"}, "outer.ratio must be a finite number above 0 and at most 1; got '0.5'"),
    ({"on": "yes"}, "outer.on must be true or false; got 'yes'"),
    ({"stage": True}, "outer.stage must be one of 0, 1, 2; got True"),
    ({"mode": "bb"}, "outer.mode must be one of a, b; got 'bb' (did you mean: b?)"),
    ({"batch": "maxx"}, "outer.batch must be an integer from 1 to 8 or max; got 'maxx' (did you mean: max?)"),
    ({"batch": 4.5}, "outer.batch must be an integer from 1 to 8 or max; got 4.5"),
    ({"inner": {"size": 0}}, "outer.inner.size must be an integer from 1 to 64; got 0"),
    ({"inner": {"sise": 3}}, "unknown key 'outer.inner.sise' (did you mean: size?)"),
    ({"inner": [1]}, "outer.inner must be a mapping of keys; got [1]"),
    ({"items": [1, "x"]}, "outer.items[1] must be an integer from 0 to 9; got 'x'"),
    ({"name": {"a": 1}}, "outer.name must be a string; got {'a': 1}"),
    ({1: 2}, "outer has a key that is not a string: 1"),
])
def test_the_message_names_the_key_and_what_it_must_be(data, message):
    with pytest.raises(FtscopeError) as info:
        validate(Outer, data, "outer")
    assert str(info.value) == message


def test_integral_floats_are_integers():
    assert validate(Outer, {"batch": 4.0, "inner": {"size": 2.0}}) == Outer(batch=4, inner=Inner(size=2))


def test_source_prefixes_the_message_and_names_show_aliases():
    with pytest.raises(FtscopeError, match=r"^config.json at x: n_embd must be"):
        validate(Inner, {"size": -1}, source="config.json at x", names={"size": "n_embd"})


def test_describe_and_choices_read_the_types():
    assert describe(Int(1, 4096)) == "an integer from 1 to 4,096"
    assert describe(Number(gt=0)) == "a finite number above 0"
    assert choices(Outer, "mode") == ("a", "b") and choices(Outer, "stage") == (0, 1, 2)


def test_the_scenario_has_a_json_schema_for_editors():
    schema = json_schema(ScenarioInput)
    mix = schema["$defs"]["Mix"]["properties"]
    assert mix["attention"]["enum"] == list(choices(Mix, "attention"))
    assert mix["lora_rank"]["minimum"] == 1 and mix["lora_rank"]["maximum"] == 4096
    assert schema["additionalProperties"] is False
