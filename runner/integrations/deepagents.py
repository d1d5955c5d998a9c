"""A LangChain Deep Agents backend on a toolcage sandbox: ``ToolcageSandbox``.

``create_deep_agent(model, backend=ToolcageSandbox("."))`` runs the agent's ``ls``, ``read_file``,
``write_file``, ``edit_file``, ``glob``, ``grep`` and ``execute`` in one hardened toolcage container (no
network unless the policy allows hosts, a read-only root, dropped capabilities, cgroup limits, an audit
trail) whose ``/workspace`` is a writable copy of a host directory; the host's directory is never written.
``changes()`` gives what the agent changed as a diff that ``git apply`` takes on the host.

deepagents derives every file tool but two from ``execute`` (Python scripts it runs with ``python3 -c``,
see ``deepagents.backends.sandbox.BaseSandbox``); ``upload_files`` and ``download_files`` are toolcage's
``write_files``/``read_files``: many files in one round trip each way, byte-exact.

Paths: the agent works with absolute paths, ``/workspace/...`` (the copy) and ``/scratch/...`` (the
sandbox's writable tmpfs); commands start in the workspace (``/scratch`` without one). Every other path is
on the container's read-only root: it can be read, not written.

Failures: a command that fails, times out or hits the memory limit is an ``ExecuteResponse`` with its exit
code, as any shell's. A sandbox that dies (its run deadline, the memory limit of the whole sandbox, a
``docker kill`` from outside) is an ``ExecuteResponse`` with exit code 125 whose output names toolcage's
status and reason; every later call answers the same (file tools as their error), and
:attr:`ToolcageSandbox.ended` holds the ``SandboxError``. deepagents' tools never raise for it, so the agent
sees a failed tool call and the loop goes on; a new ``ToolcageSandbox`` starts a fresh container.
"""

from __future__ import annotations

import base64
import functools
import os
import posixpath
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, TypeVar

try:
    from deepagents.backends.protocol import (
        DeleteResult,
        ExecuteResponse,
        FileDownloadResponse,
        FileUploadResponse,
        GlobResult,
        GrepResult,
        LsResult,
    )
    from deepagents.backends.sandbox import BaseSandbox
except ImportError as exc:
    from toolcage.integrations import raise_missing_extra

    raise_missing_extra(exc, "deepagents", __name__)
    raise

from toolcage.backends import BACKENDS
from toolcage.errors import SandboxError, ToolcageError, UsageError, WorkspaceError
from toolcage.files.changes import ChangesError
from toolcage.files.gitplumb import DiffFailed
from toolcage.files.safetar import DownloadError
from toolcage.files.snapseal import SnapshotError
from toolcage.files.upload import UploadError
from toolcage.policies import contract
from toolcage.policies.overlay import overlay
from toolcage.sandbox import Sandbox

if TYPE_CHECKING:
    from toolcage.files.changes import Changes
    from toolcage.files.snapshot import SnapshotInfo
    from toolcage.policies import PolicySource
    from toolcage.pool import Pool
    from toolcage.results import CallResult
    from toolcage.types import SandboxLike

T = TypeVar("T")

ENDED_EXIT_CODE = 125
"""``ExecuteResponse.exit_code`` once the sandbox itself has ended (as ``docker run`` says its container failed)."""

_WRITABLE = (contract.WORKSPACE, contract.SCRATCH)

# before the agent's command, on lines of their own: stderr joins stdout for all that follows (in the order
# written), and `python` is python3 when the image has no `python` (agents type it; builtins only, no fork)
_PREAMBLE = 'exec 2>&1\ncommand -v python >/dev/null 2>&1 || python() { python3 "$@"; }\n'


def _check_timeout(command_timeout: float | None) -> None:
    if command_timeout is not None and not (_positive(command_timeout)):
        raise UsageError(f"command_timeout must be a positive number of seconds, not {command_timeout!r}")


