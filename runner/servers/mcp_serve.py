"""``toolcage mcp serve``: the cage as an MCP server on stdio, built on the official MCP SDK's low-level Server.

Imported only by that command, so ``import toolcage`` and the worker never load the SDK; the SDK is the
``toolcage[mcp]`` extra, and without it this import says so. The pure
pieces (a tool listing as MCP tools, a CallResult or a dead sandbox as an MCP tool result) are plain
dicts, unit-tested without Docker; the SDK validates them into its types at the edge.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import AsyncIterator, Callable
from importlib.metadata import version
from typing import Any

try:
    import anyio
    import anyio.from_thread
    import anyio.lowlevel
    import anyio.to_thread
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server
    from mcp.shared.exceptions import MCPError
    from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
except ModuleNotFoundError as exc:  # the SDK is an extra: the core installs beside frameworks that pin mcp 1.x
    if (exc.name or "").partition(".")[0] not in ("mcp", "mcp_types", "anyio"):
        raise
    raise ModuleNotFoundError(
        f"toolcage mcp serve needs the MCP SDK ({exc.name} is missing): pip install 'toolcage[mcp]'", name=exc.name
    ) from None

from toolcage.errors import SandboxError, ToolcageError
from toolcage.policies.contract import TOOLS_LIST
from toolcage.results import CallResult
from toolcage.rpc.session import Cancel, OnProgress
from toolcage.sandbox import Sandbox, interrupted_error
from toolcage.servers.serve import _lines
from toolcage.textsafe import dumps, escape


def mcp_tools(listing: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The worker's ``tools.list`` answer as MCP tools (name, description, inputSchema)."""
    out = []
    for t in listing:
        schema = dict(t.get("params_schema") or {})
        schema.setdefault("type", "object")  # MCP requires an object schema at the root
        out.append({"name": t["name"], "description": t.get("description", ""), "inputSchema": schema})
    return out


# a code_run result's images that become MCP ImageContent: PNG and JPEG, each checked against its signature


def code_images(result: Any) -> tuple[Any, list[dict[str, Any]]]:
    """A ``code_run`` answer with each PNG/JPEG value replaced by a short placeholder, and those images as MCP
    ImageContent blocks, in order (``toolcage.interpreter.split_images``'s rule)."""
    from toolcage.interpreter import split_images

    result, images = split_images(result, "image content of this result")
    return result, [{"type": "image", "data": i["data"], "mimeType": i["mime"]} for i in images]


def call_content(res: CallResult) -> dict[str, Any]:
    """A CallResult as an MCP CallToolResult: the JSON result as text (plus ``structuredContent``
    when it is an object); a tool failure is ``isError`` with its status, error code and message.
    ``code_run``'s PNG and JPEG results are ImageContent blocks after the text, and a short placeholder in the
    text and ``structuredContent`` (so the JSON a model reads stays small)."""
    out: dict[str, Any] = {}
    images: list[dict[str, Any]] = []
    result = res.result
    if res.tool == "code_run":
        result, images = code_images(result)
    if res.ok:
        text = dumps(result)
    elif res.error is not None:
        err = res.error
        text = f"tool failed: status {res.status}, error {err.get('code')}: {escape(err.get('message'))}"
        if err.get("data") is not None:
            text += f"\n{dumps(err['data'])}"
    else:  # the tool answered, but its child ended badly (non-zero exit, timeout, output capped, ...)
        text = f"tool failed: status {res.status}\n{dumps(result)}"
    out["content"] = [{"type": "text", "text": text}, *images]
    if isinstance(result, dict):
        out["structuredContent"] = result
    out["isError"] = not res.ok
    return out


def sandbox_failure(exc: SandboxError, restarts: bool = False) -> dict[str, Any]:
    """The sandbox itself failed (deadline, crash, memory): an ``isError`` result naming the status."""
    text = f"sandbox failed: status {exc.status} ({exc.reason}): {exc.message}"
    if restarts:
        text += "\nThe next call starts a new sandbox: files written to scratch so far are gone."
    return {"content": [{"type": "text", "text": text}], "isError": True}


def start_failure(exc: ToolcageError) -> dict[str, Any]:
    """A new sandbox for the session could not start (Docker gone, the image removed)."""
    text = f"could not start a sandbox: status {exc.status} ({exc.reason}): {exc.message}"
    return {"content": [{"type": "text", "text": text}], "isError": True}


