"""A code interpreter with state: Python contexts that keep their variables across calls, with rich results.

Each context is one IPython shell in a process of its own (``worker.children.pyshell``), started as a
background process (``worker.tools.background.launch``), so the sweep keeps it across calls, the memory guard
watches it under gVisor, and the run's end ends it. Its stdin and stdout are a channel of JSON lines; its
stderr is its background output (``proc_read`` shows what IPython itself said).

``code_run`` sends a cell and collects, until the shell says ``done``: the cell's stdout and stderr (streamed as
progress while it runs, kept up to the policy's ``output_cap``), its results as MIME bundles (the last
expression's value, ``is_main_result``, and every ``display()``: HTML of a DataFrame, a PNG of a matplotlib
figure), its error (name, value, traceback; the context survives it) and its ``execution_count``. A timeout
or a cancel sends SIGINT: the cell ends with a ``KeyboardInterrupt`` and the context keeps its state; a cell
that does not stop within ``INTERRUPT_GRACE_S`` is killed and its context starts afresh (``status: reset``),
as does a context whose process died (out of memory: the kernel's OOM killer or, under gVisor, the memory
guard picks the biggest process, the cell's).

Everything the shell sends is the cell's to forge (same process): each message is parsed within
``LINE_MAX``, MIME types are kept from ``MIMES`` only, each value within ``VALUE_MAX``, at most
``OUTPUTS_MAX`` results and ``RESULTS_MAX`` bytes of them per cell; what is left out is counted in
``dropped``. Nothing is rendered here.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import threading
import time
from typing import Annotated, Any, Literal

from annotated_types import Gt, Le, MaxLen

from toolcage.policies.contract import CODE_INTERRUPT_S, CODE_START_S
from toolcage.worker import calls
from toolcage.worker.children import background
from toolcage.worker.children.sweep import CODE_CALLS
from toolcage.worker.errors import ToolError
from toolcage.worker.settings import Settings
from toolcage.worker.tools import Tool
from toolcage.worker.tools._params import doc, params
from toolcage.worker.tools.background import WAIT_MAX_S, launch
from toolcage.worker.tools.exec import workdir
from toolcage.worker.tools.paths import MAX_PATH
from toolcage.worker.tools.proc import _child_env, _image_env, image_program

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYSHELL = os.path.join(_HERE, "children", "pyshell.py")
# IPython for the contexts, installed apart from the worker's own packages (image/Dockerfile): last on a
# context's PYTHONPATH, so an image's own IPython (and its packages) come first
KERNEL_LIB = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "kernel")

MAX_CONTEXTS = 16  # contexts at once in a run (each is a process of ~60 MiB)
START_S = CODE_START_S  # how long a context may take to say it is ready (IPython's import, under gVisor)
INTERRUPT_GRACE_S = CODE_INTERRUPT_S  # after SIGINT, how long a cell has to stop before it is killed
OUTPUTS_MAX = 100  # results one cell may return
TRACEBACK_MAX = 64 * 1024
CODE_MAX = 1 << 20
# the MIME types a result may carry (Jupyter's and E2B's); anything else is dropped, and counted
MIMES = (
    "text/plain",
    "text/html",
    "text/markdown",
    "text/latex",
    "image/png",
    "image/jpeg",
    "image/svg+xml",
    "application/json",
    "application/javascript",
    "application/pdf",
)


def _sizes(s: Settings) -> tuple[int, int, int]:
    """(one value, one cell's results, one message line) in encoded bytes, from the output cap: an answer
    stays within what the runner reads from the worker (16 x output_cap + 1 MiB)."""
    cap = s.policy.limits.output_cap
    return 4 * cap, 8 * cap, 4 * cap + 65536


@params
class RunParams:
    code: Annotated[str, MaxLen(CODE_MAX)] = doc("Python code (a cell: IPython syntax, `!cmd` and `%magic` too)")
    context: Annotated[str, MaxLen(64)] | None = doc(
        "the context's id (code_context_create's answer); default: the run's default context", None
    )
    timeout_s: Annotated[float, Gt(0), Le(WAIT_MAX_S)] | None = doc(
        "seconds before the cell is interrupted; default the policy's call timeout", None
    )


@params
class CreateParams:
    cwd: Annotated[str, MaxLen(MAX_PATH)] | None = doc("its working directory, as exec's; default /scratch", None)
    language: Literal["python"] = doc("the context's language (Python only)", "python")


@params
class ContextParams:
    context: Annotated[str, MaxLen(64)] = doc("the context's id")


@params
class NoParams:
    pass


DEPTH_MAX = 64  # nesting of a message's JSON: deeper breaks a recursive encoder (this answer's, the runner's)


def _shallow(obj: object) -> bool:
    """Whether ``obj`` nests at most ``DEPTH_MAX`` deep (walked without recursion)."""
    stack = [(obj, 0)]
    while stack:
        o, depth = stack.pop()
        children = o.values() if isinstance(o, dict) else o if isinstance(o, list) else None
        if children is None:
            continue
        if depth >= DEPTH_MAX:
            return False
        stack.extend((c, depth + 1) for c in children)
    return True


class _Lines:
    """The channel's messages, one JSON object per line, each line within ``limit`` bytes (a longer one is
    skipped whole, and counted)."""

    def __init__(self, fd: int, limit: int) -> None:
        self.fd = fd
        self.limit = limit
        self.buf = bytearray()
        self.skipping = False
        self.skipped = 0
        self.eof = False
        os.set_blocking(fd, False)

    def next(self, deadline: float, stop: Any = None) -> dict[str, Any] | None:
        """The next message; None at the deadline, when ``stop()``, or at the end of the channel."""
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line = bytes(self.buf[:nl])
                del self.buf[: nl + 1]
                if self.skipping:
                    self.skipping = False
                    continue
                with contextlib.suppress(ValueError, UnicodeDecodeError, RecursionError):
                    msg = json.loads(line)
                    if isinstance(msg, dict) and _shallow(msg):
                        return msg
                continue
            if self.eof:
                return None
            left = deadline - time.monotonic()
            if left <= 0 or (stop is not None and stop()):
                return None
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.1))
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self.eof = True
                continue
            self.buf += chunk
            if self.buf.find(b"\n") < 0 and len(self.buf) > self.limit:
                self.skipped += 1
                self.skipping = True
                self.buf.clear()
            elif self.skipping and (nl := self.buf.find(b"\n")) >= 0:
                del self.buf[: nl + 1]
                self.skipping = False
            elif self.skipping:
                self.buf.clear()


class Context:
    def __init__(self, ctx_id: str, cwd: str | None) -> None:
        self.id = ctx_id
        self.cwd = cwd
        self.lock = threading.Lock()  # one cell at a time
        self.proc: background.Proc | None = None
        self.chan_in = -1
        self.lines: _Lines | None = None
        self.info: dict[str, Any] = {}
        self.execution_count = 0
        self.created_at = time.time()
        self.resets = 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.running and not self.proc.killed and not self.lines_eof()

    def lines_eof(self) -> bool:
        return self.lines is None or self.lines.eof

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "language": "python",
            "cwd": self.cwd,
            "running": self.alive(),
            "busy": self.lock.locked(),
            "execution_count": self.execution_count,
            "resets": self.resets,
            "process": self.proc.id if self.proc is not None else None,
            "python": self.info.get("python"),
            "ipython": self.info.get("ipython"),
            "created_at": round(self.created_at, 3),
        }

    def close(self) -> None:
        """Kill its process (its state goes with it) and close the channel."""
        if self.proc is not None and not self.proc.killed:
            background.kill(self.proc)
        for fd in (self.chan_in, self.lines.fd if self.lines is not None else -1):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.chan_in = -1
        self.lines = None
        self.proc = None


_lock = threading.Lock()
_contexts: dict[str, Context] = {}
_next = 1
DEFAULT = "default"


def _env(s: Settings) -> dict[str, str]:
    env = dict(_image_env(s) if s.image is not None else _child_env(s))
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if os.path.isdir(KERNEL_LIB):
        paths.append(KERNEL_LIB)
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    return env


def _start(s: Settings, ctx: Context) -> None:
    """Start the context's shell and wait for it to say ready (or why it cannot serve)."""
    if s.image is not None:
        python = image_program(s, ("python3", "python"), "Python")
        cwd = ctx.cwd or s.image.default_dir(s.scratch)
    else:
        python, cwd = sys.executable, ctx.cwd or s.scratch
    info = {"command": None, "argv": [python, PYSHELL], "cwd": cwd, "pty": False, "name": f"python context {ctx.id}"}
    with CODE_CALLS.starting():  # registered (kept) before any sweep looks
        proc, chan = launch(s, [python, PYSHELL], cwd, _env(s), info, stdin=False, channel=True)
    assert chan is not None
    ctx.proc, ctx.chan_in, ctx.cwd = proc, chan[0], cwd
    ctx.lines = _Lines(chan[1], _sizes(s)[2])
    ctx.execution_count = 0
    msg = ctx.lines.next(time.monotonic() + START_S, lambda: background.closing())
    if msg is not None and msg.get("t") == "ready":
        ctx.info = {k: str(msg.get(k))[:64] for k in ("python", "ipython")}
        return
    said = _said(proc)
    ctx.close()
    if msg is not None and msg.get("t") == "fatal":
        where = "this image's Python" if s.image is not None else "the worker image"
        raise ToolError(
            f"{where} cannot run a Python context: it cannot import {str(msg.get('missing'))[:40]} "
            f"({str(msg.get('message'))[:300]}); the image's python3 needs IPython>=8 (pip install ipython)",
            {"missing": str(msg.get("missing"))[:40]},
        )
    raise ToolError(f"the Python context did not start within {START_S:.0f}s: {said or 'it said nothing'}")