def _session_options(
    workspace: str | os.PathLike[str] | None,
    policy: PolicySource,
    allow_hosts: Sequence[str | Mapping[str, Any]] | None,
    sandbox: str | None,
    session_s: float | None,
    idle_s: float | None,
) -> tuple[str | None, Any]:
    """The sandbox kind (never one that runs on the host) and the session's policy, checked: what the
    constructor and :meth:`ToolcageSandbox.pool` both take."""
    kind = sandbox or os.environ.get(contract.ENV_SANDBOX)
    if kind in BACKENDS and not BACKENDS[kind].in_container:  # the registry's fact, not its name
        raise UsageError(
            "ToolcageSandbox needs a sandbox: sandbox='none' would run the agent's commands on this host "
            "(use 'container', 'gvisor' or 'auto')"
        )
    if workspace is not None and not os.path.isdir(workspace):
        raise WorkspaceError(f"workspace {os.fspath(workspace)!r} is not a directory")
    if session_s is not None and not _positive(session_s):
        raise UsageError(f"session_s must be a positive number of seconds, not {session_s!r}")
    # the one overlay of the adapters and the CLI: hosts added, an agent's hour where the policy keeps 60 s
    return kind, overlay(policy, allow_hosts=allow_hosts, run_s=session_s, idle_s=idle_s, agent_session=True)


