"""Background processes and terminals from the host: :class:`Process` (``Sandbox.spawn``) and :class:`AsyncProcess`.

A handle is a sandbox and an id; every method is one call of the worker's ``proc_*`` tools
(``worker.tools.background``), so it works the same through every door that makes calls: a ``Sandbox``, an
``AsyncSandbox``, a pooled or a cluster sandbox. The handle keeps a read cursor of its own (:meth:`Process.read`
goes on where the last read ended); a client that reconnects makes a new handle with ``sandbox.process(id)``
and reads from any cursor it kept (``since``), or from 0 (what the sandbox still keeps: the last 1 MiB).

Errors: what the worker refuses (no such id, stdin closed, no terminal, 64 running already) raises
:class:`toolcage.errors.ProcessError`; a bad argument, :class:`toolcage.errors.BadToolCall`; the sandbox's own
failures, as any call's.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from toolcage.errors import BadToolCall, ProcessError
from toolcage.policies import codes
from toolcage.results import CallResult

_WAIT_GRACE_S = 30.0  # the runner waits this much longer than a wait the worker ends itself (a loaded gVisor
# sandbox starting many processes answered a 5 s wait more than 5 s late, and a late answer ends the sandbox)


@dataclass(frozen=True)
class ProcessOutput:
    """What one read returned: the bytes (``data``; ``text``, decoded), where the next read starts (``cursor``),
    how many bytes the sandbox no longer kept between ``since`` and what came (``dropped``), and the process's
    state then: ``running`` or ``exited``, with ``exit_code`` (negative: the signal's number) and ``signal``."""

    data: bytes
    cursor: int
    dropped: int
    state: str
    exit_code: int | None
    signal: str | None
    eof: bool

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")

    @property
    def running(self) -> bool:
        return self.state == "running"


class SpawnOptions(TypedDict, total=False):
    """``spawn()``'s keyword arguments, written once for every session (``**options: Unpack[SpawnOptions]``):
    ``argv`` (instead of a shell command), ``pty`` (True, or ``(rows, cols)``), ``cwd``, ``env``, ``stdin``
    (False: /dev/null), ``name`` (a label of your own)."""

    argv: Sequence[str] | None
    pty: bool | tuple[int, int]
    cwd: str | None
    env: Mapping[str, str] | None
    stdin: bool
    name: str | None


def start_params(command: str | None, **options: Unpack[SpawnOptions]) -> dict[str, Any]:
    """``proc_start``'s params from spawn()'s arguments."""
    argv, pty, cwd, env = options.get("argv"), options.get("pty", False), options.get("cwd"), options.get("env")
    stdin, name = options.get("stdin", True), options.get("name")
    if (command is None) == (argv is None):
        raise BadToolCall("spawn() takes a command (a shell string) or argv (a list), not both and not neither")
    params: dict[str, Any] = {"command": command} if command is not None else {"argv": list(argv or [])}
    if pty:
        params["pty"] = True
        if isinstance(pty, tuple):
            params["rows"], params["cols"] = pty
    if cwd is not None:
        params["cwd"] = cwd
    if env:
        params["env"] = dict(env)
    if not stdin:
        params["stdin"] = False
    if name is not None:
        params["name"] = name
    return params


def answer(res: CallResult) -> dict[str, Any]:
    """A proc_* call's result, or the error it means."""
    if res.ok and isinstance(res.result, dict):
        return res.result
    error = res.error or {}
    message = str(error.get("message") or res.status)
    if error.get("code") == codes.INVALID_PARAMS:
        raise BadToolCall(f"{res.tool}: {message}: {error.get('data')}")
    raise ProcessError(f"{res.tool}: {message}")


def output(result: dict[str, Any]) -> ProcessOutput:
    raw = result.get("output_b64")
    data = base64.b64decode(raw) if isinstance(raw, str) else str(result.get("output", "")).encode("utf-8")
    return ProcessOutput(
        data=data,
        cursor=int(result["cursor"]),
        dropped=int(result.get("dropped", 0)),
        state=str(result["state"]),
        exit_code=result.get("exit_code"),
        signal=result.get("signal"),
        eof=bool(result.get("eof")),
    )


def _read_params(proc_id: int, since: int, max_bytes: int, timeout: float) -> dict[str, Any]:
    params: dict[str, Any] = {"id": proc_id, "since": since, "max_bytes": max_bytes}
    if timeout:
        params["timeout_s"] = timeout
    return params


def _write_params(proc_id: int, data: bytes | str, eof: bool) -> dict[str, Any]:
    if isinstance(data, bytes):
        return {"id": proc_id, "data": base64.b64encode(data).decode("ascii"), "encoding": "base64", "eof": eof}
    return {"id": proc_id, "data": data, "eof": eof}


def _wait_params(
    proc_id: int, timeout: float | None, output: str | None, port: int | None, since: int
) -> dict[str, Any]:
    if output is not None and port is not None:
        raise BadToolCall("wait() takes output= or port=, not both")
    params: dict[str, Any] = {"id": proc_id}
    if output is not None:
        params.update(until="output", pattern=output, since=since)
    elif port is not None:
        params.update(until="port", port=port)
    else:
        params["until"] = "exit"
    if timeout is not None:
        params["timeout_s"] = timeout
    return params


def _call_timeout(params: dict[str, Any]) -> float | None:
    t = params.get("timeout_s")
    return float(t) + _WAIT_GRACE_S if isinstance(t, int | float) and t else None


class Process:
    """A process in the background of a sandbox (``Sandbox.spawn``): read its output, wait for it, type into
    it, signal or kill it. It lives until :meth:`kill` or the sandbox's end, across any number of calls."""

    def __init__(self, sandbox: Any, proc_id: int, pid: int | None = None, pty: bool = False) -> None:
        self.sandbox = sandbox
        self.id = proc_id
        self.pid = pid  # in the sandbox (as its worker sees it)
        self.pty = pty
        self.cursor = 0  # where the next read() starts

    def __repr__(self) -> str:
        return f"Process(id={self.id}, pid={self.pid}, pty={self.pty})"

    def _call(self, tool: str, params: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        return answer(self.sandbox.call(tool, params, timeout=timeout))

    def read(self, since: int | None = None, *, max_bytes: int = 65536, timeout: float = 0) -> ProcessOutput:
        """Its output from ``since`` (default: where the last read ended), at most ``max_bytes``, waiting up to
        ``timeout`` seconds for some when none is there yet. Moves the handle's cursor."""
        params = _read_params(self.id, self.cursor if since is None else since, max_bytes, timeout)
        out = output(self._call("proc_read", params, _call_timeout(params)))
        self.cursor = out.cursor
        return out

    def wait(
        self, timeout: float | None = None, *, output: str | None = None, port: int | None = None, since: int = 0
    ) -> bool:
        """Wait until it exits (the default), its output from ``since`` matches the regular expression
        ``output``, or something in the sandbox listens on TCP ``port``; False if ``timeout`` (seconds; default
        the policy's call timeout) passed first."""
        params = _wait_params(self.id, timeout, output, port, since)
        return bool(self._call("proc_wait", params, _call_timeout(params))["met"])

    def write(self, data: bytes | str) -> int:
        """Type into its stdin (a terminal's keystrokes: ``"\\x03"`` is Ctrl-C). Returns the bytes written."""
        return int(self._call("proc_write", _write_params(self.id, data, False))["written"])

    def close_stdin(self) -> None:
        """Close its stdin (on a terminal: type Ctrl-D)."""
        self._call("proc_write", _write_params(self.id, "", True))

    def signal(self, name: str = "SIGTERM") -> None:
        self._call("proc_signal", {"id": self.id, "signal": name})

    def kill(self) -> dict[str, Any]:
        """Kill it and everything it started; its state after (``exited``, ``signal`` SIGKILL)."""
        return self._call("proc_kill", {"id": self.id})

    def resize(self, rows: int, cols: int) -> None:
        self._call("proc_resize", {"id": self.id, "rows": rows, "cols": cols})

    def info(self) -> dict[str, Any]:
        """Its entry in ``Sandbox.processes()``: command, state, exit_code, times, output size."""
        for entry in self.sandbox.processes():
            if entry["id"] == self.id:
                return dict(entry)
        raise ProcessError(f"no background process {self.id} (it was forgotten: 128 entries are kept)")


class AsyncProcess:
    """:class:`Process` for an ``AsyncSandbox``: the same methods, awaited."""

    def __init__(self, sandbox: Any, proc_id: int, pid: int | None = None, pty: bool = False) -> None:
        self.sandbox = sandbox
        self.id = proc_id
        self.pid = pid
        self.pty = pty
        self.cursor = 0

    def __repr__(self) -> str:
        return f"AsyncProcess(id={self.id}, pid={self.pid}, pty={self.pty})"

    async def _call(self, tool: str, params: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        call: Callable[..., Awaitable[CallResult]] = self.sandbox.call
        return answer(await call(tool, params, timeout=timeout))

    async def read(self, since: int | None = None, *, max_bytes: int = 65536, timeout: float = 0) -> ProcessOutput:
        params = _read_params(self.id, self.cursor if since is None else since, max_bytes, timeout)
        out = output(await self._call("proc_read", params, _call_timeout(params)))
        self.cursor = out.cursor
        return out

    async def wait(
        self, timeout: float | None = None, *, output: str | None = None, port: int | None = None, since: int = 0
    ) -> bool:
        params = _wait_params(self.id, timeout, output, port, since)
        return bool((await self._call("proc_wait", params, _call_timeout(params)))["met"])

    async def write(self, data: bytes | str) -> int:
        return int((await self._call("proc_write", _write_params(self.id, data, False)))["written"])

    async def close_stdin(self) -> None:
        await self._call("proc_write", _write_params(self.id, "", True))

    async def signal(self, name: str = "SIGTERM") -> None:
        await self._call("proc_signal", {"id": self.id, "signal": name})

    async def kill(self) -> dict[str, Any]:
        return await self._call("proc_kill", {"id": self.id})

    async def resize(self, rows: int, cols: int) -> None:
        await self._call("proc_resize", {"id": self.id, "rows": rows, "cols": cols})


def spawn(sandbox: Any, command: str | None = None, **options: Unpack[SpawnOptions]) -> Process:
    """``sandbox.spawn(...)`` for any session with a ``call`` (``Sandbox``, a cluster session)."""
    got = answer(sandbox.call("proc_start", start_params(command, **options)))
    return Process(sandbox, int(got["id"]), got.get("pid"), bool(got.get("pty")))


async def spawn_async(sandbox: Any, command: str | None = None, **options: Unpack[SpawnOptions]) -> AsyncProcess:
    """``await sandbox.spawn(...)`` for any async session with an awaitable ``call``."""
    got = answer(await sandbox.call("proc_start", start_params(command, **options)))
    return AsyncProcess(sandbox, int(got["id"]), got.get("pid"), bool(got.get("pty")))


def listing(sandbox: Any) -> list[dict[str, Any]]:
    return list(answer(sandbox.call("proc_list", {}))["processes"])


async def listing_async(sandbox: Any) -> list[dict[str, Any]]:
    return list(answer(await sandbox.call("proc_list", {}))["processes"])


__all__ = [
    "AsyncProcess", "Process", "ProcessOutput", "SpawnOptions", "answer", "listing", "listing_async", "output", "spawn",
    "spawn_async", "start_params",
]  # fmt: skip
