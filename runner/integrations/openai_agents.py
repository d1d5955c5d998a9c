"""A sandbox client for the OpenAI Agents SDK (``openai-agents``): ``SandboxAgent`` runs its shell and
filesystem capabilities in a toolcage sandbox.

    from agents.run import RunConfig
    from agents.sandbox import SandboxRunConfig
    from toolcage.integrations.openai_agents import ToolcageSandboxClient, ToolcageSandboxClientOptions

    run_config = RunConfig(sandbox=SandboxRunConfig(
        client=ToolcageSandboxClient(),
        options=ToolcageSandboxClientOptions(allow_hosts=("pypi.org",)),
    ))

The session is a :class:`~toolcage.aio.AsyncSandbox` with a writable workspace copy at ``/workspace`` (the
SDK's default manifest root): the same hardened container, policy, egress allowlist, secrets and audit log as
toolcage's own API. ``exec`` is toolcage's ``exec`` tool; ``read``/``write`` its ``read_file``/``write_file``
tools (a download/upload past a few MiB); ``persist_workspace``/``hydrate_workspace`` move a tar of the
workspace through toolcage's ``download``/``upload`` streams (``openai_agents_tar``: bounded by what the
sandbox holds, absolute links into the root made relative so a resume takes them back); the SDK's own code
applies the manifest, ``apply_patch``, ``ls``, ``mkdir``, ``rm`` and ``mv`` over ``exec``. Every path is
first checked where the sandbox resolves it, by the SDK's own helper (as for its Docker client): a symlink
out of the manifest root is the SDK's ``InvalidManifestPathError`` for every file operation.

Snapshots: any SDK snapshot (``LocalSnapshotSpec``, ``RemoteSnapshotSpec``) works through
``persist_workspace``/``hydrate_workspace``; :class:`ToolcageSnapshotSpec` uses toolcage's own snapshots
instead (``/scratch`` and the workspace, signed with this host's key, refused if it holds a secret), and a
resume starts a fresh sandbox from it. No container is ever reattached: ``resume`` always starts a new one.

PTY sessions: ``supports_pty()`` is True, so the ``Shell`` capability offers ``write_stdin`` beside
``exec_command``. ``pty_exec_start`` starts a toolcage background process (``proc_start``: on a terminal with
``tty=True``, else on pipes with stdin closed, stdout and stderr together), ``pty_write_stdin`` types into it
(Ctrl-C is ``"\\u0003"``) and polls it, ``pty_terminate_all`` kills every one (at ``stop`` and ``shutdown``):
the SDK's limits (64 processes, the oldest pruned as its own clients do, ids in ``[1000, 100000)``, its yield
times) and its output collection and token truncation. A process killed by a signal exits ``-signum``.

Exposed ports: ``ToolcageSandboxClientOptions(exposed_ports=(8000,))``; ``resolve_exposed_port(8000)`` is an
``ExposedPortEndpoint`` on ``127.0.0.1`` and a free host port (toolcage's ``Sandbox.expose``: a relay into
the sandbox, whose network stays ``lo`` and its policy's).

Not supported, declared as the SDK expects: manifest mounts, users and groups, and ``exec(user=...)``
(refused at ``create`` or at the call with a ``ConfigurationError``): toolcage mounts nothing from the host
and runs everything as one unprivileged user.

A sandbox that dies (its memory limit, its deadline, ``docker kill``) reaches the SDK as
:class:`ToolcageSandboxError`, an ``ExecTransportError`` carrying toolcage's ``status`` and ``reason``.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any, Literal, Self

try:
    from agents.sandbox.capabilities import Capability
    from agents.sandbox.errors import (
        ConfigurationError,
        ErrorCode,
        ExecTimeoutError,
        ExecTransportError,
        ExposedPortUnavailableError,
        OpName,
        SnapshotPersistError,
        SnapshotRestoreError,
        WorkspaceArchiveReadError,
        WorkspaceArchiveWriteError,
        WorkspaceReadNotFoundError,
    )
    from agents.sandbox.manifest import Manifest
    from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
    from agents.sandbox.session.dependencies import Dependencies
    from agents.sandbox.session.manager import Instrumentation
    from agents.sandbox.session.pty_output import collect_pty_output
    from agents.sandbox.session.pty_types import (
        PTY_PROCESSES_MAX,
        PtyExecUpdate,
        allocate_pty_process_id,
        clamp_pty_yield_time_ms,
        process_id_to_prune_from_meta,
        resolve_pty_write_yield_time_ms,
    )
    from agents.sandbox.session.runtime_helpers import RESOLVE_WORKSPACE_PATH_HELPER, RuntimeHelperScript
    from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
    from agents.sandbox.session.sandbox_session import SandboxSession
    from agents.sandbox.session.sandbox_session_state import SandboxSessionState
    from agents.sandbox.session.workspace_payloads import coerce_write_payload
    from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
    from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User
    from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tarfile
    from agents.tool import FunctionTool, Tool, ToolOutputImage, ToolOutputText
    from pydantic import ConfigDict, Field, model_validator
except ImportError as exc:
    from toolcage.integrations import raise_missing_extra

    raise_missing_extra(exc, "openai-agents", __name__)
    raise

from toolcage.aio import AsyncPool, AsyncSandbox
from toolcage.backends import BACKENDS
from toolcage.errors import ProcessError, ToolcageError, UsageError
from toolcage.errors import SandboxError as ToolcageDied
from toolcage.files.safetar import DownloadError
from toolcage.integrations import split_images
from toolcage.policies import codes, contract
from toolcage.processes import answer as process_answer
from toolcage.processes import output as process_output
from toolcage.textsafe import dumps, escape

if TYPE_CHECKING:
    from toolcage.files.changes import Changes
    from toolcage.processes import AsyncProcess
    from toolcage.results import CallResult
    from toolcage.sandbox import Sandbox

BACKEND_ID = "toolcage"
SANDBOX_USER = "sandbox"  # the one user every process in the sandbox runs as (uid 65532)
ROOTS = (contract.WORKSPACE, contract.SCRATCH)  # where a manifest root may be: the writable workspace copy, or scratch
_INLINE_MAX = 4 << 20  # a file up to this size goes in one write_file call; larger ones are uploaded
_CHUNK = 1 << 20
# the sandbox kinds offered: the registry's, less those that run on the host ("none")
KINDS = (*(name for name, backend in BACKENDS.items() if backend.in_container), "auto")


class ToolcageSandboxError(ExecTransportError):
    """The toolcage sandbox itself ended (its memory limit, its run deadline or idle timeout, a crash, a
    ``docker kill``), or did not start (``op`` ``"start"``: a missing image, an engine that does not answer;
    the message says "did not start" and why): ``status`` and ``reason`` are toolcage's (``toolcage.errors``),
    also in ``context``. Not retryable on this session; a new session starts a new sandbox."""

    status: str
    reason: str

    def __init__(
        self,
        *,
        status: str,
        reason: str,
        detail: str,
        op: OpName = "exec",
        command: tuple[str, ...] = (),
        run_id: str | None = None,
        cause: BaseException | None = None,
    ) -> None:
        what = "did not start" if op == "start" else "ended"
        super().__init__(
            command=command,
            message=f"the toolcage sandbox {what} ({status}, {reason}): {detail}",
            context={"backend": BACKEND_ID, "status": status, "reason": reason, "run_id": run_id, "detail": detail},
            cause=cause,
            retryable=False,
        )
        self.op = op
        self.status = status
        self.reason = reason


def _unsupported(what: str, why: str, op: OpName = "start") -> ConfigurationError:
    return ConfigurationError(
        message=f"{what} is not supported by the toolcage sandbox: {why}",
        error_code=ErrorCode.SANDBOX_CONFIG_INVALID,
        op=op,
        context={"backend": BACKEND_ID, "unsupported": what},
    )


# options --------------------------------------------------------------------------------------------------


class ToolcageSandboxClientOptions(BaseSandboxClientOptions):
    """How a toolcage session is made. Every field is checked when the options are built (a bad policy,
    allowlist entry, secret, sandbox kind or workspace, an ``image`` the engine does not have, is a
    ``ValidationError`` naming it).

    - ``policy``: a bundled name (``"default"``), a policy file, or a mapping (``{"extends": "default", ...}``);
    - ``allow_hosts``: the egress allowlist, added to the policy's (``"api.github.com"``, ``"*.pypi.org"``, or a
      policy ``allow`` entry as a mapping); any entry turns on ``network.mode: proxy``. Empty: the policy's
      network (the default policy has none at all);
    - ``secrets``: values for the secrets the policy binds (``secrets:`` with ``send_to``); SafeFetch adds them
      to requests to their origin, the sandbox's code never reads them. Never serialised with the session state;
    - ``audit``: the audit log's path; None: toolcage's default log; False: none;
    - ``image``: the image the commands run in, any the engine has (a user's own runs unchanged, with toolcage's
      runtime mounted read-only; default the worker image ``toolcage-worker:<version>``);
    - ``sandbox``: ``"container"`` (runc), ``"gvisor"`` or ``"auto"`` (default: ``$TOOLCAGE_SANDBOX``, else runc);
    - ``workspace``: a host directory copied into ``/workspace`` at start (never mounted, never written);
      ``workspace_gitignore``: leave out what its ``.gitignore`` files ignore, and ``.git``; ``workspace_cache``: lay
      the copy over a tree the engine keeps (``Sandbox(workspace_cache=True)``: a big tree started again costs
      milliseconds; not for a pool, whose slots take their copy after adoption);
    - ``run_s``/``idle_s``: the session's deadline and idle timeout (default: the policy's; a policy that keeps
      the default 60 s, as the bundled ``default`` does, gets 1 h and 10 min: ``toolcage.policies.overlay``);
    - ``exposed_ports``: sandbox TCP ports the host may reach (``resolve_exposed_port``), each through a relay
      on ``127.0.0.1`` (``Sandbox.expose``); the sandbox's own network is unchanged.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True, extra="forbid")

    type: Literal["toolcage"] = "toolcage"
    policy: str | dict[str, Any] = "default"
    allow_hosts: tuple[str | dict[str, Any], ...] = ()
    secrets: dict[str, str] = Field(default_factory=dict, exclude=True, repr=False)
    audit: str | bool | None = None
    image: str | None = None
    sandbox: str | None = None
    workspace: str | None = None
    workspace_gitignore: bool = False
    workspace_cache: bool = False
    run_s: float | None = None
    idle_s: float | None = None
    exposed_ports: tuple[int, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> Self:
        try:
            policy = self.resolved_policy()
            from toolcage import connectors
            from toolcage.workspace import validate_workspace

            connectors.secret_store(policy, self.secrets)
            kind = self.sandbox or os.environ.get(contract.ENV_SANDBOX) or "container"
            if kind not in KINDS:
                raise UsageError(
                    f"sandbox must be one of {', '.join(map(repr, KINDS))}, not {kind!r} (the SDK's own "
                    "UnixLocalSandboxClient runs commands on the host; toolcage's 'none' kind is not offered here)"
                )
            if self.workspace is not None:
                validate_workspace(self.workspace)
            elif self.workspace_gitignore or self.workspace_cache:
                raise UsageError("workspace_gitignore and workspace_cache apply to a workspace: give workspace= too")
            if any(not 1 <= p <= 65535 for p in self.exposed_ports):
                raise UsageError(f"exposed_ports are TCP ports (1-65535), not {self.exposed_ports!r}")
            if self.audit is True:
                raise UsageError("audit takes a path, None (toolcage's default log) or False (no log), not True")
            if self.image is not None:
                self._check_image(policy)
        except (ToolcageError, ValueError) as exc:
            raise ValueError(str(exc)) from None
        return self

    def _check_image(self, policy: Any) -> None:
        """A custom ``image`` the container engine does not have is refused here, when the options are built,
        not when the session starts; an engine that does not answer is left to the start, which says how to
        reach it."""
        from toolcage.backends import BackendOptions
        from toolcage.backends.container import ContainerBackend
        from toolcage.errors import DockerUnavailable

        assert self.image is not None
        where = BackendOptions(name="toolcage-options", log=None, image=self.image, proxy_image=self.image)
        engine = ContainerBackend(policy, where).engine  # the engine of every container kind (nothing is made)
        try:
            found = engine.image(self.image)
        except DockerUnavailable:
            return
        if found is None:
            raise UsageError(
                f"image {self.image!r} is not in the container engine (`docker images` lists them; nothing is "
                "pulled): build or load it there (any image runs), or leave image out for the worker image"
            )

    def resolved_policy(self) -> Any:
        """The run's policy (a ``toolcage.policies.Policy``): ``policy`` with ``allow_hosts`` added to its
        allowlist and the session's timeouts (``toolcage.policies.overlay``, ``agent_session=True``: a policy
        that keeps the default 60 s gets 1 h and 10 min idle; one with timeouts of its own keeps them)."""
        from toolcage.policies.overlay import overlay

        return overlay(
            self.policy, allow_hosts=self.allow_hosts, run_s=self.run_s, idle_s=self.idle_s, agent_session=True
        )

    def sandbox_kwargs(self) -> dict[str, Any]:
        """What ``AsyncSandbox(...)`` takes from these options (always a writable workspace copy)."""
        return {
            "policy": self.resolved_policy(),
            "workspace": self.workspace,
            "workspace_mode": "copy",
            "workspace_gitignore": self.workspace_gitignore,
            **({"workspace_cache": True} if self.workspace_cache else {}),
            "sandbox": self.sandbox,
            "image": self.image,
            "audit": self.audit,
            "secrets": dict(self.secrets) or None,
            "tool": "openai-agents",
        }

    def pool_kwargs(self) -> dict[str, Any]:
        """What ``AsyncPool(...)`` takes from these options: its slots are the sandboxes ``sandbox_kwargs`` would
        start, each run bringing its own secrets."""
        return {k: v for k, v in self.sandbox_kwargs().items() if k not in ("secrets", "workspace_cache")}

    def persisted(self) -> dict[str, Any]:
        """The options as a session state keeps them: everything but the secrets' values."""
        return self.model_dump(mode="json", exclude={"secrets"})

    @classmethod
    def from_persisted(cls, data: Mapping[str, Any], secrets: Mapping[str, str] | None) -> ToolcageSandboxClientOptions:
        return cls.model_validate({**data, "secrets": dict(secrets or {})})


# snapshots ------------------------------------------------------------------------------------------------


class ToolcageSnapshot(SnapshotBase):
    """A toolcage snapshot of one session (``Sandbox.snapshot``): ``/scratch`` and the workspace copy, signed
    with this host's key; written by the session's ``stop()`` and resumed by ``ToolcageSandboxClient.resume``
    into a fresh sandbox (checked before it starts). Only a toolcage session can write or read it."""

    type: Literal["toolcage"] = "toolcage"
    base_path: Path

    def path(self) -> Path:
        name = PurePosixPath(self.id).name
        if not name or name != self.id or name in (".", ".."):
            raise ValueError("a ToolcageSnapshot id must be a single path segment")
        return self.base_path / f"{name}.toolcage.tar"

    async def persist(self, data: io.IOBase, *, dependencies: Dependencies | None = None) -> None:
        _ = (data, dependencies)
        raise SnapshotPersistError(
            snapshot_id=self.id,
            path=self.path(),
            context={"reason": "a toolcage snapshot is written by a ToolcageSandboxClient session's stop()"},
        )

    async def restore(self, *, dependencies: Dependencies | None = None) -> io.IOBase:
        _ = dependencies
        raise SnapshotRestoreError(
            snapshot_id=self.id,
            path=self.path(),
            context={"reason": "a toolcage snapshot is resumed by ToolcageSandboxClient.resume()"},
        )

    async def restorable(self, *, dependencies: Dependencies | None = None) -> bool:
        _ = dependencies
        return self.path().is_file()


class ToolcageSnapshotSpec(SnapshotSpec):
    """``SandboxRunConfig(snapshot=ToolcageSnapshotSpec(base_path=DIR))``: toolcage snapshots in ``DIR``."""

    type: Literal["toolcage"] = "toolcage"
    base_path: Path

    def build(self, snapshot_id: str) -> SnapshotBase:
        return ToolcageSnapshot(id=snapshot_id, base_path=self.base_path)


# the session ----------------------------------------------------------------------------------------------


class ToolcageSandboxSessionState(SandboxSessionState):
    type: Literal["toolcage"] = "toolcage"
    options: dict[str, Any] = Field(default_factory=dict)  # ToolcageSandboxClientOptions.persisted()
    run_id: str | None = None  # the toolcage run serving the session now (a resume gets a new one)
    container_id: str | None = None


def _posix(path: PurePosixPath | Path | str) -> str:
    return PurePosixPath(str(path).replace("\\", "/")).as_posix()


def _result_bytes(result: Mapping[str, Any], stream: str) -> bytes:
    import base64

    raw = result.get(f"{stream}_b64")
    if isinstance(raw, str):
        return base64.b64decode(raw)
    return str(result.get(stream) or "").encode("utf-8")


@dataclass
class _PtyEntry:
    """One of the session's PTY processes: a toolcage background process and what was read of it and not yet
    returned (``chunks``)."""

    proc: AsyncProcess
    tty: bool
    last_used: float = field(default_factory=time.monotonic)
    chunks: deque[bytes] = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    notify: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int | None = None
    closed: bool = False


_PTY_POLL_MAX_S = 5.0  # one proc_read waits at most this long for output (a collection makes several)
_PTY_READ_MAX = 1 << 20  # the most one proc_read returns (what the sandbox keeps of a process's output)


class ToolcageSandboxSession(BaseSandboxSession):
    """A ``BaseSandboxSession`` over one toolcage sandbox (an :class:`~toolcage.aio.AsyncSandbox` with a
    writable workspace copy). ``sandbox`` is that sandbox, for toolcage's own calls (``changes()``,
    ``snapshot()``, ``call("grep", ...)``)."""

    state: ToolcageSandboxSessionState

    def __init__(
        self,
        *,
        state: ToolcageSandboxSessionState,
        options: ToolcageSandboxClientOptions,
        resume_from: Path | None = None,
        pool: AsyncPool | None = None,
    ) -> None:
        self.state = state
        self._options = options
        self._resume_from = resume_from
        self._pool = pool  # the client's warm pool, made with these very options (else None: a cold start)
        self._sb: AsyncSandbox | None = None
        self._env: dict[str, str] = {}
        self._root_ready = False
        self._pty_lock = asyncio.Lock()
        self._pty: dict[int, _PtyEntry] = {}

    # toolcage's own view ---------------------------------------------------------------------------------
    @property
    def sandbox(self) -> AsyncSandbox:
        if self._sb is None:
            raise _unsupported("using the session before start()", "start it (async with session) first", "exec")
        return self._sb

    @property
    def _sync(self) -> Sandbox:
        return self.sandbox._sync

    async def changes(self, **kwargs: Any) -> Changes:
        """What the session changed in ``/workspace`` against ``options.workspace`` (``Sandbox.changes``)."""
        return await self.sandbox.changes(**kwargs)

    def _died(self, exc: BaseException, op: OpName, command: tuple[str, ...] = ()) -> ToolcageSandboxError:
        dead = self._sync.dead if self._sb is not None else None
        why = dead if dead is not None else exc
        return ToolcageSandboxError(
            status=str(getattr(why, "status", None) or "crashed"),
            reason=str(getattr(why, "reason", None) or "sandbox"),
            detail=str(why),
            op=op,
            command=command,
            run_id=self._sb.run_id if self._sb is not None else None,
            cause=exc,
        )

    async def _call(
        self, tool: str, params: dict[str, Any], *, op: OpName, command: tuple[str, ...] = ()
    ) -> CallResult:
        sb = self.sandbox
        try:
            return await sb.call(tool, params)
        except ToolcageDied as exc:
            raise self._died(exc, op, command) from exc
        except UsageError as exc:
            if self._sync.dead is not None or self._sync._closed:
                raise self._died(exc, op, command) from exc
            raise

    async def _on_thread(self, op: OpName, fn: Any, *args: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args)
        except ToolcageDied as exc:
            if isinstance(exc, DownloadError) and self._sync.dead is None:
                raise  # a stream refused or over its bound: the sandbox lives on, the caller says what failed
            raise self._died(exc, op) from exc

    # lifecycle --------------------------------------------------------------------------------------------
    async def _ensure_backend_started(self) -> None:
        if self._sb is not None:
            return
        if self._pool is not None:  # a slot started ahead, filled with the workspace copy (or the snapshot) now
            secrets = dict(self._options.secrets) or None
            sb = self._pool.sandbox(secrets=secrets, resume=self._resume_from)
        else:
            sb = AsyncSandbox(**self._options.sandbox_kwargs(), resume=self._resume_from)
        try:
            await sb.start()
        except ToolcageDied as exc:
            self._sb = sb
            raise self._died(exc, "start") from exc
        self._sb = sb
        self.state.run_id, self.state.container_id = sb.run_id, sb.container_id
        self._env = await self.state.manifest.environment.resolve() if self.state.manifest.environment else {}

    async def _start_workspace(self) -> None:
        if self._resume_from is not None:  # toolcage restored the files before the first call
            await self._reapply_ephemeral_manifest_on_resume()
            return
        await super()._start_workspace()

    async def _after_start(self) -> None:
        self._root_ready = True

    async def _after_start_failed(self) -> None:
        await self._close()

    def _should_compute_snapshot_fingerprint_on_persist(self) -> bool:
        return False  # a fingerprint lets a reattached container skip its restore; toolcage never reattaches

    async def _persist_snapshot(self) -> None:
        snap = self.state.snapshot
        if not isinstance(snap, ToolcageSnapshot):
            await super()._persist_snapshot()
            return
        if self._sb is None or not await self.running():
            raise SnapshotPersistError(
                snapshot_id=snap.id, path=snap.path(), context={"reason": "the sandbox is not running"}
            )
        try:
            snap.base_path.mkdir(parents=True, exist_ok=True)
            await self._on_thread("snapshot_persist", self._sync.snapshot, snap.path())
        except ToolcageSandboxError:
            raise
        except (ToolcageError, OSError) as exc:
            raise SnapshotPersistError(snapshot_id=snap.id, path=snap.path(), cause=exc) from exc

    async def running(self) -> bool:
        sb = self._sb
        return sb is not None and sb._sync._running and sb._sync.dead is None and not sb._sync._closed

    async def _shutdown_backend(self) -> None:
        await self._close()

    async def _close(self) -> None:
        if self._sb is not None:
            try:
                await self._sb.close()
            except ToolcageError:
                pass

    # exec -----------------------------------------------------------------------------------------------
    async def exec(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
    ) -> ExecResult:
        self._check_user(user, "exec")
        return await super().exec(*command, timeout=timeout, shell=shell, user=None)

    @staticmethod
    def _check_user(user: str | User | None, op: OpName) -> None:
        name = user.name if isinstance(user, User) else user
        if name not in (None, SANDBOX_USER):
            raise _unsupported(
                f"running as user {name!r}", f"every process runs as the one unprivileged user {SANDBOX_USER!r}", op
            )

    # The SDK's path checks run its helper script in the sandbox (``_validate_remote_path_access``, as its
    # Docker client does). Threat: a helper installed in a writable directory (/tmp, /scratch) could be
    # swapped by the sandbox's code for one that approves every path; toolcage installs nothing and passes
    # the script itself, from the SDK, as the argument of ``sh -c`` each time.
    def _runtime_helpers(self) -> tuple[RuntimeHelperScript, ...]:
        return (RESOLVE_WORKSPACE_PATH_HELPER,)

    async def _ensure_runtime_helper_installed(self, helper: RuntimeHelperScript) -> PurePosixPath:
        return PurePosixPath(str(helper.install_path))

    async def _validate_path_access(self, path: Path | str, *, for_write: bool = False) -> Path:
        """``path`` checked against the workspace as the sandbox resolves it: a symlink that leads out of
        the root (and its extra path grants) is refused with the SDK's ``InvalidManifestPathError``, for
        ``ls``, ``mkdir``, ``rm``, ``mv`` and the rest as for ``read`` and ``write``."""
        return await self._validate_remote_path_access(path, for_write=for_write)

    async def _exec_internal(self, *command: str | Path, timeout: float | None = None) -> ExecResult:
        argv = tuple(str(c) for c in command)
        helper = next((h for h in self._runtime_helpers() if argv and argv[0] == str(h.install_path)), None)
        if helper is not None:
            argv = ("sh", "-c", helper.content, helper.name, *argv[1:])
        root = _posix(self.state.manifest.root)
        params: dict[str, Any] = {"argv": list(argv), "cwd": root if self._root_ready else contract.SCRATCH}
        if self._env and helper is None:  # the helper runs with the image's PATH: no tool of its from /scratch
            params["env"] = self._env
        if timeout is not None:
            params["timeout_s"] = max(float(timeout), 0.001)
        res = await self._call("exec", params, op="exec", command=argv)
        result = res.result if isinstance(res.result, dict) else None
        if result is not None and "exit_code" in result:
            if result.get("timed_out"):
                raise ExecTimeoutError(command=argv, timeout_s=timeout, context={"backend": BACKEND_ID})
            code = result.get("exit_code")
            exit_code = int(code) if isinstance(code, int) else 1
            if exit_code < 0:  # killed by a signal: as a shell reports it
                exit_code = 128 - exit_code
            return ExecResult(
                stdout=_result_bytes(result, "stdout"), stderr=_result_bytes(result, "stderr"), exit_code=exit_code
            )
        err = res.error or {}
        code = err.get("code")
        message = str(err.get("message") or res.status)
        if code in (codes.TOOL_ERROR, codes.PATH_ESCAPE):  # no such program, not executable, a bad cwd
            missing = "no such program" in message
            return ExecResult(stdout=b"", stderr=(message + "\n").encode(), exit_code=127 if missing else 126)
        raise ExecTransportError(
            command=argv,
            message=f"toolcage exec failed ({res.status}): {message}",
            context={"backend": BACKEND_ID, "status": str(res.status), "code": code, "error": message},
        )

    # PTY sessions -----------------------------------------------------------------------------------------
    def supports_pty(self) -> bool:
        return True

    async def pty_exec_start(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
        tty: bool = False,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        """A toolcage background process (``proc_start``) for the SDK's ``exec_command``: on a terminal with
        ``tty``, else on pipes with stdin closed (``pty_write_stdin`` of any character is the SDK's
        ``RuntimeError``). ``timeout`` is the start's, as for the SDK's own clients (the process lives on)."""
        _ = timeout
        self._check_user(user, "exec")
        argv = self._prepare_exec_command(*command, shell=shell, user=None)
        root = _posix(self.state.manifest.root)
        async with self._pty_lock:  # room first: the sandbox runs at most as many as the SDK keeps
            pruned = self._prune_pty()
        if pruned is not None:
            await self._kill_pty(pruned)
        try:
            proc = await self.sandbox.spawn(
                argv=argv, pty=tty, cwd=root if self._root_ready else contract.SCRATCH, env=self._env or None,
                stdin=tty, name="openai-agents",
            )  # fmt: skip
        except ProcessError as exc:  # the worker's own limits, or a program it cannot start: the sandbox goes on
            raise ExecTransportError(
                command=tuple(argv), message=str(exc), context={"backend": BACKEND_ID}, cause=exc
            ) from exc
        except ToolcageDied as exc:
            raise self._died(exc, "exec", tuple(argv)) from exc
        entry = _PtyEntry(proc=proc, tty=tty)
        async with self._pty_lock:
            process_id = allocate_pty_process_id(set(self._pty))
            self._pty[process_id] = entry
        yield_ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._pty_update(process_id, entry, clamp_pty_yield_time_ms(yield_ms), max_output_tokens)

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        """Type ``chars`` into process ``session_id`` (a terminal's keystrokes: Ctrl-C is ``"\\u0003"``), or
        poll it (``chars`` empty), and return what it wrote meanwhile."""
        async with self._pty_lock:
            entry = self._resolve_pty_session_entry(pty_processes=self._pty, session_id=session_id)
        if chars:
            if not entry.tty:
                raise RuntimeError("stdin is not available for this process")
            try:
                await entry.proc.write(chars)
            except ProcessError:
                pass  # it exited meanwhile (or closed its terminal): the poll below says so
            except ToolcageDied as exc:
                raise self._died(exc, "exec") from exc
        yield_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        yield_ms = resolve_pty_write_yield_time_ms(yield_time_ms=yield_ms, input_empty=chars == "")
        entry.last_used = time.monotonic()
        return await self._pty_update(session_id, entry, yield_ms, max_output_tokens)

    async def pty_terminate_all(self) -> None:
        async with self._pty_lock:
            entries = list(self._pty.values())
            self._pty.clear()
        for entry in entries:
            await self._kill_pty(entry)

    def _prune_pty(self) -> _PtyEntry | None:
        """At the SDK's limit (64), the process its own clients would let go (the least recently used, an
        exited one first, never one of the 8 newest)."""
        if len(self._pty) < PTY_PROCESSES_MAX:
            return None
        meta = [(pid, e.last_used, e.closed) for pid, e in self._pty.items()]
        victim = process_id_to_prune_from_meta(meta)
        return self._pty.pop(victim, None) if victim is not None else None

    async def _kill_pty(self, entry: _PtyEntry) -> None:
        entry.closed = True
        if self._sb is None or not await self.running():
            return
        try:
            await entry.proc.kill()
        except ToolcageError:
            pass  # gone already

    async def _pty_poll(self, entry: _PtyEntry, deadline: float) -> None:
        """One ``proc_read`` (waiting until ``deadline``, at most a few seconds) into ``entry.chunks``."""
        if entry.closed:
            return
        wait = min(max(deadline - time.monotonic(), 0.0), _PTY_POLL_MAX_S)
        params: dict[str, Any] = {"id": entry.proc.id, "since": entry.proc.cursor, "max_bytes": _PTY_READ_MAX}
        if wait > 0:
            params["timeout_s"] = wait
        try:
            # the call's own timeout is generous: a worker slow to answer (64 processes starting under gVisor on
            # a loaded host) is waited for, not taken for a dead sandbox (AsyncProcess.read allows 5 s)
            out = process_output(process_answer(await self.sandbox.call("proc_read", params, timeout=wait + 60)))
            entry.proc.cursor = out.cursor
        except ProcessError:  # the sandbox no longer knows it (ProcessError is a SandboxError: caught first)
            entry.exit_code, entry.closed = entry.exit_code if entry.exit_code is not None else -9, True
            return
        except ToolcageDied as exc:
            raise self._died(exc, "exec") from exc
        if out.data:
            async with entry.lock:
                entry.chunks.append(out.data)
        if not out.running and out.eof:
            entry.exit_code = out.exit_code if out.exit_code is not None else 1
            entry.closed = True

    async def _pty_update(
        self, process_id: int, entry: _PtyEntry, yield_ms: int, max_output_tokens: int | None
    ) -> PtyExecUpdate:
        async def wait(_: float) -> None:
            return  # the next poll waits itself

        output, tokens, closed = await collect_pty_output(
            output_chunks=entry.chunks,
            output_lock=entry.lock,
            output_notify=entry.notify,
            is_done=lambda: entry.closed,
            yield_time_ms=yield_ms,
            max_output_tokens=max_output_tokens,
            poll_output=lambda deadline: self._pty_poll(entry, deadline),
            wait_for_output=wait,
        )
        if not closed:
            return PtyExecUpdate(process_id=process_id, output=output, exit_code=None, original_token_count=tokens)
        async with self._pty_lock:
            self._pty.pop(process_id, None)
        return PtyExecUpdate(process_id=None, output=output, exit_code=entry.exit_code, original_token_count=tokens)

    # exposed ports ----------------------------------------------------------------------------------------
    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        """A relay on the host's ``127.0.0.1`` into the sandbox's ``port`` (``Sandbox.expose``; the same one
        for the session's life)."""
        if self._sb is None or not await self.running():
            raise ExposedPortUnavailableError(
                port=port,
                exposed_ports=self.state.exposed_ports,
                reason="backend_unavailable",
                context={"backend": BACKEND_ID, "detail": "the sandbox is not running"},
            )
        try:
            exposed = self.sandbox.expose(port)
        except ToolcageError as exc:
            raise ExposedPortUnavailableError(
                port=port,
                exposed_ports=self.state.exposed_ports,
                reason="backend_unavailable",
                context={"backend": BACKEND_ID, "detail": str(exc)},
                cause=exc,
            ) from exc
        return ExposedPortEndpoint(host=exposed.host, port=exposed.port, tls=False)

    # files ----------------------------------------------------------------------------------------------
    async def _resolved(self, path: Path | str, *, for_write: bool = False) -> str:
        """Where ``path`` leads in the sandbox, symlinks followed, once the SDK's checks allow it: toolcage's
        file tools never follow a symlink (a write) or an absolute one (a read), so an in-workspace link is
        read and written through its target, as the SDK's other clients do with ``cat``. One helper call;
        when it refuses, the SDK's own check says why, with the SDK's error."""
        policy = self._workspace_path_policy()
        candidate = policy.normalize_sandbox_path(path, for_write=for_write)
        grants = [a for r, ro in policy.extra_path_grant_rules() for a in (r.as_posix(), "1" if ro else "0")]
        helper = RESOLVE_WORKSPACE_PATH_HELPER
        mode = "1" if for_write else "0"
        res = await self.exec(
            str(helper.install_path), policy.sandbox_root().as_posix(), candidate.as_posix(), mode, *grants, shell=False
        )
        real = res.stdout.decode("utf-8", "surrogateescape").strip()
        if res.ok() and real.startswith("/"):
            return real
        await self._validate_remote_path_access(path, for_write=for_write)  # raises the SDK's error
        return _posix(candidate)

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        self._check_user(user, "read")
        where = await self._resolved(path)
        res = await self._call("read_file", {"path": where}, op="read")
        if res.ok and isinstance(res.result, dict):
            r = res.result
            if not r.get("truncated"):
                if r.get("encoding") == "base64":
                    import base64

                    return io.BytesIO(base64.b64decode(str(r.get("content") or "")))
                return io.BytesIO(str(r.get("content") or "").encode("utf-8"))
            try:  # over the output cap: one download
                got = await self._on_thread("read", self._sync.read_files, [where])
            except ToolcageError as exc:
                raise WorkspaceArchiveReadError(path=Path(where), cause=exc) from exc
            return io.BytesIO(got[where])
        message = str((res.error or {}).get("message") or res.status)
        if message.startswith("no such file"):
            raise WorkspaceReadNotFoundError(path=path, context={"backend": BACKEND_ID})
        raise WorkspaceArchiveReadError(path=Path(where), context={"backend": BACKEND_ID, "error": message})

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        self._check_user(user, "write")
        where = await self._resolved(path, for_write=True)
        payload = coerce_write_payload(path=path, data=data)
        content = payload.stream.read()
        if isinstance(content, str):
            content = content.encode("utf-8")
        if len(content) <= _INLINE_MAX:
            import base64

            params = {"path": where, "content": base64.b64encode(content).decode("ascii"), "encoding": "base64"}
            res = await self._call("write_file", params, op="write")
            if not res.ok:
                message = str((res.error or {}).get("message") or res.status)
                raise WorkspaceArchiveWriteError(path=Path(where), context={"backend": BACKEND_ID, "error": message})
            return
        try:
            await self._on_thread("write", self._sync.write_files, {where: bytes(content)})
        except ToolcageError as exc:
            raise WorkspaceArchiveWriteError(path=Path(where), cause=exc) from exc

    # the workspace as a tar ---------------------------------------------------------------------------------
    async def persist_workspace(self) -> io.IOBase:
        """The workspace root as the SDK's tar (``openai_agents_tar``): absolute links into it made relative
        so that a resume takes them back; bounded by what the sandbox may hold there."""
        from toolcage.files import download as transfer
        from toolcage.integrations.openai_agents_tar import persist_bounds, workspace_tar

        root = _posix(self._workspace_root_path())
        skip = {p.as_posix() for p in self._persist_workspace_skip_relpaths()}
        sync = self._sync

        def build() -> IO[bytes]:
            return workspace_tar(
                lambda params: sync.call("download", params),
                root,
                skip,
                max_bytes=persist_bounds(sync.policy, root),
                max_files=transfer.DEFAULT_MAX_FILES,
            )

        try:
            out: io.IOBase = await self._on_thread("persist_workspace", build)
        except ToolcageSandboxError:
            raise
        except (ToolcageError, OSError, tarfile.TarError) as exc:
            raise WorkspaceArchiveReadError(path=Path(root), cause=exc) from exc
        return out

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = _posix(self._workspace_root_path())
        try:
            await self._on_thread("hydrate_workspace", self._hydrate, data, root)
        except ToolcageSandboxError:
            raise
        except UnsafeTarMemberError as exc:
            raise WorkspaceArchiveWriteError(
                path=Path(root), context={"reason": exc.reason, "member": exc.member}, cause=exc
            ) from exc
        except (ToolcageError, OSError, tarfile.TarError) as exc:
            raise WorkspaceArchiveWriteError(path=Path(root), cause=exc) from exc

    def _hydrate(self, data: io.IOBase, root: str) -> None:
        """The SDK's tar checked by the SDK's own rules, rewritten with plain relative names, and sent
        through toolcage's upload (the worker checks it again and keeps nothing unless all of it was good)."""
        from toolcage.files import upload
        from toolcage.files.download import safe_name

        with data, tempfile.TemporaryFile() as raw, tempfile.TemporaryFile() as clean:  # the SDK hands it over
            while chunk := data.read(_CHUNK):
                raw.write(chunk.encode("utf-8") if isinstance(chunk, str) else chunk)
            raw.seek(0)
            with tarfile.open(fileobj=raw, mode="r:*") as tar:
                validate_tarfile(tar, allow_external_symlink_targets=False)
            raw.seek(0)
            with (
                tarfile.open(fileobj=raw, mode="r:*") as tar,
                tarfile.open(fileobj=clean, mode="w", format=tarfile.PAX_FORMAT) as out,
            ):
                for m in tar:
                    name = safe_name(m.name)
                    if name is None or not (m.isreg() or m.isdir() or m.issym()):
                        continue
                    m.name = name
                    out.addfile(m, tar.extractfile(m) if m.isreg() else None)
            clean.seek(0)

            def pieces() -> Iterator[bytes]:
                while piece := clean.read(_CHUNK):
                    yield piece

            self._sync.call("exec", {"argv": ["mkdir", "-p", root]})
            upload.send(lambda params: self._sync.call("upload", params), pieces(), root, shown=root)


# the client -----------------------------------------------------------------------------------------------


def toolcage_session(session: BaseSandboxSession) -> ToolcageSandboxSession:
    """The toolcage session inside the SDK's ``SandboxSession`` wrapper (for ``changes()``, ``sandbox``)."""
    inner = getattr(session, "_inner", session)
    if not isinstance(inner, ToolcageSandboxSession):
        raise TypeError(f"not a toolcage session: {type(inner).__name__}")
    return inner


class ToolcageSandboxClient(BaseSandboxClient[ToolcageSandboxClientOptions | None]):
    """The OpenAI Agents SDK's sandbox client for toolcage: ``SandboxRunConfig(client=ToolcageSandboxClient(),
    options=ToolcageSandboxClientOptions(...))``; the options may be left out (the defaults: the ``default``
    policy, no network). ``secrets``: the values a resumed session's policy needs (a session state never
    holds them). ``pool_size``: keep that many sandboxes of the client's own options started ahead (a
    ``toolcage.AsyncPool``); a session created or resumed with those options adopts one and fills its workspace
    copy (or its snapshot's files) then, instead of starting a container; a session with other options starts
    cold. ``await client.close()`` removes the slots not taken (they go at exit anyway)."""

    backend_id = BACKEND_ID
    supports_default_options = True

    def __init__(
        self,
        options: ToolcageSandboxClientOptions | None = None,
        *,
        secrets: Mapping[str, str] | None = None,
        instrumentation: Instrumentation | None = None,
        dependencies: Dependencies | None = None,
        pool_size: int = 0,
    ) -> None:
        super().__init__()
        if options is not None and not isinstance(options, ToolcageSandboxClientOptions):
            raise TypeError("options must be a ToolcageSandboxClientOptions")
        self.default_options = options if options is not None else ToolcageSandboxClientOptions()
        self._secrets = dict(secrets or {})
        self._instrumentation = instrumentation if instrumentation is not None else Instrumentation()
        self._dependencies = dependencies
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 0:
            raise UsageError(f"pool_size must be a non-negative integer, not {pool_size!r}")
        self.pool = AsyncPool(**self.default_options.pool_kwargs(), size=pool_size) if pool_size else None
        """The warm pool (``pool_size``), or None."""

    def _pool_for(self, options: ToolcageSandboxClientOptions | Mapping[str, Any]) -> AsyncPool | None:
        """The pool, for a session whose options are the client's own (their secrets aside)."""
        persisted = options if isinstance(options, Mapping) else options.persisted()
        return self.pool if self.pool is not None and persisted == self.default_options.persisted() else None

    async def close(self) -> None:
        """Remove the pool's slots not taken (``pool_size``); sessions already started stay until deleted."""
        if self.pool is not None:
            await self.pool.close()

    @staticmethod
    def _check_manifest(manifest: Manifest) -> None:
        root = _posix(manifest.root)
        if not any(root == r or root.startswith(r + "/") for r in ROOTS):
            raise _unsupported(
                f"the manifest root {root!r}",
                "it must be /workspace (the writable workspace copy), or under it or /scratch",
            )
        if list(manifest.mount_targets()):
            raise _unsupported("manifest mounts", "toolcage mounts nothing into the sandbox; copy files in instead")
        if manifest.users or manifest.groups:
            raise _unsupported(
                "manifest users and groups", f"every process runs as the one unprivileged user {SANDBOX_USER!r}"
            )

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: ToolcageSandboxClientOptions | None = None,
    ) -> SandboxSession:
        if options is not None and not isinstance(options, ToolcageSandboxClientOptions):
            raise TypeError("ToolcageSandboxClient takes ToolcageSandboxClientOptions")
        opts = options if options is not None else self.default_options
        manifest = manifest if manifest is not None else Manifest()
        self._validate_manifest_for_create(manifest)
        self._check_manifest(manifest)
        session_id = uuid.uuid4()
        state = ToolcageSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            options=opts.persisted(),
            exposed_ports=opts.exposed_ports,
        )
        return self._wrap_session(
            ToolcageSandboxSession(state=state, options=opts, pool=self._pool_for(opts)),
            instrumentation=self._instrumentation,
        )

    async def delete(self, session: SandboxSession) -> SandboxSession:
        await toolcage_session(session)._close()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """A fresh sandbox for ``state`` (toolcage never reattaches a container): from its toolcage snapshot
        when there is one (restored before the first call), else the SDK restores its snapshot at start."""
        if not isinstance(state, ToolcageSandboxSessionState):
            raise TypeError("ToolcageSandboxClient.resume expects a ToolcageSandboxSessionState")
        # as every SDK client does first: a state whose path grants or mount credentials were redacted for
        # serialisation is refused, never resumed with the grants it no longer proves
        state.assert_path_grants_rebound()
        self._check_manifest(state.manifest)
        secrets = self._secrets or dict(self.default_options.secrets)
        opts = ToolcageSandboxClientOptions.from_persisted(state.options, secrets)
        resume_from = None
        if isinstance(state.snapshot, ToolcageSnapshot) and await state.snapshot.restorable():
            resume_from = state.snapshot.path()
        state.workspace_root_ready = False
        inner = ToolcageSandboxSession(
            state=state, options=opts, resume_from=resume_from, pool=self._pool_for(state.options)
        )
        inner._set_start_state_preserved(False)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, ToolcageSandboxSessionState)