def _note(text: str) -> None:
    """A line for the operator on stderr (stdout is the MCP stream)."""
    with contextlib.suppress(OSError):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


PROGRESS_QUEUE = 256  # progress notifications waiting for a slow client; more are dropped, never the call


def _progress_sink(stream: Any) -> OnProgress:
    """A callback for the sandbox's reader thread that queues progress for the event loop."""
    token = anyio.lowlevel.current_token()

    def put(p: dict[str, Any]) -> None:
        try:
            anyio.from_thread.run_sync(stream.send_nowait, p, token=token)
        except Exception:  # noqa: S110 - full (a slow client), or the session is over: drop it
            pass

    return put


class _StdinLines:
    """stdin lines for the SDK's stdio transport, read by os.read on a daemon thread.

    The SDK's own reader blocks in a non-daemon worker thread, which kept the process alive after
    SIGTERM, SIGINT or a dead sandbox until the client closed our stdin; a daemon thread does not."""

    def __init__(self, fd: int = 0) -> None:
        self._send, self._recv = anyio.create_memory_object_stream[str](16)
        self._token = anyio.lowlevel.current_token()
        threading.Thread(target=self._pump, args=(fd,), name="toolcage-mcp-stdin", daemon=True).start()

    def _pump(self, fd: int) -> None:
        try:
            for line in _lines(fd):  # a line over 16 MiB becomes "{": the SDK answers it as a parse error
                anyio.from_thread.run(self._send.send, line.decode("utf-8", "replace"), token=self._token)
            anyio.from_thread.run_sync(self._send.close, token=self._token)
        except Exception:  # noqa: S110 - the loop is gone (session over): nobody reads the rest
            pass

    def __aiter__(self) -> AsyncIterator[str]:
        return self._recv.__aiter__()


