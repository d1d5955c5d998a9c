"""Built-in tools: each is a name, a description, a pydantic params model and a handler.

The params dataclass gives both validation (-32602 on mismatch, by policies.typed.build)
and the JSON schema that ``tools.list`` returns (by pydantic), read off one declaration. Tool modules are imported on
first use: a run that only lists files never pays for pydantic models it does not use.
The built-in tools' ``tools.list`` entries are made once, when the image is built
(``python -m toolcage.worker.tools.schemas``, baked as ``schemas.json`` next to this file), so
listing them imports neither pydantic nor the tool modules; the whole list is then kept.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from toolcage.policies import contract
from toolcage.worker.errors import BadParams

if TYPE_CHECKING:
    from toolcage.worker.settings import Settings

BAKED_SCHEMAS = os.path.join(os.path.dirname(__file__), "schemas.json")

# tool name -> module that defines it (in its TOOLS list)
BUILTIN: dict[str, str] = {
    "run_python": "toolcage.worker.tools.proc",
    "run_shell": "toolcage.worker.tools.proc",
    "run_node": "toolcage.worker.tools.node",
    "list_files": "toolcage.worker.tools.files",
    "read_file": "toolcage.worker.tools.files",
    "grep": "toolcage.worker.tools.files",
    "write_file": "toolcage.worker.tools.files",
    "remove": "toolcage.worker.tools.files",
    "http_fetch": "toolcage.worker.tools.net",
    "exec": "toolcage.worker.tools.exec",
    "download": "toolcage.worker.tools.download",
    "upload": "toolcage.worker.tools.upload",
    "workspace_changes": "toolcage.worker.tools.workspace",
    **dict.fromkeys(
        ("proc_start", "proc_read", "proc_wait", "proc_write", "proc_signal", "proc_kill", "proc_resize", "proc_list"),
        "toolcage.worker.tools.background",
    ),
    **dict.fromkeys(
        ("code_run", "code_context_create", "code_context_list", "code_context_restart", "code_context_remove"),
        "toolcage.worker.tools.interpreter",
    ),
}


class Tool(NamedTuple):  # a NamedTuple, not a dataclass: importing dataclasses costs ~10 ms at start-up
    name: str
    description: str
    params: Any  # a frozen dataclass declared with worker.tools._params.params; None: checked by the handler
    handler: Callable[[Settings, Any], Any]
    in_process_timeout: bool = True  # handlers that run no child get a SIGALRM deadline
    runs_code: bool = False  # it runs untrusted code: when the call ends, every other process is killed
    info: Callable[[], dict[str, Any]] | None = None  # what tools.list shows, when not read off ``params``
    # it may hold the run's secrets (a connector): it runs with no other code call in flight, after the
    # sweep, and none starts beside it (a same-uid process could read its memory through /proc)
    alone: bool = False
    # it waits (for a background process's output or end): served on a thread of its own beside every other
    # call, whatever the policy's concurrency, and never counted as a code call (worker.loop)
    waits: bool = False

    def validate(self, raw: dict[str, Any]) -> Any:
        if self.params is None:
            return raw  # a connector's params are checked in its child, where its types exist
        from toolcage.policies.typed import BuildError, build

        try:
            return build(self.params, raw)
        except BuildError as exc:
            raise BadParams("Invalid params", exc.errors) from None


class Catalog:
    """Tools by name, loaded lazily from their modules."""

    def __init__(self, modules: dict[str, str] | None = None, extra_modules: tuple[str, ...] = ()) -> None:
        self._modules = dict(BUILTIN if modules is None else modules)
        self._loaded: dict[str, Tool] = {}
        self._described: list[dict[str, Any]] | None = None  # tools.list's answer, made once
        # Extension point for images derived from toolcage-worker: modules with a TOOLS list,
        # named in TOOLCAGE_TOOL_MODULES (set by the derived image). Imported now, since their names are needed.
        for mod_name in extra_modules:
            module = importlib.import_module(mod_name)
            for t in module.TOOLS:
                self._modules[t.name] = mod_name
                self._loaded[t.name] = t

    @classmethod
    def from_env(cls) -> Catalog:
        import os

        extra = tuple(m.strip() for m in os.environ.get(contract.ENV_TOOL_MODULES, "").split(",") if m.strip())
        return cls(extra_modules=extra)

    def add(self, tool: Tool) -> None:
        """A tool from outside the image (a connector); its name must be new."""
        if tool.name in self._modules:
            raise ValueError(f"tool name clash: {tool.name}")
        self._modules[tool.name] = ""
        self._loaded[tool.name] = tool
        self._described = None

    def names(self) -> list[str]:
        return list(self._modules)

    def get(self, name: str) -> Tool:
        tool = self._loaded.get(name)
        if tool is None:
            module = importlib.import_module(self._modules[name])
            for t in module.TOOLS:
                self._loaded[t.name] = t
            tool = self._loaded[name]
        return tool

    def find(self, name: str) -> Tool | None:
        """The tool of that name, or None."""
        return self.get(name) if name in self._modules else None

    def describe(self) -> list[dict[str, Any]]:
        """What ``tools.list`` answers: name, description and params schema of each tool (made once;
        a connector's entry is its own ``info``, whose schema is made once by the connectors)."""
        if self._described is not None:
            return self._described
        baked = _baked()
        out = []
        for name in self.names():
            if name in baked and self._modules[name] == BUILTIN.get(name):
                out.append(baked[name])
                continue
            t = self.get(name)
            if t.info is not None:
                out.append(t.info())
            else:
                out.append(describe_tool(t))
        self._described = out
        return out


def describe_tool(t: Tool) -> dict[str, Any]:
    """A tool's ``tools.list`` entry, read off its params declaration (imports pydantic)."""
    from toolcage.worker.tools._params import json_schema

    return {"name": t.name, "description": t.description, "params_schema": json_schema(t.params)}


_BAKED: dict[str, dict[str, Any]] | None = None


def _baked() -> dict[str, dict[str, Any]]:
    """The built-in tools' entries made at image build (empty outside an image: made on first ask)."""
    global _BAKED
    if _BAKED is None:
        try:
            with open(BAKED_SCHEMAS, encoding="utf-8") as f:
                _BAKED = {t["name"]: t for t in json.load(f)}
        except (OSError, ValueError, KeyError, TypeError):
            _BAKED = {}
    return _BAKED