# the Python interpreter (issue 38) -------------------------------------------------------------------------

_CONTEXT_ID = {"type": "string", "maxLength": 64, "description": "the context's id (code_context_create's answer)"}
# the worker's code_* tools, as the model sees them (their params as the worker checks them: a bad one is a
# failed call naming the field, which the model reads)
_CODE_TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "code_run": (
        "Run Python code (an IPython cell) in a stateful context: variables, imports and open files persist "
        "between calls. Returns JSON: results (MIME bundles; is_main_result marks the last expression's value), "
        "logs {stdout, stderr}, error {name, value, traceback} or null, execution_count, status. A matplotlib "
        "figure left open (or display()ed) comes back as an image, shown to you after the JSON.",
        {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "Python code (a cell: IPython syntax, !cmd and %magic too)"},
                "context": {**_CONTEXT_ID, "description": "the context's id; default: the run's default context"},
                "timeout_s": {"type": "number", "description": "seconds before the cell is interrupted"},
            },
            "required": ["code"],
            "additionalProperties": False,
        },
    ),
    "code_context_create": (
        "Create a Python context (fresh state, apart from the others) and return its id.",
        {
            "type": "object",
            "properties": {"cwd": {"type": "string", "description": "its working directory; default /scratch"}},
            "additionalProperties": False,
        },
    ),
    "code_context_list": (
        "List the Python contexts.",
        {"type": "object", "properties": {}, "additionalProperties": False},
    ),
    "code_context_restart": (
        "Restart a Python context: its state is dropped, its id kept.",
        {
            "type": "object",
            "properties": {"context": _CONTEXT_ID},
            "required": ["context"],
            "additionalProperties": False,
        },
    ),
    "code_context_remove": (
        "Remove a Python context (its process ends).",
        {
            "type": "object",
            "properties": {"context": _CONTEXT_ID},
            "required": ["context"],
            "additionalProperties": False,
        },
    ),
}
_CODE_INSTRUCTIONS = (
    "Use `code_run` for Python that builds on earlier steps (load a data file once, then query it): its "
    "context keeps its variables between calls. To see a chart, leave a matplotlib figure open at the end of "
    "the cell (no savefig needed): it comes back to you as an image."
)


