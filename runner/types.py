"""The session surface, written once: what every session a user holds offers, sync and async.

``SandboxLike`` is what ``Sandbox`` (and ``ClusterSandbox``) offers; ``AsyncSandboxLike`` what
``AsyncSandbox`` (and ``AsyncClusterSandbox``) offers. They are ``typing.Protocol`` classes, checked by
the type checker, not at run time: each session class is assigned to its Protocol under
``TYPE_CHECKING`` (below for the library's own, beside the class for the others), so a method added
to one session and not to the others fails ``.ci/typecheck`` (mypy --strict) with the missing
member named. Code that takes "a session" (the framework adapters, a helper of your own) annotates
with these and works with a local, pooled or cluster session alike.

Only the common surface is here: a door may offer more (``Sandbox.call``'s ``on_progress`` and
``cancel``, ``Sandbox.interrupt``), never less.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Protocol, Self, Unpack

if TYPE_CHECKING:
    from toolcage.files.changes import Changes
    from toolcage.files.download import DownloadResult
    from toolcage.files.snapshot import SnapshotInfo
    from toolcage.files.upload import UploadResult
    from toolcage.interpreter import CodeContext, Execution, ExecutionError, Result
    from toolcage.processes import AsyncProcess, Process, SpawnOptions
    from toolcage.results import CallResult, NetworkChange, RunSummary

# a snapshot's target: a path, or a binary stream it is written to
SnapshotTarget = str | os.PathLike[str] | IO[bytes]


class SandboxLike(Protocol):
    """One run of the worker, as its user holds it (``with ... as sb:``), synchronously."""

    @property
    def run_id(self) -> str | None:
        """The run's id (its containers' label and name part); a cluster session's is None until it starts."""
        ...

    @property
    def summary(self) -> RunSummary | None:
        """Wall time, CPU time, peak memory and calls of the run, once it is closed; None before."""
        ...

    def start(self) -> Self:
        """Start the run (a context manager does it on entry)."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None, /
    ) -> None: ...

    def call(self, tool: str, params: dict[str, Any] | None = None, *, timeout: float | None = None) -> CallResult:
        """Call a tool in the sandbox: a tool's outcome comes back as a CallResult, a sandbox failure raises."""
        ...

    def upload(self, local_path: str | os.PathLike[str], remote_dir: str) -> UploadResult:
        """Copy a local file or directory into ``remote_dir`` under /scratch."""
        ...

    def download(
        self,
        remote_path: str,
        local_dir: str | os.PathLike[str],
        *,
        max_bytes: int | None = None,
        max_files: int | None = None,
    ) -> DownloadResult:
        """Copy a file or directory out of /scratch or /workspace into ``local_dir``."""
        ...

    def write_files(self, files: Mapping[str, bytes | str], *, mode: int = 0o644) -> UploadResult:
        """Write many files in one upload: ``{path: content}``."""
        ...

    def read_files(self, paths: Iterable[str], *, missing_ok: bool = False) -> dict[str, bytes]:
        """Read many files in one download: ``{path: bytes}``."""
        ...

    def changes(self, *, download_to: str | os.PathLike[str] | None = None, max_bytes: int | None = None) -> Changes:
        """What the run changed in its writable workspace copy, against the host's workspace."""
        ...

    def snapshot(self, target: SnapshotTarget) -> SnapshotInfo:
        """Write what the session holds to ``target``, to resume in a fresh sandbox."""
        ...

    def update_network(self, network: Any, *, requested_by: str | None = None) -> NetworkChange:
        """Replace the running sandbox's egress policy (its ``network:`` section) at once; the change in force."""
        ...

    def spawn(self, command: str | None = None, **options: Unpack[SpawnOptions]) -> Process:
        """Start a background process (``argv=``, ``pty=``, ``cwd=``, ``env=``, ``stdin=``, ``name=``): its handle."""
        ...

    def process(self, proc_id: int) -> Process:
        """A handle on a background process started earlier, by its id."""
        ...

    def processes(self) -> list[dict[str, Any]]:
        """Every background process the sandbox keeps."""
        ...

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
        """Run a cell of Python in a context that keeps its state (toolcage.interpreter)."""
        ...

    def create_code_context(self, cwd: str | None = None, language: str = "python") -> CodeContext:
        """A new Python context, with fresh state."""
        ...

    def list_code_contexts(self) -> list[CodeContext]:
        """The Python contexts of the sandbox."""
        ...

    def restart_code_context(self, context: CodeContext | str) -> None:
        """Drop a context's state, keep its id."""
        ...

    def remove_code_context(self, context: CodeContext | str) -> None:
        """Remove a context."""
        ...

    def usage(self) -> dict[str, Any]:
        """CPU time and peak memory of the whole sandbox so far."""
        ...

    def close(self) -> RunSummary | None:
        """End the run and remove the sandbox (unless kept); idempotent."""
        ...


class AsyncSandboxLike(Protocol):
    """One run of the worker, as its user holds it (``async with ... as sb:``), in an event loop."""

    @property
    def run_id(self) -> str | None:
        """As :attr:`SandboxLike.run_id`."""
        ...

    @property
    def summary(self) -> RunSummary | None:
        """As :attr:`SandboxLike.summary`."""
        ...

    async def start(self) -> Self: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None, /
    ) -> None: ...

    async def call(
        self, tool: str, params: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> CallResult: ...

    async def upload(self, local_path: str | os.PathLike[str], remote_dir: str) -> UploadResult: ...

    async def download(
        self,
        remote_path: str,
        local_dir: str | os.PathLike[str],
        *,
        max_bytes: int | None = None,
        max_files: int | None = None,
    ) -> DownloadResult: ...

    async def write_files(self, files: Mapping[str, bytes | str], *, mode: int = 0o644) -> UploadResult: ...

    async def read_files(self, paths: Iterable[str], *, missing_ok: bool = False) -> dict[str, bytes]: ...

    async def changes(
        self, *, download_to: str | os.PathLike[str] | None = None, max_bytes: int | None = None
    ) -> Changes: ...

    async def snapshot(self, target: SnapshotTarget) -> SnapshotInfo: ...

    async def update_network(self, network: Any, *, requested_by: str | None = None) -> NetworkChange: ...

    async def spawn(self, command: str | None = None, **options: Unpack[SpawnOptions]) -> AsyncProcess: ...

    def process(self, proc_id: int) -> AsyncProcess: ...

    async def processes(self) -> list[dict[str, Any]]: ...

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
    ) -> Execution: ...

    async def create_code_context(self, cwd: str | None = None, language: str = "python") -> CodeContext: ...

    async def list_code_contexts(self) -> list[CodeContext]: ...

    async def restart_code_context(self, context: CodeContext | str) -> None: ...

    async def remove_code_context(self, context: CodeContext | str) -> None: ...

    async def usage(self) -> dict[str, Any]: ...

    async def close(self) -> RunSummary | None: ...


if TYPE_CHECKING:  # the conformance checks: mypy names the member a session lacks or spells differently
    from toolcage.aio import AsyncSandbox
    from toolcage.sandbox import Sandbox

    def _sandbox(sb: Sandbox) -> SandboxLike:
        return sb

    def _async_sandbox(sb: AsyncSandbox) -> AsyncSandboxLike:
        return sb


__all__ = ["AsyncSandboxLike", "SandboxLike", "SnapshotTarget"]