class ToolcageSandbox(BaseSandbox):
    """deepagents' ``BaseSandbox`` backed by one toolcage ``Sandbox`` with a writable copy of ``workspace``.

    The container starts in the constructor (every option is checked before it does: a bad one raises a
    ``toolcage.ToolcageError``, a ``UsageError``/``PolicyError`` saying which) and is removed by
    :meth:`close` (or the end of a ``with`` block; at interpreter exit in any case).

    Args:
        workspace: host directory copied to ``/workspace`` (writable; the host's copy is never written).
            ``None``: no workspace, commands start in ``/scratch``.
        policy: a bundled policy name, a file, a mapping or a ``toolcage.Policy`` (default ``"default"``:
            no network, 512 MiB, one CPU).
        allow_hosts: the egress allowlist: hosts (``"pypi.org"``, ``"*.github.com"``) or ``AllowRule``
            mappings (``{"host": ..., "schemes": [...], "ports": [...], "methods": [...]}``), added to the
            policy's rules; any entry turns the network to ``proxy`` mode (only through toolcage's egress
            proxy, which refuses everything else and private addresses). Empty or ``None``: the policy's.
        secrets: values for the policy's named secrets (``{"GITHUB_TOKEN": "..."}``): the egress proxy
            adds them to requests to their bound origin; the code in the sandbox never sees them.
        audit: ``None`` the default audit log, a path, a ``toolcage`` ``Audit``, or ``False`` for none.
        image: the image the commands run in, any the engine has (a user's own runs unchanged, its PATH, ENV
            and WORKDIR for the commands; it needs /bin/sh); default toolcage's worker image.
        sandbox: ``"container"`` (runc), ``"gvisor"`` (runsc) or ``"auto"``; default ``$TOOLCAGE_SANDBOX``
            or ``"container"``. ``"none"`` is refused: it would run the agent's commands on the host.
        session_s: the session's lifetime (the policy's ``timeouts.run_s``). ``None`` (default): the policy's
            own, except that a policy that keeps the default 60 s (the bundled ``default`` does) gets one hour,
            as an agent's session outlives one call (``toolcage.policies.overlay``).
        idle_s: kill the sandbox after this long without a call. ``None``: the policy's own, or 10 minutes
            (never past ``session_s``) where the policy keeps the default 60 s.
        command_timeout: seconds a command may run when the agent gives no ``timeout`` (default: the
            policy's ``timeouts.call_s``, 30 s in the default policy).
        workspace_gitignore: leave out of the copy what the workspace's ``.gitignore`` files ignore, and
            ``.git`` (``changes()`` then ignores them too).
        workspace_cache: lay the copy over a tree the engine keeps (``Sandbox(workspace_cache=True)``): a big
            tree started again costs milliseconds, not a copy.
        resume: a snapshot (:meth:`snapshot`) to start from: a new container with the snapshot's files.
        snapshot_key: the HMAC key of snapshots (default: this host's).
    """

    def __init__(
        self,
        workspace: str | os.PathLike[str] | None = None,
        *,
        policy: PolicySource = "default",
        allow_hosts: Sequence[str | Mapping[str, Any]] | None = None,
        secrets: Mapping[str, str] | None = None,
        audit: Any = None,
        image: str | None = None,
        sandbox: str | None = None,
        session_s: float | None = None,
        idle_s: float | None = None,
        command_timeout: float | None = None,
        workspace_gitignore: bool = False,
        resume: str | os.PathLike[str] | IO[bytes] | None = None,
        snapshot_key: bytes | None = None,
        workspace_cache: bool = False,
    ) -> None:
        _check_timeout(command_timeout)
        self._command_timeout = command_timeout
        kind, resolved = _session_options(workspace, policy, allow_hosts, sandbox, session_s, idle_s)
        sb = Sandbox(
            resolved, workspace=workspace, workspace_mode="copy" if workspace is not None else "ro",
            workspace_gitignore=workspace_gitignore, secrets=secrets, audit=audit, image=image, sandbox=kind,
            resume=resume, snapshot_key=snapshot_key, workspace_cache=workspace_cache,
        )  # fmt: skip
        sb.start()
        self._setup(sb, contract.WORKSPACE if sb.options.workspace_copy else contract.SCRATCH)

    @staticmethod
    def pool(
        workspace: str | os.PathLike[str] | None = None,
        *,
        size: int = 2,
        policy: PolicySource = "default",
        allow_hosts: Sequence[str | Mapping[str, Any]] | None = None,
        audit: Any = None,
        image: str | None = None,
        sandbox: str | None = None,
        session_s: float | None = None,
        idle_s: float | None = None,
        workspace_gitignore: bool = False,
    ) -> Pool:
        """A warm pool for :meth:`from_pool`: ``size`` sandboxes started ahead with the options the constructor
        takes (the same names, the same checks), each waiting with an empty writable ``/workspace`` that the
        backend that adopts it fills with a fresh copy of ``workspace``. A backend then costs the copy's fill,
        not a container's start::

            pool = ToolcageSandbox.pool(repo, size=2)
            agent = create_deep_agent(model, backend=ToolcageSandbox.from_pool(pool))

        ``pool.close()`` (or a ``with`` block) removes the slots not taken; each backend still closes its own."""
        from toolcage.pool import Pool

        kind, resolved = _session_options(workspace, policy, allow_hosts, sandbox, session_s, idle_s)
        return Pool(
            resolved, workspace=workspace, workspace_mode="copy" if workspace is not None else "ro",
            workspace_gitignore=workspace_gitignore, audit=audit, image=image, sandbox=kind, size=size,
            tool="deepagents",
        )  # fmt: skip

    @classmethod
    def from_pool(
        cls,
        pool: Pool,
        *,
        secrets: Mapping[str, str] | None = None,
        resume: str | os.PathLike[str] | IO[bytes] | None = None,
        snapshot_key: bytes | None = None,
        command_timeout: float | None = None,
    ) -> ToolcageSandbox:
        """A backend on one of ``pool``'s slots (:meth:`pool`, or any ``toolcage.Pool``): adopted, and filled with
        the pool's workspace copy or the snapshot ``resume`` names (checked before a slot is taken)."""
        _check_timeout(command_timeout)
        sb = pool.sandbox(secrets=secrets, resume=resume, snapshot_key=snapshot_key)
        sb.start()
        self = cls.__new__(cls)
        self._command_timeout = command_timeout
        self._setup(sb, contract.WORKSPACE if sb.options.workspace_copy else contract.SCRATCH)
        return self

    @classmethod
    def on_session(cls, session: SandboxLike, *, command_timeout: float | None = None) -> ToolcageSandbox:
        """A backend on a session already started: any of toolcage's (``toolcage.types.SandboxLike``: a
        ``Sandbox``, a pooled one, a Ray cluster's ``ClusterSandbox``), made with its own options::

            with cluster.sandbox(workspace=repo, workspace_mode="copy") as sb:
                agent = create_deep_agent(model, backend=ToolcageSandbox.on_session(sb))

        Commands start in ``/workspace`` when the session can write there (a workspace copy), else in
        ``/scratch`` (asked once, here). :meth:`close` closes the session."""
        _check_timeout(command_timeout)
        self = cls.__new__(cls)
        self._command_timeout = command_timeout
        probe = session.call("exec", {"argv": ["test", "-w", contract.WORKSPACE], "cwd": contract.SCRATCH})
        writable = isinstance(probe.result, dict) and probe.result.get("exit_code") == 0
        self._setup(session, contract.WORKSPACE if writable else contract.SCRATCH)
        return self

    def _setup(self, session: SandboxLike, root: str) -> None:
        self._sb: SandboxLike = session
        self.root = root
        """Where commands start and ``glob``/``grep`` search by default."""
        self._ended: ToolcageError | None = None
        self._closed = False

    # the protocol -----------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The toolcage run id (the container's ``toolcage.run_id`` label)."""
        return self._sb.run_id or ""

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run ``command`` with ``/bin/sh -c`` in the sandbox, in :attr:`root`: its stdout and stderr
        as one stream (in the order written), its exit code (128+N for signal N, 124 for a timeout)."""
        if not isinstance(command, str) or not command:
            raise ValueError("command must be a non-empty string")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0):
            raise ValueError(f"timeout must be a non-negative integer number of seconds, not {timeout!r}")
        params: dict[str, Any] = {"command": _PREAMBLE + command, "cwd": self.root}
        limit = timeout if timeout else self._command_timeout  # 0 or None: the backend's default
        if limit:
            params["timeout_s"] = limit
        try:
            res = self._call("exec", params)
        except _Ended as end:
            return end.response
        r = res.result if isinstance(res.result, dict) else None
        if r is None or "exit_code" not in r:  # a tool error: the worker could not start the command
            message = (res.error or {}).get("message", res.status)
            return ExecuteResponse(output=f"toolcage: {message}", exit_code=126)
        out = _text(r, "stdout") + _text(r, "stderr")
        code = r.get("exit_code")
        notes = []
        if r.get("timed_out"):
            after = f"{limit} s" if limit else "the policy's timeouts.call_s"
            notes.append(f"[toolcage: timed out after {after}; killed]")
            code = 124
        elif r.get("oom_killed"):
            notes.append("[toolcage: killed at the sandbox's memory limit (limits.memory)]")
            code = 137
        elif isinstance(code, int) and code < 0:  # killed by a signal: as a shell says it
            code = 128 - code
        if r.get("truncated"):
            notes.append("[toolcage: output cut at limits.output_cap]")
        if notes:
            out += ("\n" if out and not out.endswith("\n") else "") + "\n".join(notes)
        return ExecuteResponse(
            output=out, exit_code=code if isinstance(code, int) else None, truncated=bool(r.get("truncated"))
        )

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Write ``(path, content)`` pairs in one toolcage upload (parents made; an existing file replaced).
        Paths must be absolute, under ``/workspace`` or ``/scratch``; each answer says its own error."""
        errors: dict[int, str] = {}
        ok: dict[int, str] = {}
        for i, (path, _content) in enumerate(files):
            where = _writable(path)
            if isinstance(where, _Refused):
                errors[i] = where.code
            else:
                ok[i] = where
        if ok:
            batch = {ok[i]: files[i][1] for i in sorted(ok)}  # a path given twice: the last content wins
            try:
                self._guard(lambda: self._sb.write_files(batch))
            except _Ended as end:
                errors.update(dict.fromkeys(ok, end.text))
            except ToolcageError:  # one of them failed (and none was written): find which, one at a time
                for i in sorted(ok):
                    try:
                        self._guard(functools.partial(self._sb.write_files, {ok[i]: files[i][1]}))
                    except _Ended as end:
                        errors[i] = end.text
                    except ToolcageError as exc:
                        errors[i] = _upload_code(str(exc))
        return [FileUploadResponse(path=p, error=errors.get(i)) for i, (p, _c) in enumerate(files)]

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Read ``paths`` in one toolcage download; a path that is missing, a directory, unreadable,
        relative or outside ``/workspace`` and ``/scratch`` gets its error code instead."""
        got: dict[str, bytes] = {}
        errors: dict[str, str] = {}
        wanted: dict[str, str] = {}  # as given -> as toolcage takes it
        for path in paths:
            where = _writable(path)
            if isinstance(where, _Refused):
                errors[path] = where.code
            else:
                wanted[path] = where
        if wanted:
            try:
                found = self._guard(lambda: self._sb.read_files(set(wanted.values()), missing_ok=True))
            except _Ended as end:
                errors.update(dict.fromkeys(wanted, end.text))
                found = {}
            except ToolcageError:  # an unreadable one fails the whole download: one at a time
                found = {}
                for real in set(wanted.values()):
                    try:
                        found.update(self._guard(functools.partial(self._sb.read_files, [real], missing_ok=True)))
                    except _Ended as end:
                        errors.update({p: end.text for p, r in wanted.items() if r == real})
                    except ToolcageError:
                        pass
            for path, real in wanted.items():
                if real in found:
                    got[path] = found[real]
            rest = [p for p in wanted if p not in got and p not in errors]
            if rest:
                self._explain_missing(rest, wanted, got, errors)
        return [
            FileDownloadResponse(
                path=p, content=got.get(p), error=None if p in got else errors.get(p, "file_not_found")
            )
            for p in paths
        ]

    # what BaseSandbox derives from execute, where a dead sandbox would read as success --------------
    def ls(self, path: str) -> LsResult:
        if self._ended is not None:
            return LsResult(error=_ended_text(self._ended))
        got = super().ls(path)
        return LsResult(error=_ended_text(self._ended)) if self._ended is not None else got

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> GrepResult:
        return super().grep(pattern, path or self.root, glob, max_count=max_count)

    async def agrep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> GrepResult:
        return await super().agrep(pattern, path or self.root, glob, max_count=max_count)

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        return super().glob(pattern, path or self.root)

    async def aglob(self, pattern: str, path: str | None = None) -> GlobResult:
        return await super().aglob(pattern, path or self.root)

    def delete(self, file_path: str) -> DeleteResult:
        if self._ended is not None:
            return DeleteResult(error=_ended_text(self._ended))
        return super().delete(file_path)

    # toolcage's own -------------------------------------------------------------------------
    @property
    def sandbox(self) -> SandboxLike:
        """The toolcage session underneath (``call`` any tool on it): a ``Sandbox``, or the one given to
        :meth:`on_session`."""
        return self._sb

    def process_tools(self) -> list[Any]:
        """LangChain tools for background processes on this backend's sandbox (the ``proc_*`` tools:
        ``proc_start``, ``proc_read``, ``proc_wait``, ``proc_write``, ``proc_signal``, ``proc_kill``,
        ``proc_resize``, ``proc_list``; ``toolcage.integrations.langchain``), for
        ``create_deep_agent(backend=backend, tools=backend.process_tools())``: deepagents' ``execute`` runs a
        command to its end, these start a server or a REPL, follow its output, type into it and stop it."""
        from toolcage.integrations.langchain import PROCESS_TOOLS, get_tools

        return list(get_tools(self._sb, include=PROCESS_TOOLS))

    def interpreter_tools(self) -> list[Any]:
        """LangChain tools for Python contexts on this backend's sandbox (the ``code_*`` tools: ``code_run``,
        ``code_context_create``, ``code_context_list``, ``code_context_restart``, ``code_context_remove``), as
        ``create_deep_agent(backend=backend, tools=backend.interpreter_tools())``: deepagents' ``execute`` runs a
        fresh process each time, ``code_run`` a cell in a context whose variables, imports and open files
        persist (a DataFrame loaded once). A cell's PNG and JPEG results are the ToolMessage's
        ``artifact["images"]``; its content names them with a short placeholder
        (``toolcage.integrations.langchain``)."""
        from toolcage.integrations.langchain import INTERPRETER_TOOLS, get_tools

        return list(get_tools(self._sb, include=INTERPRETER_TOOLS))

    @property
    def ended(self) -> ToolcageError | None:
        """Why the sandbox can take no more commands (its ``status`` and ``reason``), or None."""
        return self._ended or self._dead()

    @property
    def container_id(self) -> str | None:
        return getattr(self._sb, "container_id", None)

    def changes(self, *, download_to: str | os.PathLike[str] | None = None) -> Changes:
        """What the agent changed in the workspace copy: ``added``, ``changed``, ``removed`` and a ``diff``
        that ``git apply`` takes in the host's workspace (toolcage's ``Sandbox.changes``)."""
        return self._sb.changes(download_to=download_to)

    def snapshot(self, target: str | os.PathLike[str] | IO[bytes]) -> SnapshotInfo:
        """Write the session's files (``/scratch`` and the workspace copy) to a signed tar: resume it with
        ``ToolcageSandbox(workspace, resume=target)``, in a new container."""
        return self._sb.snapshot(target)

    def close(self) -> None:
        """Remove the sandbox (in the background; idempotent)."""
        self._closed = True
        self._sb.close()

    def __enter__(self) -> ToolcageSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ToolcageSandbox(id={self.id!r}, root={self.root!r}, kind={getattr(self._sb, 'kind', None)!r})"

    # internals ------------------------------------------------------------------------------
    def _call(self, tool: str, params: dict[str, Any]) -> CallResult:
        return self._guard(lambda: self._sb.call(tool, params))

    def _guard(self, fn: Callable[[], T]) -> T:
        """``fn()``, with the end of the sandbox as :class:`_Ended` (remembered: every later call answers it)."""
        if self._ended is not None:
            raise _Ended(self._ended)
        try:
            return fn()
        except SandboxError as exc:
            dead = self._dead(exc)
            if dead is None:
                raise  # a failed transfer (UploadError, DownloadError): the sandbox goes on
            self._ended = dead
            raise _Ended(dead) from exc
        except UsageError as exc:  # "not running": closed, or ended between two calls
            dead = self._dead()
            if dead is None and not self._closed:
                raise  # bad input (UploadUsage, DownloadUsage): the caller's, the sandbox goes on
            self._ended = dead or UsageError("the sandbox was closed")
            raise _Ended(self._ended) from exc

    def _dead(self, exc: BaseException | None = None) -> ToolcageError | None:
        """Why the session ended, or None: a ``Sandbox``'s own word (``dead``); for a session that keeps none
        (a cluster session), a sandbox failure that is not a transfer's (``NodeLost``, a deadline) ends it."""
        if isinstance(self._sb, Sandbox):
            return self._sb.dead
        if isinstance(exc, SandboxError) and not isinstance(exc, _TRANSFER_ERRORS):
            return exc
        return None

    def _explain_missing(
        self, rest: list[str], wanted: dict[str, str], got: dict[str, bytes], errors: dict[str, str]
    ) -> None:
        """One command tells a directory from a missing or unreadable file (and reads a regular file that
        a download leaves out, such as one behind a symlink)."""
        script = (
            'for p in "$@"; do if [ -d "$p" ]; then echo d; elif [ ! -e "$p" ]; then echo m; '
            'elif [ ! -r "$p" ]; then echo p; elif [ -f "$p" ]; then echo "f $(base64 -w0 < "$p")"; '
            "else echo x; fi; done"
        )
        reals = [wanted[p] for p in rest]
        res = self.execute(f"sh -c {shlex.quote(script)} sh " + " ".join(shlex.quote(r) for r in reals))
        lines = res.output.splitlines()
        if res.exit_code != 0 or len(lines) != len(rest):
            for p in rest:
                errors[p] = res.output.strip()[:300] if res.exit_code == ENDED_EXIT_CODE else "file_not_found"
            return
        codes = {"d": "is_directory", "m": "file_not_found", "p": "permission_denied", "x": "invalid_path"}
        for p, line in zip(rest, lines, strict=True):
            if line.startswith("f "):
                try:
                    got[p] = base64.b64decode(line[2:], validate=True)
                except ValueError:
                    errors[p] = "file_not_found"
            else:
                errors[p] = codes.get(line, "file_not_found")