def _said(proc: background.Proc) -> str:
    with background.locked():
        got = background.read(proc, 0, 4096)
    data: bytes = got["data"]
    return data.decode("utf-8", "replace").strip()[-1000:]


def _get(ctx_id: str) -> Context:
    with _lock:
        ctx = _contexts.get(ctx_id)
    if ctx is None:
        raise ToolError(f"no Python context {ctx_id!r} (code_context_list names them)", {"context": ctx_id})
    return ctx


def _new(s: Settings, ctx_id: str | None, cwd: str | None) -> Context:
    global _next
    with _lock:
        if ctx_id is not None and ctx_id in _contexts:
            return _contexts[ctx_id]  # the default context, made by a call beside this one
        if len(_contexts) >= MAX_CONTEXTS:
            raise ToolError(
                f"{len(_contexts)} Python contexts exist already (at most {MAX_CONTEXTS}): remove one first",
                {"max": MAX_CONTEXTS},
            )
        if ctx_id is None:
            ctx_id = f"ctx-{_next}"
            _next += 1
        ctx = Context(ctx_id, cwd)
        _contexts[ctx_id] = ctx
    with ctx.lock:
        try:
            _start(s, ctx)
        except BaseException:
            with _lock:
                _contexts.pop(ctx_id, None)
            raise
    return ctx


