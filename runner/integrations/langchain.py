"""toolcage's tools as LangChain ``StructuredTool``s bound to an open :class:`~toolcage.Sandbox` or
:class:`~toolcage.AsyncSandbox`: a LangGraph agent calls the sandbox directly, with no MCP subprocess.

    from toolcage import Sandbox
    from toolcage.integrations.langchain import get_tools

    with Sandbox(workspace=".") as sb:
        tools = get_tools(sb)  # run_python, run_shell, exec, read_file, grep, ... with their JSON schemas
        agent = create_react_agent(model, tools)

The image is the sandbox's: ``Sandbox(image="my-agent:latest")``, any image the engine has, gives the same
tools, running that image's programs with its PATH, ENV and WORKDIR.

Each tool is built from the sandbox's own ``tools.list`` answer (its name, description and params JSON
schema, as ``args_schema``; connector tools included), and calls the sandbox: ``invoke`` through
``Sandbox.call``, ``ainvoke`` natively through ``AsyncSandbox.call`` (no thread waits for the answer,
and cancelling the task cancels the call inside the sandbox), whichever kind of sandbox it was given. Any
other session of toolcage's (``toolcage.types.SandboxLike``/``AsyncSandboxLike``: a Ray cluster's
``ClusterSandbox``, ``AsyncClusterSandbox``) works too, the face it lacks on a thread.

A call that went well answers its result as JSON text, and the whole ``CallResult`` (as a dict) as the
``ToolMessage``'s artifact (``response_format="content_and_artifact"``). A call that did not (a tool
error, bad arguments, a non-zero exit, a timeout, a refused egress) or a sandbox that failed (killed,
its deadline, its memory) raises :class:`ToolcageToolException`, a ``ToolException`` naming toolcage's
status, reason, error code and message; with ``handle_tool_error=True`` (the default) LangChain turns
it into a ``ToolMessage`` with ``status="error"``, so the agent sees a failed tool call and the graph
goes on. The sandbox's arguments are checked by the worker, which names each bad field (``-32602``).

Background processes: the ``proc_*`` tools (:data:`PROCESS_TOOLS`) are among them: ``proc_start`` answers at once
with an id, ``proc_read``/``proc_wait`` follow its output (or wait for a port), ``proc_write`` types into it,
``proc_kill`` stops it; each lives across tool calls until killed or the sandbox ends.

Python contexts: the ``code_*`` tools (:data:`INTERPRETER_TOOLS`) are among them too: ``code_run`` runs a cell in a
context whose variables persist across calls (``code_context_create``, ``_list``, ``_restart``, ``_remove``
manage them). A cell's PNG and JPEG results (a matplotlib chart) are not sent to the model as base64: the content
is the answer's JSON with each image replaced by a short placeholder, and the artifact's ``images`` holds them,
in order, as ``{"mime": "image/png", "data": base64}`` (the artifact's ``result`` keeps the whole answer), for
the application to show, or to hand a vision model as an image block.

The stream tools (``upload``, ``download``, ``workspace_changes``) are left out by default: they move
tar chunks, which is the host's job (``Sandbox.upload``/``download``/``changes``), not a model's.

Needs ``langchain-core`` (the ``toolcage[langchain]`` extra); importing this module imports it.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Union

try:
    from langchain_core.tools import StructuredTool, ToolException
except ImportError as exc:
    from toolcage.integrations import raise_missing_extra

    raise_missing_extra(exc, "langchain", __name__)
    raise

from toolcage.aio import AsyncSandbox
from toolcage.errors import SandboxError, ToolcageError, UsageError
from toolcage.integrations import split_images
from toolcage.policies.contract import TOOLS_LIST
from toolcage.results import CallResult
from toolcage.sandbox import Sandbox
from toolcage.textsafe import dumps, escape

if TYPE_CHECKING:
    from toolcage.types import AsyncSandboxLike, SandboxLike

# tools that move a tar stream in base64 chunks: the host drives them (Sandbox.upload, .download, .changes)
STREAM_TOOLS: tuple[str, ...] = ("upload", "download", "workspace_changes")
# background processes and terminals (docs/processes.md): start a server or a REPL, read and wait on its output,
# type into it, stop it. ``get_tools(sb, include=PROCESS_TOOLS)`` binds these alone.
PROCESS_TOOLS: tuple[str, ...] = (
    "proc_start", "proc_read", "proc_wait", "proc_write", "proc_signal", "proc_kill", "proc_resize", "proc_list",
)  # fmt: skip
# the stateful Python interpreter (issue 38): run a cell in a context, and manage the contexts.
# ``get_tools(sb, include=INTERPRETER_TOOLS)`` binds these alone.
INTERPRETER_TOOLS: tuple[str, ...] = (
    "code_run", "code_context_create", "code_context_list", "code_context_restart", "code_context_remove",
)  # fmt: skip
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what the model providers take as a function name
_PREFIX = re.compile(r"^[A-Za-z0-9_-]*$")

# any session: toolcage.types' surface (a Sandbox, an AsyncSandbox, a pooled one, a Ray cluster's session)
AnySandbox = Union["SandboxLike", "AsyncSandboxLike"]
_Call = Callable[[str, "dict[str, Any] | None"], CallResult]
_ACall = Callable[[str, "dict[str, Any] | None"], Awaitable[CallResult]]


class ToolcageToolException(ToolException):
    """A toolcage tool call that did not go well, as LangChain's ``ToolException``.

    ``status`` is toolcage's status (``error``, ``timeout``, ``oom_killed``, ``crashed``, ...), ``reason``
    why (``tool`` for a tool's own failure; a sandbox failure's reason, e.g. ``worker_crashed``,
    ``run_deadline``), ``code`` the JSON-RPC error code when there is one, ``result`` the tool's result
    when it answered one (a non-zero exit keeps its stdout and stderr) and ``sandbox_failed`` whether the
    sandbox itself ended (then it takes no more calls: start a new one)."""

    def __init__(
        self,
        message: str,
        *,
        status: str,
        reason: str,
        code: int | None = None,
        result: Any = None,
        sandbox_failed: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = str(status)
        self.reason = reason
        self.code = code
        self.result = result
        self.sandbox_failed = sandbox_failed


def _failed_call(res: CallResult) -> ToolcageToolException:
    """A CallResult that is not ok, in the words ``toolcage mcp serve`` uses for the same failure."""
    status = str(res.status)
    if res.error is not None:
        err = res.error
        code = err.get("code")
        text = f"tool failed: status {status}, error {code}: {escape(err.get('message'))}"
        if err.get("data") is not None:
            text += f"\n{dumps(err['data'])}"
        return ToolcageToolException(
            text, status=status, reason="tool", code=code if isinstance(code, int) else None, result=res.result
        )
    # the tool answered, but its child ended badly (non-zero exit, timeout, output capped, memory)
    return ToolcageToolException(f"tool failed: status {status}\n{dumps(res.result)}", status=status, reason="tool",
                                 result=res.result)  # fmt: skip


def _failed_sandbox(exc: ToolcageError) -> ToolcageToolException:
    """The sandbox failed (killed, deadline, memory, crash) or refused the call before sending it."""
    failed = isinstance(exc, SandboxError)
    what = "sandbox failed" if failed else "call refused"
    text = f"{what}: status {exc.status} ({exc.reason}): {escape(exc.message)}"
    if failed:
        text += "\nThis sandbox takes no more calls: its files are gone unless a snapshot was taken."
    return ToolcageToolException(text, status=str(exc.status), reason=exc.reason, sandbox_failed=failed)


def _answer(res: CallResult) -> tuple[str, dict[str, Any]]:
    """A call's outcome as (content for the model, artifact), or the exception for a failed one. A
    ``code_run`` answer's images leave the content for the artifact's ``images``."""
    if not res.ok:
        raise _failed_call(res)
    artifact = res.to_dict()
    artifact["status"] = str(res.status)
    if res.tool == "code_run":
        shown, artifact["images"] = split_images(res.result, "in the tool message's artifact")
        return dumps(shown), artifact
    return dumps(res.result), artifact


def _params(args: Any) -> dict[str, Any]:
    if not isinstance(args, dict):  # never from a model's tool call (its args are an object)
        raise ToolcageToolException(
            f"tool arguments must be a JSON object, got {type(args).__name__}", status="error", reason="usage"
        )
    return args


class ToolcageTool(StructuredTool):
    """A ``StructuredTool`` for one toolcage tool. The arguments reach the sandbox as the one params
    object (never as Python keyword arguments), so a param may be called anything, ``config`` included."""

    toolcage_name: str = ""  # the tool's name in the sandbox (``name`` may carry a prefix)

    def _to_args_and_kwargs(
        self, tool_input: str | dict[str, Any], tool_call_id: str | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        tool_input = self._parse_input(tool_input, tool_call_id)
        return (tool_input,), {}


def _sides(sandbox: AnySandbox) -> tuple[_Call, _ACall]:
    """A session's call, waited for and awaited: natively for ``Sandbox``/``AsyncSandbox`` (one run, two
    faces); for another session, the face it lacks on a thread (a sync one's calls awaited through
    ``asyncio.to_thread``; an async one's waited for on an event loop of their own)."""
    if isinstance(sandbox, AsyncSandbox):
        return sandbox._sync.call, sandbox.call
    if isinstance(sandbox, Sandbox):
        return sandbox.call, _async_view(sandbox).call
    call = getattr(sandbox, "call", None)
    if call is None or not callable(call) or not hasattr(sandbox, "run_id"):
        raise UsageError(
            "sandbox must be a toolcage session (a Sandbox or AsyncSandbox, or another toolcage.types.SandboxLike), "
            f"got {type(sandbox).__name__}"
        )
    if inspect.iscoroutinefunction(call):
        acall: _ACall = call

        def waited(tool: str, params: dict[str, Any] | None) -> CallResult:
            with ThreadPoolExecutor(1, thread_name_prefix="toolcage-langchain") as ex:
                return ex.submit(asyncio.run, acall(tool, params)).result()  # type: ignore[arg-type]

        return waited, acall
    sync: _Call = call

    async def awaited(tool: str, params: dict[str, Any] | None) -> CallResult:
        return await asyncio.to_thread(sync, tool, params)

    return sync, awaited


def _callers(
    sandbox: AnySandbox, tool: str
) -> tuple[Callable[[Any], tuple[str, dict[str, Any]]], Callable[[Any], Awaitable[tuple[str, dict[str, Any]]]]]:
    """The sync and async functions that call ``tool`` on ``sandbox``."""
    sync, native = _sides(sandbox)

    def call(args: Any) -> tuple[str, dict[str, Any]]:
        params = _params(args)
        try:
            res = sync(tool, params)
        except ToolcageError as exc:
            raise _failed_sandbox(exc) from exc
        return _answer(res)

    async def acall(args: Any) -> tuple[str, dict[str, Any]]:
        params = _params(args)
        try:
            res = await native(tool, params)
        except ToolcageError as exc:
            raise _failed_sandbox(exc) from exc
        return _answer(res)

    call.__name__ = acall.__name__ = tool
    return call, acall


def _async_view(sb: Sandbox) -> AsyncSandbox:
    """An AsyncSandbox over an open ``Sandbox`` (its calls awaited natively, on the same run)."""
    view = AsyncSandbox.__new__(AsyncSandbox)
    view._apool = None
    view._sync = sb
    return view


def _names(value: Iterable[str] | None, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise UsageError(f"{what} must be a list of tool names, e.g. {what}=['run_python'], not {value!r}")
    names = tuple(value)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise UsageError(f"{what} must hold tool names (strings), got {bad[0]!r}")
    return names


def tools_from_listing(
    sandbox: AnySandbox,
    listing: Iterable[Mapping[str, Any]],
    *,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    name_prefix: str = "",
    handle_tool_error: bool | str | Callable[[ToolException], str] = True,
) -> list[StructuredTool]:
    """The tools of a ``tools.list`` answer (``listing``) as StructuredTools calling ``sandbox``
    (see :func:`get_tools`)."""
    _sides(sandbox)  # a toolcage session, or a UsageError saying what it got
    if not isinstance(name_prefix, str) or not _PREFIX.match(name_prefix):
        raise UsageError(f"name_prefix may hold only letters, digits, '_' and '-': {name_prefix!r}")
    wanted = _names(include, "include")
    unwanted = _names(exclude, "exclude")
    if unwanted is None:  # the default: the stream tools, unless include names them
        unwanted = STREAM_TOOLS if wanted is None else ()
    entries = {str(t["name"]): t for t in listing if isinstance(t, Mapping) and isinstance(t.get("name"), str)}
    for what, names in (("include", wanted or ()), ("exclude", unwanted)):
        # the stream tools' names are always taken in exclude (a derived image may lack them)
        unknown = sorted(n for n in set(names) - set(entries) if what == "include" or n not in STREAM_TOOLS)
        if unknown:
            missing = ", ".join(map(repr, unknown))
            raise UsageError(f"{what}: no tool named {missing} in this sandbox; its tools: {', '.join(entries)}")
    out: list[StructuredTool] = []
    for name, entry in entries.items():
        if (wanted is not None and name not in wanted) or name in unwanted:
            continue
        full = name_prefix + name
        if not _NAME.match(full):
            raise UsageError(
                f"tool name {full!r} is not a valid function name for a model (letters, digits, _ -; <= 64)"
            )
        schema = dict(entry.get("params_schema") or {})
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        func, coroutine = _callers(sandbox, name)
        tool = ToolcageTool(
            name=full,
            description=str(entry.get("description") or name),
            args_schema=schema,
            func=func,
            coroutine=coroutine,
            response_format="content_and_artifact",
            handle_tool_error=handle_tool_error,
            toolcage_name=name,
            metadata={"toolcage_tool": name, "toolcage_run_id": sandbox.run_id},
        )
        out.append(tool)
    return out


def _listing(res: CallResult) -> list[dict[str, Any]]:
    if not res.ok or not isinstance(res.result, list):
        raise SandboxError(f"the sandbox did not list its tools (status {res.status}): {res.error}")
    return res.result


def get_tools(
    sandbox: AnySandbox,
    *,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    name_prefix: str = "",
    handle_tool_error: bool | str | Callable[[ToolException], str] = True,
) -> list[StructuredTool]:
    """The tools of an open (started) ``sandbox`` as LangChain StructuredTools bound to it.

    ``include``: only these tools (by their toolcage names); ``exclude``: not these (default: the
    stream tools, ``STREAM_TOOLS``, unless ``include`` names them; ``exclude=()`` keeps them).
    ``name_prefix`` goes before each tool's name (``"toolcage_"`` gives ``toolcage_run_python``), for
    agents that hold other tools of the same names. ``handle_tool_error``: LangChain's, True by default
    (a failed call is an error ToolMessage); False raises :class:`ToolcageToolException` to the caller instead.

    Asks the sandbox for its tools once (``tools.list``, about a millisecond); from a running event
    loop with an AsyncSandbox, ``await aget_tools(sb)`` does not block the loop."""
    sync, _ = _sides(sandbox)
    listing = _listing(sync(TOOLS_LIST, None))
    return tools_from_listing(
        sandbox, listing, include=include, exclude=exclude, name_prefix=name_prefix,
        handle_tool_error=handle_tool_error,
    )  # fmt: skip


async def aget_tools(
    sandbox: AnySandbox,
    *,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    name_prefix: str = "",
    handle_tool_error: bool | str | Callable[[ToolException], str] = True,
) -> list[StructuredTool]:
    """:func:`get_tools`, with the tools listed without blocking the event loop."""
    _, native = _sides(sandbox)
    res = await native(TOOLS_LIST, None)
    return tools_from_listing(
        sandbox, _listing(res), include=include, exclude=exclude, name_prefix=name_prefix,
        handle_tool_error=handle_tool_error,
    )  # fmt: skip


__all__ = [
    "INTERPRETER_TOOLS",
    "PROCESS_TOOLS",
    "STREAM_TOOLS",
    "ToolcageTool",
    "ToolcageToolException",
    "aget_tools",
    "get_tools",
    "tools_from_listing",
]
