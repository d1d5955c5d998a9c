"""Built-in tools: each is a name, a description, a pydantic params model and a handler.

The params model gives both validation (-32602 on mismatch) and the JSON schema that
``tools.list`` returns, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from worker.settings import Settings


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    params: type[BaseModel]
    handler: Callable[[Settings, Any], dict[str, Any]]
    in_process_timeout: bool = True  # handlers that run no child get a SIGALRM deadline


def builtin_tools() -> dict[str, Tool]:
    """Every built-in tool by name."""
    from worker.tools import files, proc

    tools = [*proc.TOOLS, *files.TOOLS]
    return {t.name: t for t in tools}


def describe(tools: dict[str, Tool]) -> list[dict[str, Any]]:
    """What ``tools.list`` answers: name, description and params schema of each tool."""
    return [
        {"name": t.name, "description": t.description, "params_schema": t.params.model_json_schema()}
        for t in tools.values()
    ]