def create(s: Settings, p: CreateParams) -> dict[str, Any]:
    cwd = workdir(s, p.cwd) if p.cwd is not None else None
    return _new(s, None, cwd).describe()


def listing(s: Settings, p: NoParams) -> dict[str, Any]:
    with _lock:
        ctxs = list(_contexts.values())
    return {"contexts": [c.describe() for c in ctxs]}


def restart(s: Settings, p: ContextParams) -> dict[str, Any]:
    ctx = _get(p.context)
    if not ctx.lock.acquire(timeout=INTERRUPT_GRACE_S):
        _interrupt(ctx)
        if not ctx.lock.acquire(timeout=INTERRUPT_GRACE_S + 1):
            raise ToolError(f"context {p.context!r} runs a cell that does not stop: try again", {"context": p.context})
    try:
        ctx.close()
        ctx.resets += 1
        _start(s, ctx)
    finally:
        ctx.lock.release()
    return ctx.describe()


def remove(s: Settings, p: ContextParams) -> dict[str, Any]:
    ctx = _get(p.context)
    with _lock:
        _contexts.pop(p.context, None)
    ctx.close()  # a running cell's call sees its channel end
    return {"removed": p.context}


def _interrupt(ctx: Context) -> None:
    if ctx.proc is not None and ctx.proc.running:
        with contextlib.suppress(background.Refused):
            background.send_signal(ctx.proc, signal.SIGINT)


def _write(ctx: Context, data: bytes) -> None:
    fd = ctx.chan_in
    view = memoryview(data)
    deadline = time.monotonic() + 10.0
    os.set_blocking(fd, False)
    while view:
        try:
            view = view[os.write(fd, view[: 1 << 16]) :]
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise ToolError(f"context {ctx.id!r} takes no input (its shell is stuck)") from None
            time.sleep(0.005)
        except OSError:
            raise ToolError(f"context {ctx.id!r} ended") from None


