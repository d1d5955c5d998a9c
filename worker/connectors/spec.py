"""From a ``@tool`` function to a tool's params model: its signature as a strict frozen dataclass.

Runs in the handler child only (it reads user code). The dataclass is validated like the
built-in tools' params (``policies.typed.build``; pydantic's strict mode for types ``build``
does not know) and gives the JSON schema ``tools.list`` shows, with each parameter's
description taken from the docstring's ``Args:`` section.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from collections.abc import Callable
from typing import Any

from toolcage.policies.typed import STRICT_CONFIG, BuildError, build
from toolcage.worker.connectors.sdk import TOOL_ATTR, Context, ToolInfo
from toolcage.worker.errors import BadParams

_ARG_LINE = re.compile(r"^\s{2,}(\*{0,2}\w+)\s*(?:\([^)]*\))?:\s*(.*)$")
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


class SpecError(Exception):
    """A ``@tool`` function that cannot be a tool (its author's mistake, shown at start)."""


@dataclasses.dataclass(frozen=True)
class HandlerSpec:
    name: str
    description: str
    fn: Callable[..., Any]
    params: type[Any]  # frozen dataclass of the params
    wants_context: bool

    def validate(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Strictly checked params, as keyword arguments; BadParams (-32602) otherwise."""
        try:
            built = build(self.params, raw)
        except BuildError as exc:
            raise BadParams("Invalid params", exc.errors) from None
        except TypeError:  # a type build() does not know: pydantic's strict mode decides
            built = _pydantic_validate(self.params, raw)
        return {f.name: getattr(built, f.name) for f in dataclasses.fields(self.params)}

    def describe(self, module: str, schema: bool = True) -> dict[str, Any]:
        """Name, description, module and (``schema``: pydantic, ~100 ms to import) the params schema."""
        params_schema = None
        if schema:
            from toolcage.worker.tools._params import json_schema

            params_schema = json_schema(self.params)
            params_schema["title"] = self.name
        return {
            "name": self.name,
            "description": self.description,
            "params_schema": params_schema,
            "source": "connector",
            "module": module,
        }


def _pydantic_validate(cls: type[Any], raw: dict[str, Any]) -> Any:
    from pydantic import TypeAdapter, ValidationError

    try:
        return TypeAdapter(cls).validate_python(raw)
    except ValidationError as exc:
        errors = [{"field": ".".join(str(p) for p in e["loc"]), "error": e["msg"]} for e in exc.errors()]
        raise BadParams("Invalid params", errors) from None


def _arg_docs(doc: str) -> tuple[str, dict[str, str]]:
    """The docstring's text before ``Args:``, and each argument's one-line description."""
    lines = doc.splitlines()
    out: dict[str, str] = {}
    for i, line in enumerate(lines):
        if line.strip().lower() in ("args:", "arguments:", "parameters:"):
            for arg in lines[i + 1 :]:
                m = _ARG_LINE.match(arg)
                if m:
                    out[m.group(1).lstrip("*")] = m.group(2).strip()
                elif arg.strip() and not arg.startswith(" "):
                    break
            return "\n".join(lines[:i]).strip(), out
    return doc.strip(), out


def spec_of(fn: Callable[..., Any]) -> HandlerSpec:
    info: ToolInfo = getattr(fn, TOOL_ATTR)
    where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
    if not NAME_RE.match(info.name):
        raise SpecError(f"{where}: tool name {info.name!r} must be letters, digits, '_', '.' or '-'")
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise SpecError(f"{where}: cannot read its type hints: {type(exc).__name__}: {exc}") from None
    doc = inspect.cleandoc(fn.__doc__ or "")
    summary, arg_docs = _arg_docs(doc)
    description = info.description or summary
    if not description:
        raise SpecError(f"{where}: a tool needs a docstring (it is the description the model reads)")
    params = list(inspect.signature(fn).parameters.values())
    wants_context = bool(params) and (hints.get(params[0].name) is Context or params[0].name == "ctx")
    if wants_context:
        params = params[1:]
    fields: list[tuple[str, Any, Any]] = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise SpecError(f"{where}: parameter {p.name!r}: *args, **kwargs and positional-only are not allowed")
        if p.name not in hints:
            raise SpecError(f"{where}: parameter {p.name!r} needs a type hint (it is the params schema)")
        meta = {"doc": arg_docs[p.name]} if p.name in arg_docs else {}
        default = dataclasses.MISSING if p.default is p.empty else p.default
        if isinstance(default, list | dict | set):
            raise SpecError(f"{where}: parameter {p.name!r}: a mutable default; use None or a tuple")
        fields.append((p.name, hints[p.name], dataclasses.field(default=default, metadata=meta)))
    model = dataclasses.make_dataclass(f"{info.name}_params", fields, frozen=True, kw_only=True)
    model.__pydantic_config__ = STRICT_CONFIG  # type: ignore[attr-defined]
    return HandlerSpec(info.name, description, fn, model, wants_context)