# a failed transfer: the session goes on (upload, download, changes, snapshot)
_TRANSFER_ERRORS = (UploadError, DownloadError, ChangesError, SnapshotError, DiffFailed)


class _Refused:
    def __init__(self, code: str) -> None:
        self.code = code


class _Ended(Exception):
    """The sandbox has ended: ``response`` is what execute answers, ``text`` what a file call says."""

    def __init__(self, exc: ToolcageError) -> None:
        super().__init__(str(exc))
        self.text = _ended_text(exc)
        self.response = ExecuteResponse(output=self.text, exit_code=ENDED_EXIT_CODE)


def _ended_text(exc: ToolcageError) -> str:
    status = getattr(exc, "status", "error")
    reason = getattr(exc, "reason", "sandbox")
    return (
        f"toolcage: the sandbox has ended (status {status}, reason {reason}): {exc}. "
        "Its files are gone; no further command can run in it."
    )


def _writable(path: str) -> str | _Refused:
    """``path`` as toolcage takes it (normalised), or why it cannot be moved: relative paths and ``..`` are
    ``invalid_path``, paths off ``/workspace`` and ``/scratch`` ``permission_denied``."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        return _Refused("invalid_path")
    if ".." in path.split("/"):
        return _Refused("invalid_path")
    norm = posixpath.normpath(path)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    if not any(norm.startswith(root + "/") for root in _WRITABLE):
        return _Refused("is_directory" if norm in _WRITABLE else "permission_denied")
    return norm


def _upload_code(message: str) -> str:
    low = message.lower()
    if "is a directory" in low or "not a directory" in low:
        return "is_directory"
    if "permission" in low or "read-only" in low or "refused" in low:
        return "permission_denied"
    return message[:300]


def _text(r: Mapping[str, Any], stream: str) -> str:
    """A stream's bytes as text; when not UTF-8 (``<stream>_b64``), decoded with replacement."""
    b64 = r.get(f"{stream}_b64")
    if isinstance(b64, str):
        try:
            return base64.b64decode(b64).decode("utf-8", "replace")
        except ValueError:
            pass
    value = r.get(stream)
    return value if isinstance(value, str) else ""


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


__all__ = ["ENDED_EXIT_CODE", "ToolcageSandbox"]
