"""The handler child: ``python3 -m toolcage.worker.connectors.handler_host``, one job, then exit.

The worker starts it for every connector call (and once, at configure, to list the tools).
It holds one socket to the worker (fd ``TOOLCAGE_HANDLER_FD``) and nothing else of the
worker's: no protocol descriptor, no secret, no environment of its own (a fresh interpreter,
not a fork, so no copy of the worker's memory). Messages on the socket are JSON lines; the
worker treats every one as hostile input (worker.connectors).
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from toolcage.policies import contract
from toolcage.worker import _lean

# every call starts this process: the policy model's package (~80 ms of imports in a 1-CPU
# container) is not needed here, only its error codes and the strict builder
_lean.bare_package("toolcage.policies")

from toolcage.policies import codes  # noqa: E402
from toolcage.worker import errors  # noqa: E402
from toolcage.worker.connectors.sdk import TOOL_ATTR, Context  # noqa: E402
from toolcage.worker.connectors.spec import HandlerSpec, SpecError, spec_of  # noqa: E402

# The child cannot redact (it holds no secret): it cuts a handler's text only far beyond what the
# worker shows, and the worker redacts, then cuts. A cut here could split a value the worker then
# could not recognise (a traceback's tail cut at 4000 left the second half of an exposed value).
_TEXT_MAX = 1 << 16
_BY_CODE = {cls.code: cls for cls in (errors.ToolError, errors.EgressDenied, errors.FetchFailed, errors.BadParams)}


class SocketLink:
    """The handler's end of its socket to the worker (sdk.Link)."""

    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        self.file = self.sock.makefile("rb")

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message, default=repr).encode() + b"\n")

    def recv(self) -> dict[str, Any]:
        line = self.file.readline()
        if not line:
            raise SystemExit(0)  # the worker is gone: nothing left to do
        msg = json.loads(line)
        if not isinstance(msg, dict):
            raise SystemExit(70)
        return msg

    def tell(self, message: dict[str, Any]) -> None:
        self.send(message)

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        self.send(message)
        answer = self.recv()
        if answer.get("op") == "failed":
            cls = _BY_CODE.get(answer.get("code"), errors.ToolError)  # type: ignore[arg-type]
            raise cls(str(answer.get("message")), answer.get("data"))
        return answer


def _modules(source: dict[str, Any]) -> list[str]:
    """Put a source on sys.path and name the modules it holds: a ``.py`` file, a folder of
    them, or a package folder (the package and its direct submodules)."""
    path = Path(source["path"])
    kind = source["kind"]
    if kind == "file":
        sys.path.insert(0, str(path.parent))
        return [path.stem]
    if kind == "package":
        import pkgutil

        sys.path.insert(0, str(path.parent))
        pkg = importlib.import_module(path.name)
        subs = [f"{path.name}.{m.name}" for m in pkgutil.iter_modules(getattr(pkg, "__path__", []))]
        return [path.name, *sorted(subs)]
    sys.path.insert(0, str(path))
    return sorted(p.stem for p in path.glob("*.py") if not p.name.startswith("_"))


def _tools_in(module: ModuleType) -> list[Any]:
    return [v for v in vars(module).values() if callable(v) and hasattr(v, TOOL_ATTR)]


def discover(sources: list[dict[str, Any]], schemas: bool = True) -> dict[str, Any]:
    """Import every source's modules and list their tools; a clash or a broken module is an error.
    Without ``schemas`` (at start) pydantic is not imported: schemas are made when tools.list asks."""
    tools: dict[str, dict[str, Any]] = {}
    seen: set[int] = set()
    problems: list[str] = []
    for source in sources:
        try:
            names = _modules(source)
        except Exception as exc:
            problems.append(f"{source['label']}: {_brief(exc)}")
            continue
        for mod_name in names:
            try:
                module = importlib.import_module(mod_name)
            except Exception as exc:
                problems.append(f"{source['label']}: importing {mod_name} failed: {_brief(exc)}")
                continue
            for fn in _tools_in(module):
                if id(fn) in seen:
                    continue  # the same function re-exported by a package __init__
                seen.add(id(fn))
                try:
                    spec = spec_of(fn)
                except SpecError as exc:
                    problems.append(f"{source['label']}: {exc}")
                    continue
                if spec.name in tools:
                    problems.append(
                        f"tool name clash: {spec.name} is defined in {tools[spec.name]['module']} and in {mod_name}"
                    )
                    continue
                try:
                    described = spec.describe(mod_name, schema=schemas)
                except Exception as exc:  # a hint pydantic cannot turn into a schema
                    problems.append(f"{source['label']}: {spec.name}: no params schema: {_brief(exc)}")
                    continue
                tools[spec.name] = {**described, "source_index": source["index"]}
    return {"op": "catalog", "tools": list(tools.values()), "problems": problems}


def _find(job: dict[str, Any]) -> HandlerSpec:
    _modules(job["source"])
    module = importlib.import_module(job["module"])
    for fn in _tools_in(module):
        if getattr(fn, TOOL_ATTR).name == job["tool"]:
            return spec_of(fn)
    raise errors.ToolError(f"tool {job['tool']} is no longer in {job['module']}")


def call(job: dict[str, Any], link: SocketLink) -> dict[str, Any]:
    try:
        spec = _find(job)
        kwargs = spec.validate(job["params"])
        ctx = Context(
            link,
            scratch=Path(job["scratch"]),
            workspace=Path(job["workspace"]) if job.get("workspace") else None,
            run_id=job.get("run_id", "local"),
        )
        value = spec.fn(ctx, **kwargs) if spec.wants_context else spec.fn(**kwargs)
        try:
            encoded = json.loads(json.dumps(value))
        except (TypeError, ValueError) as exc:
            raise errors.ToolError(f"the handler returned a value that is not JSON: {exc}") from None
        return {"op": "result", "value": encoded}
    except errors.WorkerError as exc:
        return {"op": "error", "code": exc.code, "message": exc.message, "data": exc.data}
    except Exception as exc:
        import traceback

        return {
            "op": "error",
            "code": codes.HANDLER_ERROR,
            "message": f"the handler raised {_brief(exc, _TEXT_MAX)}",
            "data": {"type": type(exc).__name__, "traceback": traceback.format_exc(limit=20)[-_TEXT_MAX:]},
        }


def _brief(exc: BaseException, limit: int = 1000) -> str:
    return f"{type(exc).__name__}: {exc}"[:limit]


def main() -> int:
    link = SocketLink(int(os.environ.pop(contract.ENV_HANDLER_FD)))
    job = json.loads(sys.stdin.buffer.read())  # the worker writes the whole job, then closes stdin
    if job.get("op") == "discover":
        link.send(discover(job["sources"], schemas=job.get("schemas") is True))
    elif job.get("op") == "call":
        link.send(call(job, link))
    return 0


if __name__ == "__main__":
    sys.exit(main())
