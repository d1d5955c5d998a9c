"""policies.typed.build and pydantic read the same declarations and must agree on every input."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from toolcage.policies import Policy
from toolcage.policies.typed import BuildError, build
from toolcage.worker.tools import Catalog

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.sampled_from(["64m", "1g", "512q", "utf-8", "base64", "", "0", "yes"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def field_dicts(names: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts whose keys are mostly real field names, with arbitrary values (and sometimes a stray key)."""
    keys = st.sampled_from([*names, "extra"])
    return st.dictionaries(keys, VALUES, max_size=len(names) + 1)


def agree(cls: type[Any], data: dict[str, Any]) -> None:
    try:
        ours: Any = build(cls, data)
    except BuildError:
        ours = "refused"
    try:
        theirs: Any = TypeAdapter(cls).validate_json(json.dumps(data))
    except ValidationError:
        theirs = "refused"
    assert ours == theirs, (data, ours, theirs)


PARAM_CLASSES = {name: Catalog().get(name).params for name in Catalog().names()}


@pytest.mark.parametrize("name", sorted(PARAM_CLASSES))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_params_validators_agree(name: str, data: st.DataObject) -> None:
    """For every tool, build() and pydantic accept and refuse the same params, building equal values."""
    cls = PARAM_CLASSES[name]
    names = list(TypeAdapter(cls).json_schema()["properties"])
    agree(cls, data.draw(field_dicts(names)))


@settings(max_examples=300, deadline=None)
@given(
    limits=field_dicts(["memory", "cpus", "pids", "nofile", "scratch", "output_cap"]),
    timeouts=field_dicts(["call_s", "run_s"]),
    name=st.one_of(st.text(max_size=70), st.sampled_from(["default", "a.b-c_d", "bad name"])),
)
def test_policy_validators_agree(limits: dict[str, Any], timeouts: dict[str, Any], name: str) -> None:
    """For policies too: sizes, bounds, unknown fields, strict types, the name pattern."""
    agree(Policy, {"limits": limits, "timeouts": timeouts, "name": name})


def test_build_reports_every_field() -> None:
    """A BuildError names each bad field with a reason."""
    with pytest.raises(BuildError) as info:
        build(Policy, {"limits": {"pids": "64", "memroy": 1}, "timeouts": {"run_s": -1}})
    fields = {e["field"]: e["error"] for e in info.value.errors}
    assert fields == {
        "limits.pids": "must be an integer",
        "limits.memroy": "unknown field",
        "timeouts.run_s": "must be greater than 0",
    }