class McpCage:
    """One MCP session's state: the tools it offers and the sandbox (or a factory of fresh ones) it calls.

    The session outlives its sandbox: when the sandbox ends (its run deadline, its idle timeout, a
    crash), the call that saw it end gets an ``isError`` result saying so and the next call starts
    a new sandbox (with an empty scratch). A sandbox the idle timeout ended ran no call, so the
    call that finds it so runs on the new one at once."""

    def __init__(self, make_sandbox: Callable[[], Sandbox], *, fresh_per_call: bool) -> None:
        self.make_sandbox = make_sandbox
        self.fresh_per_call = fresh_per_call
        self.sandbox: Sandbox | None = None
        self.tools: list[dict[str, Any]] = []
        self.restarts = 0  # sandboxes started after the first (the session's sandbox ended)
        self._calls_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._fresh: set[Sandbox] = set()  # --fresh-per-call: the sandboxes of the calls in flight
        self._closing = False
        self._tokens: set[str | int] = set()  # progress tokens of the calls in flight (the event loop's only)

    def start(self) -> None:
        """Before serving: start the session's sandbox (or one short-lived one) and read the tools.
        Errors here (policy, secrets, image, Docker) reach the CLI as they are."""
        sb = self.make_sandbox()
        try:
            sb.start()
            res = sb.call(TOOLS_LIST)
        except BaseException:
            sb.close()
            raise
        if not res.ok or not isinstance(res.result, list):
            sb.close()
            raise SandboxError("the sandbox did not list its tools", status=res.status)
        self.tools = mcp_tools(res.result)
        if self.fresh_per_call:
            sb.close()
        else:
            self.sandbox = sb

    def interrupt(self) -> None:
        """SIGINT/SIGTERM: kill every sandbox now; a call blocked in a worker thread then returns at once."""
        with self._calls_lock:
            self._closing = True
            live = [*self._fresh, *([self.sandbox] if self.sandbox is not None else [])]
        for sb in live:
            sb.interrupt()

    def close(self) -> None:
        with self._start_lock:
            self._closing = True
            if self.sandbox is not None:
                self.sandbox.close()

    def _session_sandbox(self) -> Sandbox:
        """The session's sandbox; a new one when the last has ended (raises if it cannot start)."""
        with self._start_lock:
            old = self.sandbox
            if old is not None and old.dead is None:
                return old
            if self._closing:
                raise interrupted_error(old.run_id if old is not None else "-")
            if old is not None:
                self.sandbox = None
                old.close()  # removed, its run recorded; a failure to start below leaves no sandbox
            sb = self.make_sandbox()
            sb.start()
            self.sandbox = sb
            self.restarts += 1
            ended = f" (the last one ended: {old.dead.status}, {old.dead.reason})" if old and old.dead else ""
            _note(f"toolcage mcp serve: started a new sandbox {sb.run_id}{ended}; scratch starts empty")
            return sb

    def _call(
        self, name: str, arguments: dict[str, Any] | None, on_progress: OnProgress | None, cancel: Cancel
    ) -> dict[str, Any]:
        """One tools/call, blocking (run in a worker thread)."""
        if self.fresh_per_call:
            sb = self.make_sandbox()
            with self._calls_lock:
                self._fresh.add(sb)
            try:
                with sb:
                    return call_content(sb.call(name, arguments, on_progress=on_progress, cancel=cancel))
            except SandboxError as exc:
                return sandbox_failure(exc)  # that call's sandbox only: the next call gets a new one
            finally:
                with self._calls_lock:
                    self._fresh.discard(sb)
        for _attempt in range(2):
            try:
                sb = self._session_sandbox()
            except ToolcageError as exc:
                return start_failure(exc)
            try:
                return call_content(sb.call(name, arguments, on_progress=on_progress, cancel=cancel))
            except SandboxError as exc:
                if exc.details.get("reason_detail") == "idle":
                    continue  # it ended idle, before this call: run the call on a new sandbox
                return sandbox_failure(exc, restarts=not self._closing)
        return start_failure(SandboxError("the sandbox ended twice before the call could run"))

    async def list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult.model_validate({"tools": self.tools})

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        # only the listed tools: the worker's own methods (tools.list, sandbox.usage) are not MCP tools
        if params.name not in {t["name"] for t in self.tools}:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
        token = progress_token_from_params(ctx.params)  # None: the client did not ask for progress
        if token is not None and token in self._tokens:
            # MCP: a token is unique among active requests; the client could not tell two calls' progress apart
            raise MCPError(types.INVALID_PARAMS, f"progress token {token!r} is in use by a call still in progress")
        if token is not None:
            self._tokens.add(token)
        try:
            return await self._call_tool(ctx, params, token)
        finally:
            if token is not None:
                self._tokens.discard(token)

    async def _call_tool(
        self, ctx: Any, params: types.CallToolRequestParams, token: str | int | None
    ) -> types.CallToolResult:
        cancel = Cancel()
        progress_in, progress_out = anyio.create_memory_object_stream[dict[str, Any]](PROGRESS_QUEUE)
        on_progress = _progress_sink(progress_in) if token is not None else None

        async def relay_progress() -> None:
            async with progress_out:
                async for p in progress_out:
                    await ctx.session.send_progress_notification(
                        token, p["progress"], p.get("total"), p.get("message"), related_request_id=ctx.request_id
                    )

        async with anyio.create_task_group() as tg:
            tg.start_soon(relay_progress)
            try:
                # the thread is abandoned on cancel: the client's notifications/cancelled (the SDK then
                # answers nothing), or a signal (interrupt() kills the sandboxes); the Cancel makes the
                # worker kill the call's processes, so the thread returns within moments
                out = await anyio.to_thread.run_sync(
                    self._call, params.name, params.arguments, on_progress, cancel, abandon_on_cancel=True
                )
            except anyio.get_cancelled_exc_class():
                cancel.cancel("cancelled by the MCP client")
                raise
            finally:
                progress_in.close()  # the relay sends what came before the answer, then ends
        return types.CallToolResult.model_validate(out)

    async def serve_stdio(self) -> None:
        """Serve MCP on stdin/stdout until EOF."""
        server: Server[Any] = Server(
            "toolcage", version=version("toolcage"), on_list_tools=self.list_tools, on_call_tool=self.call_tool
        )
        stdin: Any = _StdinLines()  # duck-typed: the transport only iterates it
        async with stdio_server(stdin=stdin) as (read, write):
            await server.run(read, write, server.create_initialization_options())


def serve(make_sandbox: Callable[[], Sandbox], *, fresh_per_call: bool) -> None:
    """Start the sandbox, serve MCP on stdio until EOF, remove the sandbox."""
    cage = McpCage(make_sandbox, fresh_per_call=fresh_per_call)
    cage.start()
    try:
        anyio.run(cage.serve_stdio)
    except BaseException:  # SystemExit from the CLI's SIGINT/SIGTERM handler, KeyboardInterrupt
        cage.interrupt()
        raise
    finally:
        cage.close()


__all__ = ["McpCage", "call_content", "code_images", "mcp_tools", "sandbox_failure", "serve", "start_failure"]