class _Cell:
    """What one cell returns, bounded as it comes."""

    def __init__(self, s: Settings) -> None:
        self.value_max, self.results_max, _ = _sizes(s)
        self.cap = s.policy.limits.output_cap
        self.results: list[dict[str, Any]] = []
        self.results_bytes = 0
        self.logs: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.log_bytes = 0
        self.truncated = False
        self.error: dict[str, str] | None = None
        self.count: int | None = None
        self.dropped = {"results": 0, "values": 0, "mime_types": 0, "messages": 0}
        self.done = False

    def take(self, msg: dict[str, Any]) -> None:
        t = msg.get("t")
        if t == "stream":
            self._stream(msg)
        elif t == "display":
            self._display(msg)
        elif t == "clear":
            self.results = [r for r in self.results if r["is_main_result"]]
            self.results_bytes = sum(r["_size"] for r in self.results)
        elif t == "error":
            self.error = {
                k: str(msg.get(k, ""))[: TRACEBACK_MAX if k == "traceback" else 4096]
                for k in ("name", "value", "traceback")
            }
        elif t == "done":
            count = msg.get("execution_count")
            self.count = count if isinstance(count, int) and not isinstance(count, bool) else None
            self.done = True
        else:
            self.dropped["messages"] += 1

    def _stream(self, msg: dict[str, Any]) -> None:
        name, text = msg.get("name"), msg.get("text")
        if name not in ("stdout", "stderr") or not isinstance(text, str):
            self.dropped["messages"] += 1
            return
        data = text.encode("utf-8", "replace")
        room = self.cap - self.log_bytes
        call = calls.current()
        if call is not None:
            call.output(name, data, room)
        if room <= 0:
            self.truncated = True
            return
        if len(data) > room:
            data = data[:room]
            text = data.decode("utf-8", "ignore")
            self.truncated = True
        self.log_bytes += len(data)
        logs = self.logs[name]
        logs.append(text)

    def _display(self, msg: dict[str, Any]) -> None:
        data = msg.get("data")
        if not isinstance(data, dict):
            self.dropped["messages"] += 1
            return
        if len(self.results) >= OUTPUTS_MAX:
            self.dropped["results"] += 1
            return
        bundle: dict[str, Any] = {}
        size = 0
        for mime, value in data.items():
            if mime not in MIMES:
                self.dropped["mime_types"] += 1
                continue
            if mime != "application/json" and not isinstance(value, str):
                self.dropped["values"] += 1
                continue
            n = len(json.dumps(value))
            if n > self.value_max:
                self.dropped["values"] += 1
                continue
            bundle[mime] = value
            size += n
        if not bundle:
            return
        if self.results_bytes + size > self.results_max:
            self.dropped["results"] += 1
            return
        self.results_bytes += size
        self.results.append({"data": bundle, "is_main_result": msg.get("main") is True, "_size": size})

    def answer(self, ctx: Context, status: str, timed_out: bool) -> dict[str, Any]:
        call = calls.current()
        if call is not None:
            call.flush(final=True)
        return {
            "context": ctx.id,
            "status": status,
            "results": [{k: v for k, v in r.items() if k != "_size"} for r in self.results],
            "logs": self.logs,
            "error": self.error,
            "execution_count": self.count,
            "timed_out": timed_out,
            "truncated": self.truncated,
            "dropped": {k: v for k, v in self.dropped.items() if v},
        }


def run(s: Settings, p: RunParams) -> dict[str, Any]:
    ctx_id = p.context or DEFAULT
    with _lock:
        ctx = _contexts.get(ctx_id)
    if ctx is None:
        if ctx_id != DEFAULT:
            raise ToolError(f"no Python context {ctx_id!r} (code_context_list names them)", {"context": ctx_id})
        ctx = _new(s, DEFAULT, None)
    timeout = p.timeout_s if p.timeout_s is not None else s.policy.timeouts.call_s
    begun = time.monotonic()
    if not ctx.lock.acquire(timeout=timeout):
        raise ToolError(f"context {ctx_id!r} ran another cell for the whole timeout", {"context": ctx_id})
    try:
        reset_before = False
        if not ctx.alive():
            ctx.close()
            ctx.resets += 1
            reset_before = True
            started = time.monotonic()
            _start(s, ctx)
            begun += time.monotonic() - started  # a start is not the cell's time (the runner waits for it)
        cell = _Cell(s)
        _write(ctx, (json.dumps({"code": p.code}) + "\n").encode())
        answer = _collect(ctx, cell, begun + timeout)
        if reset_before:
            answer["restarted"] = True  # its state was lost before this cell (a cell before it died)
        return answer
    finally:
        ctx.lock.release()