def code_output(res: CallResult) -> str | list[ToolOutputText | ToolOutputImage]:
    """A ``code_*`` call's outcome as the model is shown it: the answer's JSON; for ``code_run`` with PNG or JPEG
    results, that JSON (each image a short placeholder) then each image as a ``ToolOutputImage`` (a data URL,
    as the SDK's ``view_image`` answers); a failed call, its status and error as text."""
    if not res.ok:
        err = res.error or {}
        text = f"tool failed: status {res.status}, error {err.get('code')}: {escape(err.get('message'))}"
        return text + (f"\n{dumps(err['data'])}" if err.get("data") is not None else "")
    shown, images = split_images(res.result, "shown after this text") if res.tool == "code_run" else (res.result, [])
    if not images:
        return dumps(shown)
    return [
        ToolOutputText(text=dumps(shown)),
        *(ToolOutputImage(image_url=f"data:{i['mime']};base64,{i['data']}") for i in images),
    ]


def _code_tool(session: ToolcageSandboxSession, name: str) -> FunctionTool:
    description, schema = _CODE_TOOLS[name]

    async def invoke(_: object, raw: str) -> str | list[ToolOutputText | ToolOutputImage]:
        try:
            params = json.loads(raw or "{}")
        except ValueError as exc:
            return f"the arguments are not JSON: {exc}"
        if not isinstance(params, dict):
            return "the arguments must be a JSON object"
        return code_output(await session._call(name, params, op="exec"))

    return FunctionTool(
        name=name,
        description=description,
        params_json_schema=schema,
        on_invoke_tool=invoke,
        strict_json_schema=False,
    )


