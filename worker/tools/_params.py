"""Tool params: frozen stdlib dataclasses, strict, no unknown keys (see policies.typed).

Validated on the hot path by ``policies.typed.build``; their JSON schema (for
``tools.list``) comes from pydantic, imported only when a schema is asked for.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from toolcage.policies.typed import STRICT_CONFIG


def params(cls: type[Any]) -> type[Any]:
    """Class decorator: a frozen, keyword-only dataclass with pydantic's strict config."""
    cls.__pydantic_config__ = STRICT_CONFIG
    return dataclasses.dataclass(frozen=True, kw_only=True)(cls)


def doc(text: str, default: Any = dataclasses.MISSING) -> Any:
    """A field with a description for the JSON schema."""
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata={"doc": text})
    return dataclasses.field(default=default, metadata={"doc": text})


def json_schema(cls: type[Any]) -> dict[str, Any]:
    from pydantic import TypeAdapter

    schema: dict[str, Any] = TypeAdapter(cls).json_schema()
    props = schema.get("properties", {})
    for f in dataclasses.fields(cls):
        if "doc" in f.metadata and f.name in props:
            props[f.name]["description"] = f.metadata["doc"]
    schema["additionalProperties"] = False
    return schema