def _collect(ctx: Context, cell: _Cell, deadline: float) -> dict[str, Any]:
    assert ctx.lines is not None
    lines = ctx.lines

    def stop() -> bool:
        return calls.cancelled() or background.closing()

    while True:
        msg = lines.next(deadline, stop)
        if msg is not None:
            cell.take(msg)
            if cell.done:
                ctx.execution_count = cell.count or ctx.execution_count
                return cell.answer(ctx, "error" if cell.error else "ok", False)
            continue
        if lines.eof:
            return _died(ctx, cell)
        break  # the deadline, or a cancel
    timed_out = not calls.cancelled()
    _interrupt(ctx)
    grace = time.monotonic() + INTERRUPT_GRACE_S
    while True:
        msg = lines.next(grace)
        if msg is None:
            break
        cell.take(msg)
        if cell.done:
            ctx.execution_count = cell.count or ctx.execution_count
            return cell.answer(ctx, "interrupted", timed_out)
    if lines.eof:
        return _died(ctx, cell)
    ctx.close()  # it would not stop: its state goes, the next cell starts a fresh one
    cell.error = {
        "name": "TimeoutError" if timed_out else "Interrupted",
        "value": f"the cell did not stop within {INTERRUPT_GRACE_S:.0f}s of SIGINT: its context was reset",
        "traceback": "",
    }
    return cell.answer(ctx, "reset", timed_out)


def _died(ctx: Context, cell: _Cell) -> dict[str, Any]:
    proc = ctx.proc
    how = "ended"
    if proc is not None:
        background.wait(lambda: not proc.running, 2.0, lambda: False)
        fields = proc.exit_fields()
        if fields.get("signal"):
            how = f"was killed by {fields['signal']}"
        elif fields.get("exit_code") is not None:
            how = f"exited with code {fields['exit_code']}"
    oom = " (its memory passed the sandbox's limit? limits.memory)" if "SIGKILL" in how else ""
    ctx.close()
    cell.error = {
        "name": "ContextDied",
        "value": f"the context's Python {how}{oom}: its state is lost, the next cell starts afresh",
        "traceback": "",
    }
    return cell.answer(ctx, "reset", False)


def shutdown() -> None:
    with _lock:
        ctxs = list(_contexts.values())
        _contexts.clear()
    for ctx in ctxs:
        with contextlib.suppress(Exception):
            ctx.close()


_WHAT = (
    "A context is one IPython shell in its own process: variables, imports and open files persist between "
    "cells until it is restarted or removed; a timeout or cancel interrupts the cell (KeyboardInterrupt) and "
    "keeps the state. Contexts share the run's user and files: they keep state apart, not secrets."
)
_RETURNS = (
    "returns results (MIME bundles: text/plain, text/html, image/png of a matplotlib figure, ...; "
    "is_main_result marks the last expression's value), logs {stdout, stderr}, error {name, value, traceback} "
    "or null, execution_count, status (ok, error, interrupted, reset), timed_out, truncated, dropped"
)

TOOLS = [
    Tool(
        "code_run",
        f"Run Python code in a stateful context (IPython); {_RETURNS}. {_WHAT}",
        RunParams,
        run,
        in_process_timeout=False,
        waits=True,
    ),
    Tool(
        "code_context_create",
        f"Create a Python context (fresh state) and return its id. {_WHAT}",
        CreateParams,
        create,
        in_process_timeout=False,
        runs_code=True,
    ),
    Tool("code_context_list", "List the Python contexts.", NoParams, listing),
    Tool(
        "code_context_restart",
        "Restart a Python context: its state is dropped, its id kept.",
        ContextParams,
        restart,
        in_process_timeout=False,
        runs_code=True,
    ),
    Tool(
        "code_context_remove",
        "Remove a Python context (its process ends).",
        ContextParams,
        remove,
        in_process_timeout=False,
    ),
]