class ToolcageCodeInterpreter(Capability):
    """A ``SandboxAgent`` capability: toolcage's stateful Python interpreter as tools (``code_run``,
    ``code_context_create``, ``_list``, ``_restart``, ``_remove``), on a ``ToolcageSandboxClient`` session.

        SandboxAgent(..., capabilities=[Filesystem(), Shell(), ToolcageCodeInterpreter()])

    A cell's PNG and JPEG results (a matplotlib figure) reach the model as images, the way the SDK's own
    ``view_image`` answers (``ToolOutputImage`` data URLs, after the answer's JSON, in which each image is a
    short placeholder): no file to save and view. A failed call is text naming toolcage's status and error; a
    sandbox that died is :class:`ToolcageSandboxError`, as for ``exec``."""

    type: Literal["toolcage_code_interpreter"] = "toolcage_code_interpreter"

    def tools(self) -> list[Tool]:
        if self.session is None:
            raise ValueError("ToolcageCodeInterpreter is not bound to a SandboxSession")
        session = toolcage_session(self.session)
        return [_code_tool(session, name) for name in _CODE_TOOLS]

    async def instructions(self, manifest: Manifest) -> str | None:
        return _CODE_INSTRUCTIONS


__all__ = [
    "ToolcageCodeInterpreter",
    "ToolcageSandboxClient",
    "ToolcageSandboxClientOptions",
    "ToolcageSandboxError",
    "ToolcageSandboxSession",
    "ToolcageSandboxSessionState",
    "ToolcageSnapshot",
    "ToolcageSnapshotSpec",
    "code_output",
    "toolcage_session",
]
