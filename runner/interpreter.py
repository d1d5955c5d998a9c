"""A code interpreter with state, from the host: ``Sandbox.run_code`` and the Python contexts it runs in.

Shaped after E2B's code interpreter (``e2b_code_interpreter``), so code written for it reads the same:
:class:`Execution` (``results``, ``logs``, ``error``, ``execution_count``), :class:`Result` (one MIME bundle:
``text``, ``html``, ``markdown``, ``svg``, ``png``, ``jpeg``, ``pdf``, ``latex``, ``json``, ``javascript``,
``is_main_result``, ``extra``), :class:`Logs`, :class:`ExecutionError` and :class:`CodeContext` (E2B's
``Context``: ``id``, ``language``, ``cwd``). Every method is one call of the worker's ``code_*`` tools
(``worker.tools.interpreter``), so it works through every door that makes calls.

What a context keeps: the variables, imports and open files of one IPython shell, in a process of its own, until
it is restarted or removed, or the sandbox ends. What it does not: anything from another context (state apart),
or anything of the run from the code (every context runs as the run's one user: the sandbox is the boundary).

Errors: a cell's own exception is ``Execution.error`` (the context lives on); what the worker refuses (no such
context, 16 contexts already, an image whose Python cannot import IPython) raises
:class:`toolcage.errors.InterpreterError`; a bad argument, :class:`toolcage.errors.BadToolCall`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from toolcage.errors import BadToolCall, InterpreterError
from toolcage.policies import codes
from toolcage.results import CallResult

# the MIME types a Result carries, by E2B's attribute names (the worker keeps these and no others)
FORMATS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}

OnOutput = Callable[[str], Any]


@dataclass(frozen=True)
class Result:
    """One result of a cell: the last expression's value (``is_main_result``) or one ``display()``, as the MIME
    types it came in. Images (``png``, ``jpeg``, ``pdf``) are base64 text, as in Jupyter and E2B; nothing here is
    rendered: show it where it is safe to (it is the sandbox's output)."""

    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: str | None = None
    jpeg: str | None = None
    pdf: str | None = None
    latex: str | None = None
    json: dict[str, Any] | list[Any] | None = None
    javascript: str | None = None
    is_main_result: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def formats(self) -> list[str]:
        """The formats it has, by attribute name (``text`` aside, as E2B's)."""
        return [name for name in FORMATS.values() if name != "text" and getattr(self, name) is not None]

    def mime_bundle(self) -> dict[str, Any]:
        """As a Jupyter MIME bundle ({"image/png": ..., "text/plain": ...})."""
        return {mime: getattr(self, name) for mime, name in FORMATS.items() if getattr(self, name) is not None}

    @classmethod
    def from_bundle(cls, data: dict[str, Any], is_main_result: bool) -> Result:
        fields: dict[str, Any] = {}
        for mime, value in data.items():
            name = FORMATS.get(mime)
            if name is None:
                continue
            if name == "json" and not isinstance(value, dict | list):
                continue
            if name != "json" and not isinstance(value, str):
                continue
            fields[name] = value
        return cls(**fields, is_main_result=is_main_result)

    def __str__(self) -> str:
        return self.text or ""


@dataclass(frozen=True)
class Logs:
    """What the cell wrote, as it came: ``stdout`` and ``stderr``, each a list of the pieces."""

    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ExecutionError:
    """The exception that ended a cell: its class ``name``, ``value`` (str of it) and ``traceback`` (text)."""

    name: str
    value: str
    traceback: str


@dataclass(frozen=True)
class CodeContext:
    """A Python context (E2B's ``Context``): ``id``, ``language``, ``cwd``."""

    id: str
    language: str = "python"
    cwd: str | None = None


@dataclass(frozen=True)
class Execution:
    """What one cell returned (E2B's shape, plus toolcage's): ``results``, ``logs``, ``error`` (None when it
    raised nothing), ``execution_count``; ``context`` it ran in; ``status``: ``ok``, ``error``, ``interrupted``
    (a timeout or cancel stopped it with KeyboardInterrupt; the state is kept) or ``reset`` (the cell would not
    stop, or its process died, out of memory for one: the context starts afresh at the next cell);
    ``timed_out``; ``truncated`` (the logs were cut at the policy's output_cap); ``dropped`` (results or MIME
    types left out by the bounds); ``restarted`` (the context had been reset before this cell ran)."""

    results: list[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: ExecutionError | None = None
    execution_count: int | None = None
    context: str = "default"
    status: str = "ok"
    timed_out: bool = False
    truncated: bool = False
    dropped: dict[str, int] = field(default_factory=dict)
    restarted: bool = False

    @property
    def text(self) -> str | None:
        """The main result's text (the value of the cell's last expression), as E2B's ``Execution.text``."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def _answer(res: CallResult) -> dict[str, Any]:
    if res.ok and isinstance(res.result, dict):
        return res.result
    error = res.error or {}
    message = str(error.get("message") or res.status)
    if error.get("code") == codes.INVALID_PARAMS:
        raise BadToolCall(f"{res.tool}: {message}: {error.get('data')}")
    raise InterpreterError(f"{res.tool}: {message}", data=error.get("data"))


def execution(result: dict[str, Any]) -> Execution:
    """An Execution from code_run's answer."""
    logs = result.get("logs") or {}
    err = result.get("error")
    return Execution(
        results=[
            Result.from_bundle(r.get("data") or {}, bool(r.get("is_main_result")))
            for r in result.get("results") or []
            if isinstance(r, dict)
        ],
        logs=Logs(stdout=list(logs.get("stdout") or []), stderr=list(logs.get("stderr") or [])),
        error=ExecutionError(str(err.get("name", "")), str(err.get("value", "")), str(err.get("traceback", "")))
        if isinstance(err, dict)
        else None,
        execution_count=result.get("execution_count"),
        context=str(result.get("context", "default")),
        status=str(result.get("status", "ok")),
        timed_out=bool(result.get("timed_out")),
        truncated=bool(result.get("truncated")),
        dropped={str(k): int(v) for k, v in (result.get("dropped") or {}).items()},
        restarted=bool(result.get("restarted")),
    )


def _context(c: dict[str, Any]) -> CodeContext:
    return CodeContext(id=str(c["id"]), language=str(c.get("language", "python")), cwd=c.get("cwd"))


def _context_id(context: CodeContext | str | None) -> str | None:
    if context is None or isinstance(context, str):
        return context
    if isinstance(context, CodeContext):
        return context.id
    raise BadToolCall(f"context must be a CodeContext or its id, not {type(context).__name__}")


def run_params(code: str, context: CodeContext | str | None, timeout: float | None) -> dict[str, Any]:
    if not isinstance(code, str):
        raise BadToolCall(f"run_code() takes the code as a str, not {type(code).__name__}")
    params: dict[str, Any] = {"code": code}
    ctx = _context_id(context)
    if ctx is not None:
        params["context"] = ctx
    if timeout is not None:
        params["timeout_s"] = timeout
    return params


def progress_sink(on_stdout: OnOutput | None, on_stderr: OnOutput | None) -> Callable[[dict[str, Any]], None] | None:
    """An ``on_progress`` that hands the cell's output, as it comes, to ``on_stdout`` / ``on_stderr``."""
    if on_stdout is None and on_stderr is None:
        return None

    def sink(params: dict[str, Any]) -> None:
        text = params.get("message")
        if not isinstance(text, str):
            return
        target = on_stderr if params.get("stream") == "stderr" else on_stdout
        if target is not None:
            target(text)

    return sink


def _progress(on_stdout: OnOutput | None, on_stderr: OnOutput | None) -> dict[str, Any]:
    """call()'s on_progress, only when output is asked for (a cluster session's call streams none)."""
    sink = progress_sink(on_stdout, on_stderr)
    return {"on_progress": sink} if sink is not None else {}


def run_code(
    sandbox: Any,
    code: str,
    context: CodeContext | str | None = None,
    *,
    timeout: float | None = None,
    on_stdout: OnOutput | None = None,
    on_stderr: OnOutput | None = None,
    on_result: Callable[[Result], Any] | None = None,
    on_error: Callable[[ExecutionError], Any] | None = None,
) -> Execution:
    res = sandbox.call("code_run", run_params(code, context, timeout), **_progress(on_stdout, on_stderr))
    ex = execution(_answer(res))
    _callbacks(ex, on_result, on_error)
    return ex


async def run_code_async(
    sandbox: Any,
    code: str,
    context: CodeContext | str | None = None,
    *,
    timeout: float | None = None,
    on_stdout: OnOutput | None = None,
    on_stderr: OnOutput | None = None,
    on_result: Callable[[Result], Any] | None = None,
    on_error: Callable[[ExecutionError], Any] | None = None,
) -> Execution:
    res = await sandbox.call("code_run", run_params(code, context, timeout), **_progress(on_stdout, on_stderr))
    ex = execution(_answer(res))
    _callbacks(ex, on_result, on_error)
    return ex


def _callbacks(
    ex: Execution, on_result: Callable[[Result], Any] | None, on_error: Callable[[ExecutionError], Any] | None
) -> None:
    """E2B's on_result and on_error, called once the cell has ended (results come with the answer)."""
    if on_result is not None:
        for r in ex.results:
            on_result(r)
    if on_error is not None and ex.error is not None:
        on_error(ex.error)


def create_params(cwd: str | None, language: str) -> dict[str, Any]:
    if language != "python":
        raise BadToolCall(f"a context's language is python (the only one offered), not {language!r}")
    return {"cwd": cwd} if cwd is not None else {}


def create_context(sandbox: Any, cwd: str | None = None, language: str = "python") -> CodeContext:
    return _context(_answer(sandbox.call("code_context_create", create_params(cwd, language))))


async def create_context_async(sandbox: Any, cwd: str | None = None, language: str = "python") -> CodeContext:
    return _context(_answer(await sandbox.call("code_context_create", create_params(cwd, language))))


def list_contexts(sandbox: Any) -> list[CodeContext]:
    return [_context(c) for c in _answer(sandbox.call("code_context_list", {}))["contexts"]]


async def list_contexts_async(sandbox: Any) -> list[CodeContext]:
    return [_context(c) for c in _answer(await sandbox.call("code_context_list", {}))["contexts"]]


def _ctx_params(context: CodeContext | str) -> dict[str, Any]:
    ctx = _context_id(context)
    if ctx is None:
        raise BadToolCall("give the context (a CodeContext or its id)")
    return {"context": ctx}


def restart_context(sandbox: Any, context: CodeContext | str) -> None:
    _answer(sandbox.call("code_context_restart", _ctx_params(context)))


async def restart_context_async(sandbox: Any, context: CodeContext | str) -> None:
    _answer(await sandbox.call("code_context_restart", _ctx_params(context)))


def remove_context(sandbox: Any, context: CodeContext | str) -> None:
    _answer(sandbox.call("code_context_remove", _ctx_params(context)))


async def remove_context_async(sandbox: Any, context: CodeContext | str) -> None:
    _answer(await sandbox.call("code_context_remove", _ctx_params(context)))


class CodeInterpreter:
    """``run_code`` and the context methods, written once for every session whose ``call`` answers (``Sandbox``,
    ``ClusterSandbox``): each is one call of the worker's ``code_*`` tools through ``self.call``."""

    __slots__ = ()

    def run_code(
        self,
        code: str,
        context: CodeContext | str | None = None,
        *,
        timeout: float | None = None,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        on_result: Callable[[Result], Any] | None = None,
        on_error: Callable[[ExecutionError], Any] | None = None,
    ) -> Execution:
        """Run a cell of Python in a context that keeps its state across calls (an IPython shell; E2B's
        ``run_code``): the default context unless ``context`` names one. Returns an
        :class:`toolcage.interpreter.Execution`: ``results`` (the last expression's value and every
        ``display()`` as MIME bundles: HTML, PNG of a matplotlib figure, ...), ``logs``, ``error`` (the context
        survives it), ``execution_count``. ``timeout`` (default: the policy's call_s) interrupts the cell with
        KeyboardInterrupt and keeps the state. ``on_stdout``/``on_stderr`` get the output as it is written."""
        return run_code(
            self, code, context, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr,
            on_result=on_result, on_error=on_error,
        )  # fmt: skip

    def create_code_context(self, cwd: str | None = None, language: str = "python") -> CodeContext:
        """A new Python context, with fresh state (``cwd``: its working directory, default /scratch)."""
        return create_context(self, cwd, language)

    def list_code_contexts(self) -> list[CodeContext]:
        """The Python contexts of this sandbox (the default one once a cell ran in it)."""
        return list_contexts(self)

    def restart_code_context(self, context: CodeContext | str) -> None:
        """Drop a context's state: its process starts afresh, its id is kept."""
        restart_context(self, context)

    def remove_code_context(self, context: CodeContext | str) -> None:
        """Remove a context: its process ends."""
        remove_context(self, context)


class AsyncCodeInterpreter:
    """The same, awaited, for sessions whose ``call`` is a coroutine (``AsyncSandbox``, ``AsyncClusterSandbox``)."""

    __slots__ = ()

    async def run_code(
        self,
        code: str,
        context: CodeContext | str | None = None,
        *,
        timeout: float | None = None,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        on_result: Callable[[Result], Any] | None = None,
        on_error: Callable[[ExecutionError], Any] | None = None,
    ) -> Execution:
        """As :meth:`toolcage.Sandbox.run_code`, awaited."""
        return await run_code_async(
            self, code, context, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr,
            on_result=on_result, on_error=on_error,
        )  # fmt: skip

    async def create_code_context(self, cwd: str | None = None, language: str = "python") -> CodeContext:
        return await create_context_async(self, cwd, language)

    async def list_code_contexts(self) -> list[CodeContext]:
        return await list_contexts_async(self)

    async def restart_code_context(self, context: CodeContext | str) -> None:
        await restart_context_async(self, context)

    async def remove_code_context(self, context: CodeContext | str) -> None:
        await remove_context_async(self, context)


# ---- images out of a code_run answer, for the doors that show them as images -------------------------------
# A model should not read a chart as base64 text (a 100 KB PNG is ~35,000 tokens of noise): MCP's serve and
# the framework adapters send the JSON with each image replaced by a short placeholder, and the images beside it
# in their own way. The images are the sandbox's output (a cell may forge its display messages): only PNG and
# JPEG are taken, and only base64 that decodes to that format's signature.

IMAGE_MIMES: tuple[str, ...] = ("image/png", "image/jpeg")
_MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}


def checked_image(mime: str, value: object) -> str | None:
    """``value`` as clean base64 (whitespace removed) when it is a ``mime`` image (PNG or JPEG), else None."""
    if mime not in _MAGIC or not isinstance(value, str):
        return None
    b64 = "".join(value.split())
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        return None
    return b64 if raw.startswith(_MAGIC[mime]) else None


def split_images(result: Any, where: str = "beside this text") -> tuple[Any, list[dict[str, str]]]:
    """``code_run``'s answer with each PNG/JPEG value replaced by a placeholder naming the image (``where`` says
    where the reader finds it), and the images, in order, as ``{"mime": ..., "data": base64}``. Any other value
    comes back as it is, with no images."""
    if not isinstance(result, dict) or not isinstance(result.get("results"), list):
        return result, []
    images: list[dict[str, str]] = []
    results: list[Any] = []
    for r in result["results"]:
        data = r.get("data") if isinstance(r, dict) else None
        if not isinstance(data, dict) or not any(m in data for m in IMAGE_MIMES):
            results.append(r)
            continue
        data = dict(data)
        for mime in IMAGE_MIMES:
            if mime not in data:
                continue
            b64 = checked_image(mime, data[mime])
            if b64 is None:
                data[mime] = f"<{mime} left out: not base64 of a {mime.partition('/')[2].upper()} image>"
                continue
            images.append({"mime": mime, "data": b64})
            size = len(b64) * 3 // 4 - (len(b64) - len(b64.rstrip("=")))
            data[mime] = f"<{mime}, {size} bytes: image {len(images)}, {where}>"
        results.append({**r, "data": data})
    return {**result, "results": results}, images


__all__ = [
    "FORMATS",
    "IMAGE_MIMES",
    "AsyncCodeInterpreter",
    "CodeContext",
    "CodeInterpreter",
    "Execution",
    "ExecutionError",
    "Logs",
    "Result",
    "checked_image",
    "create_context",
    "execution",
    "list_contexts",
    "remove_context",
    "restart_context",
    "run_code",
    "split_images",
]
