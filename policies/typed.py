"""Declarations and a fast strict builder for frozen dataclasses (policies, tool params).

Models are stdlib frozen dataclasses whose constraints are ``annotated_types`` metadata
(``Ge``, ``Gt``, ``Le``, ``Lt``, ``MinLen``, ``MaxLen``) and :data:`SIZE`. Two validators
read the same declarations:

- pydantic (``TypeAdapter``), where people write the input (policy files) and where JSON
  schemas are needed (``tools.list``): rich errors, nothing on a hot path;
- :func:`build` here, on the worker's hot path: importing pydantic costs 80-110 ms of
  CPU in a 1-CPU container, paid by every run's first tool call. ``build`` needs only
  ``typing`` and ``annotated_types`` and is as strict as pydantic's strict mode.

A property-based test (tests/unit/test_typed.py) checks that both accept and refuse the
same inputs and build equal values.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at

# pydantic reads this off stdlib dataclasses: same strictness as build()
STRICT_CONFIG = {"strict": True, "extra": "forbid"}

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(value: Any) -> int:
    """Turn ``512m``, ``64MiB``, ``1g`` or a plain int into bytes (binary units)."""
    if isinstance(value, bool):
        raise ValueError("a size must be a number of bytes or a string like '64m'")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise ValueError(f"not a size: {value!r} (use bytes or a string like '64m', '1g')")


class _Size:
    """Marker: an int of bytes that may be written as a size string (``64m``)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_before_validator_function(parse_size, handler(source))

    def __repr__(self) -> str:
        return "SIZE"


SIZE = _Size()


class BuildError(ValueError):
    """Input that does not fit the declaration; ``errors`` names each bad field."""

    def __init__(self, errors: list[dict[str, str]]) -> None:
        super().__init__("; ".join(f"{e['field'] or '(top level)'}: {e['error']}" for e in errors))
        self.errors = errors


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls, include_extras=True)
    return _HINTS[cls]


def _check_meta(value: Any, meta: Any) -> str | None:
    checks: tuple[tuple[type, Callable[[Any], bool], Callable[[Any], str]], ...] = (
        (at.Gt, lambda m: value > m.gt, lambda m: f"must be greater than {m.gt}"),
        (at.Ge, lambda m: value >= m.ge, lambda m: f"must be greater than or equal to {m.ge}"),
        (at.Lt, lambda m: value < m.lt, lambda m: f"must be less than {m.lt}"),
        (at.Le, lambda m: value <= m.le, lambda m: f"must be less than or equal to {m.le}"),
        (at.MinLen, lambda m: len(value) >= m.min_length, lambda m: f"must have at least {m.min_length} items"),
        (at.MaxLen, lambda m: len(value) <= m.max_length, lambda m: f"must have at most {m.max_length} items"),
    )
    for kind, ok, msg in checks:
        if isinstance(meta, kind) and not ok(meta):
            return msg(meta)
    return None


def _build(tp: Any, value: Any, loc: str, errors: list[dict[str, str]]) -> Any:
    def fail(msg: str) -> None:
        errors.append({"field": loc, "error": msg})

    origin = get_origin(tp)
    if origin is Annotated:
        base, *metas = get_args(tp)
        if any(m is SIZE for m in metas):
            try:
                value = parse_size(value)
            except ValueError as exc:
                fail(str(exc))
                return None
        n = len(errors)
        out = _build(base, value, loc, errors)
        if len(errors) == n:
            for meta in metas:
                problem = _check_meta(out, meta)
                if problem:
                    fail(problem)
                    break
        return out
    if origin is Literal:
        for choice in get_args(tp):
            if value == choice and type(value) is type(choice):
                return value
        fail(f"must be one of {list(get_args(tp))!r}")
        return None
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            trial: list[dict[str, str]] = []
            out = _build(option, value, loc, trial)
            if not trial:
                return out
        fail(f"invalid value of type {type(value).__name__}")
        return None
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            fail("must be a list")
            return None
        (item,) = get_args(tp)[:1]
        items = (_build(item, v, f"{loc}.{i}" if loc else str(i), errors) for i, v in enumerate(value))
        return tuple(items) if origin is tuple else list(items)
    if origin is dict:
        if not isinstance(value, dict):
            fail("must be a mapping")
            return None
        _, item = get_args(tp)
        return {k: _build(item, v, f"{loc}.{k}" if loc else str(k), errors) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            fail("must be a mapping of fields")
            return None
        hints = _hints(tp)  # type: ignore[arg-type]
        fields = {f.name: f for f in dataclasses.fields(tp) if f.init}
        kwargs = {}
        for key in value:
            if key not in fields:
                errors.append({"field": f"{loc}.{key}" if loc else str(key), "error": "unknown field"})
        for name, f in fields.items():
            sub = f"{loc}.{name}" if loc else name
            if name in value:
                kwargs[name] = _build(hints[name], value[name], sub, errors)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                errors.append({"field": sub, "error": "field required"})
        if errors:
            return None
        try:
            return typing.cast(Callable[..., Any], tp)(**kwargs)
        except ValueError as exc:
            fail(str(exc))
            return None
    if tp is bool:
        if type(value) is not bool:
            fail("must be a boolean")
        return value
    if tp is int:
        if type(value) is not int:
            fail("must be an integer")
        return value
    if tp is float:
        if type(value) not in (int, float):
            fail("must be a number")
            return None
        return float(value)
    if tp is str:
        if type(value) is not str:
            fail("must be a string")
        return value
    if tp is Any:
        return value
    raise TypeError(f"build() does not support the type {tp!r}")


def build(cls: type[Any], data: Any) -> Any:
    """Construct ``cls`` from JSON-like ``data``, strictly; raise BuildError naming every bad field."""
    errors: list[dict[str, str]] = []
    out = _build(cls, data, "", errors)
    if errors:
        raise BuildError(errors)
    return out


def to_dict(obj: Any) -> dict[str, Any]:
    """A frozen dataclass as plain JSON-able data (tuples become lists)."""
    return typing.cast(dict[str, Any], _plain(dataclasses.asdict(obj)))


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v
