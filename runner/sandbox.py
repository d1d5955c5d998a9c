"""``Sandbox``: one run of the worker behind a backend (a hardened container, or a local process).

Lifecycle: audit ``run.started`` → backend start → calls through one session → remove.
Everything is removed on every exit path (normal close, exceptions, SIGINT/SIGTERM,
interpreter exit) unless ``keep=True``; the run deadline and the idle timeout kill it.
Which backend runs the worker is the backend's business (``toolcage.backends``); which
answer belongs to which call, the session's (``toolcage.rpc.session``); the options a run is made
from, ``toolcage.options``; its id, container spec and audit records, ``toolcage.run``; how long
a call may take, ``toolcage.timing``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import IO, TYPE_CHECKING, Any, Unpack

from toolcage import connectors, telemetry, timing
from toolcage.backends import in_container
from toolcage.engine.api import EngineAPI
from toolcage.errors import (
    ProtocolError,
    SandboxError,
    ToolcageError,
    UsageError,
)
from toolcage.interpreter import CodeInterpreter
from toolcage.lifecycle import records, removal
from toolcage.options import DEFAULT_IMAGE as DEFAULT_IMAGE  # re-exported: toolcage.DEFAULT_IMAGE
from toolcage.options import RunOptions, resolve_audit
from toolcage.options import resolve_policy as resolve_policy  # re-exported: its home is toolcage.options
from toolcage.policies import PolicySource, contract
from toolcage.results import CallResult, RunSummary, from_response
from toolcage.rpc.session import Cancel, Ended, OnProgress, Session
from toolcage.run import Run
from toolcage.run import interrupted_error as interrupted_error  # re-exported (mcp serve)

if TYPE_CHECKING:
    from toolcage.files.changes import Changes
    from toolcage.files.download import DownloadResult
    from toolcage.files.imagepaths import Originals
    from toolcage.files.snapshot import SnapshotInfo
    from toolcage.files.upload import Scan, UploadResult
    from toolcage.lifecycle.ports import ExposedPort, Ports
    from toolcage.pool import Pool, Slot
    from toolcage.processes import Process, SpawnOptions
    from toolcage.results import NetworkChange


class _Background:
    """A function run on a thread of its own; ``result()`` waits for it and returns or raises what it did."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._fn = fn
        self._out: Any = None
        self._err: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="toolcage-copy-walk", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._out = self._fn()
        except BaseException as exc:
            self._err = exc

    def result(self) -> Any:
        self._thread.join()
        if self._err is not None:
            raise self._err
        return self._out


class Sandbox(CodeInterpreter):
    """A sandboxed worker for one run. Use as a context manager; ``call`` tools on it.

    ``policy``: a bundled name, a file, a mapping or a Policy; ``run_s`` (its deadline, 60 s in the bundled
    policies), ``memory`` and ``scratch`` (sizes: bytes, ``"512m"``, ``"1g"``) set those of its knobs for
    this run, checked as the policy's own (the CLI's ``--run-s``, ``--memory``, ``--scratch``).

    ``writable``: paths of the image (``("/testbed", "/root")``) writable for this run, each a tmpfs of
    ``writable_size`` (default 256m) the runner fills with the image's content there before the first call:
    writes past it get ENOSPC, other runs never see them, nothing is left after the run, and the root stays
    read-only elsewhere. The sizes, with ``scratch``, count against ``memory`` (a tmpfs is memory: raise it for
    bigger paths). ``changes(path="/testbed")`` is then the diff against the image's tree there
    (toolcage.files.imagepaths)."""

    # close() returns once the worker's input is closed; the container is removed by a background
    # thread (toolcage.wait_removed() waits for it; at exit it is waited for anyway)
    remove_in_background = True

    def __init__(
        self,
        policy: PolicySource = "default",
        *,
        workspace: str | os.PathLike[str] | None = None,
        tool: str = "session",
        sandbox: str | None = None,
        image: str | None = None,
        keep: bool = False,
        run_timeout: float | None = None,
        engine: EngineAPI | None = None,
        egress_network: str | None = None,
        egress_proxy: str | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        audit: Any = None,
        tools: Iterable[str | os.PathLike[str]] = (),
        secrets: Mapping[str, str] | None = None,
        pool: Pool | None = None,
        workspace_mode: str = "ro",
        workspace_gitignore: bool = False,
        workspace_cache: bool = False,
        resume: str | os.PathLike[str] | IO[bytes] | None = None,
        snapshot_key: bytes | None = None,
        run_s: float | None = None,
        memory: int | str | None = None,
        scratch: int | str | None = None,
        writable: Iterable[str] | str = (),
        writable_size: int | str | None = None,
        expose: Iterable[int] = (),
    ) -> None:
        # pool: start() adopts one of its pre-started sandboxes, made for the pool's policy, workspace,
        # tools and image (toolcage.pool); this run brings its secrets, and its deadline starts at adoption
        self._pool = pool
        self._resume = None
        # ports to expose once started (expose()); the relays live in self._ports (toolcage.lifecycle.ports),
        # imported only by a run that exposes one
        self._expose_at_start = tuple(expose)
        if self._expose_at_start:
            from toolcage.lifecycle.ports import check_port

            self._expose_at_start = tuple(check_port(port) for port in self._expose_at_start)
        self._ports: Ports | None = None
        if pool is not None:
            own = (run_timeout, workspace, image, run_s, memory, scratch, writable_size)
            if keep or tools or writable or any(value is not None for value in own):
                raise UsageError(
                    "a pooled sandbox takes its policy, workspace, tools, image, writable paths, timeouts and limits "
                    "from its pool"
                )
            if workspace_mode != "ro" or workspace_gitignore or workspace_cache:
                raise UsageError(
                    "a pooled sandbox takes its workspace mode from its pool: "
                    "Pool(workspace=..., workspace_mode='copy')"
                )
        if resume is not None:  # checked before anything starts (or a slot is taken): a tampered one never runs
            from toolcage.files import snapshot

            self._resume = snapshot.verify(resume, snapshot_key)
            if pool is None and self._resume.workspace:  # a snapshot with a workspace copy resumes into one
                workspace_mode = "copy"
            elif pool is not None and self._resume.workspace != pool.options.workspace_copy:
                self._resume.close()
                raise UsageError(
                    "this snapshot has a workspace copy: resume it from a pool made with workspace_mode='copy'"
                    if self._resume.workspace
                    else "this snapshot has no workspace copy and the pool's slots copy theirs: resume it from a "
                    "pool without workspace_mode='copy', or with Sandbox(resume=...)"
                )
        if pool is not None:
            opts = pool.options if audit is None else dataclasses.replace(pool.options, audit=resolve_audit(audit))
        else:
            opts = RunOptions.resolve(
                policy, tool=tool, sandbox=sandbox, image=image, workspace=workspace, tools=tools,
                run_timeout=run_timeout, engine=engine, egress_network=egress_network, egress_proxy=egress_proxy,
                ca_file=ca_file, audit=audit, keep=keep, workspace_gitignore=workspace_gitignore,
                workspace_mode=workspace_mode, run_s=run_s, memory=memory, scratch=scratch,
                writable=writable, writable_size=writable_size, workspace_cache=workspace_cache,
            )  # fmt: skip
        self.options = opts
        # workspace_cache: the spec's copy_lower (the cached tree this run lays its copy over), decided at start;
        # or, in the run that fills the cache (_make_cached), its copy_target
        self._copy_spec: dict[str, str] = {}
        self._copy_plan: Any = None  # (engine, path label, the tree mounted, the walk checking it or None)
        self._copy_laid = True  # a mounted tree is laid (False: the walk found it changed, the copy is filled)
        self._originals: Originals | None = None  # writable=: the image's trees, read at start
        self._scan: Scan | None = None  # the workspace copy's one walk (its size check), until the copy is sent
        if opts.workspace_copy and opts.workspace is not None and self._resume is None and not opts.workspace_cache:
            self._check_copy_size()  # (a cached copy: at start, and only if the tree is not in the cache)
        self._snapshot_key = snapshot_key
        self._prior_changes: list[str] = list(self._resume.changed) if self._resume is not None else []
        self.policy, self.kind, self.image, self.tool = opts.policy, opts.kind, opts.image, opts.tool
        self.workspace, self.tool_sources, self.keep, self.audit = opts.workspace, opts.tool_sources, keep, opts.audit
        # the run's secrets, checked against the policy before anything starts
        self._secrets = connectors.secret_store(self.policy, secrets)
        self.connector_tools: list[str] = []
        self._run = Run(opts)  # pooled: replaced at adoption by the slot's prestarted Run
        self.run_id, self.name, self.log = self._run.run_id, self._run.name, self._run.log
        if pool is None:  # (pooled: NotAdopted until adoption)
            # (redact: the proxy's records; late_egress: the first answer does not wait for the egress proxy)
            self._run.make_backend(redact=self._secrets.redact if self._secrets else None, late_egress=True)
        self._lock = threading.Lock()  # the run's state; calls themselves run at once (answers matched by id)
        self._network_lock = threading.Lock()  # live network changes, one at a time
        self._configure_answer: Callable[[], dict[str, Any] | Ended] | None = None  # pooled: still to read
        self._start_called = False
        self._closed = False
        self._running = False  # set once start() succeeded
        self._usage: dict[str, Any] = {}
        self.summary: RunSummary | None = None
        if pool is None:
            opts.warn_unreadable_workspace(self.log, self._run.backend.sandbox_user)

    def _check_copy_size(self) -> None:
        """A workspace whose copy would not fit in limits.workspace_copy is refused before anything starts. The
        walk is taken once: the copy sends what it found (a cached copy walks only when the cache cannot serve)."""
        from toolcage.files.upload import scan

        assert self.options.workspace is not None
        if self._scan is not None:
            return
        self._scan = scan(self.options.workspace, self.options.workspace_gitignore)  # the copy sends what it found
        self._check_size(self._scan.size, self._scan.entries)

    def _check_size(self, need: int, entries: int) -> None:
        from toolcage.errors import WorkspaceError

        assert self.options.workspace is not None
        cap = self.options.policy.limits.workspace_copy
        if need > cap:
            mib = 1 << 20
            hint = "" if self.options.workspace_gitignore else ", or leave out what git ignores (workspace_gitignore)"
            counted = f"{entries} entries; " if entries else ""
            raise WorkspaceError(
                f"the workspace {str(self.options.workspace)!r} takes about {need / mib:.1f} MiB as a copy ({counted}"
                f"a tmpfs keeps each file in whole 4 KiB pages), more than limits.workspace_copy "
                f"({cap / mib:.1f} MiB): raise it in the policy (it counts against limits.memory){hint}"
            )

    @property
    def container_id(self) -> str | None:
        return self._run.backend.container_id

    # lifecycle ------------------------------------------------------------------------
    @property
    def dead(self) -> SandboxError | None:
        """Why the sandbox can take no more calls (its deadline, idle timeout, a crash), or None."""
        return self._run.dead

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self.interrupt()
        self.close()

    def start(self) -> Sandbox:
        self.claim_start()
        if self._pool is not None:
            return self.adopt(self._pool.take())
        session = self._run.session = Session(
            max_line=self._run.max_line,
            on_stderr_line=lambda line: self.log.debug("worker.stderr", line=line),  # shown with -vv
            on_broken=self._run.on_protocol_violation,
            redact=self._secrets.redact if self._secrets else None,  # after the worker's own redaction
        )
        try:
            if self.options.writable:  # read before the sandbox exists: a path the image lacks starts nothing
                self._read_image_paths()
            if self.options.workspace_cache and not self._copy_spec and self._resume is None and self.workspace:
                self._copy_spec = self._cached_copy()
            self._run.begin(session.parser, closer=self.close, spec_extra=self._copy_spec)
            if self._copy_plan is not None:
                self._copy_word()
        except BaseException as exc:
            if not isinstance(exc, Exception):
                self.interrupt()
            self.close()
            raise
        self._running = True
        try:
            if self.tool_sources or self._secrets:
                self._configure()
            self._fill()
            self._expose_started()
        except BaseException:
            self.close()
            raise
        return self

    def _cached_copy(self) -> dict[str, str]:
        """workspace_cache: the cached tree this run's container mounts (the spec's field), or {} where the engine
        cannot lay one or the tree is not kept (the copy is then made at start, as without the cache).

        The engine's record of the workspace's path decides (toolcage.engine.copycache.PathState): a tree started
        before is kept now (a run of toolcage's own fills the cache, then this run lays it); a tree seen the first
        time is only noted (one that changes every run never costs a second fill); and when the newest kept tree
        is likely the one (no other tree started since it was made), the container starts with it while the
        walk that checks it runs (:meth:`_copy_word` says lay or fill before the worker reads anything)."""
        from toolcage.backends.container import ContainerBackend
        from toolcage.engine import copycache
        from toolcage.files.treekey import key
        from toolcage.options import worker_image

        backend = self._run.backend
        engine = getattr(backend, "engine", None)
        if (
            not isinstance(backend, ContainerBackend)
            or engine is None
            or backend.runtime.name is not None  # gVisor: the copy is made at start
            or engine.flavor().name != "docker"
            or not copycache.usable(engine, worker_image())
        ):
            self._check_copy_size()
            return {}
        workspace, gitignore = self.workspace, self.options.workspace_gitignore
        assert workspace is not None
        where = copycache.path_label(workspace)
        known = copycache.state(engine, where)
        guess = known.guess()
        if guess is not None:  # the walk runs while the container starts
            walk = _Background(lambda: key(workspace, gitignore))
            self._copy_plan = (engine, where, guess, walk)
            return {"copy_lower": guess.volume}
        k = key(workspace, gitignore)
        got = known.ready.get(k)
        if got is None and k not in known.seen:
            copycache.mark_seen(engine, k, where)
            self._check_copy_size()
            return {}
        if got is None:
            self._check_copy_size()
            got = self._make_cached(engine, k)
        else:
            self._check_size(got.size, 0)
        self._copy_plan = (engine, where, got, None)
        return {"copy_lower": got.volume}

    def _copy_word(self) -> None:
        """The cached copy's word to the worker, before anything else it reads: ``lay`` the tree its container
        mounts, or ``fill`` (the walk found the tree changed since: the copy is made as without the cache, and
        the tree noted, so that its next start keeps it)."""
        from toolcage.engine import copycache

        assert self._run.session is not None and self._copy_plan is not None
        engine, where, mounted, walk = self._copy_plan
        self._copy_plan = None
        k = walk.result() if walk is not None else mounted.key
        if k == mounted.key:
            self._check_size(mounted.size, 0)
            self._run.session.preface(b"lay\n")
            self.log.info("workspace.copy_cached", volume=mounted.volume)
            return
        self._run.session.preface(b"fill\n")
        self._copy_laid = False
        copycache.mark_seen(engine, k, where)
        self._check_copy_size()

    def _make_cached(self, engine: EngineAPI, k: str) -> Any:
        """The tree of key ``k`` into a new volume of the engine's cache: filled by a run of toolcage's own that
        runs no code (no network, the worker image, this run's limits and audit log) through the upload protocol,
        as any copy is made, with the volume itself at /workspace; then its marker (toolcage.engine.copycache)."""
        from toolcage.engine import copycache
        from toolcage.options import worker_image
        from toolcage.policies.model import NetworkPolicy

        assert self.workspace is not None and self._scan is not None
        where = copycache.path_label(self.workspace)
        data = copycache.new_volume(engine, worker_image(), k, where)
        try:
            filler = Sandbox(
                # it runs no code: no network, and so no secret (a policy's secrets must go where its network may)
                dataclasses.replace(self.policy, network=NetworkPolicy(), secrets={}),
                tool="toolcage-copy", image=worker_image(),
                workspace=self.workspace, engine=engine, workspace_mode="copy",
                workspace_gitignore=self.options.workspace_gitignore, audit=self.options.audit, workspace_cache=True,
            )  # fmt: skip
            filler._copy_spec = {"copy_target": data}  # the volume is its /workspace (and it never looks it up)
            filler._scan, size = self._scan, self._scan.size  # this run's own walk: the copy sends what it found
            self._scan = None
            with filler:
                pass
        except BaseException:
            copycache.drop(engine, data)
            raise
        return copycache.record(engine, k, where, data, size, self.log)

    def _read_image_paths(self) -> None:
        """writable=: the image's trees at its writable paths, read by the engine (toolcage.files.imagepaths)."""
        from toolcage.engine import labels as run_labels
        from toolcage.engine import ownership
        from toolcage.files.imagepaths import FETCH_SECONDS, Originals

        engine = getattr(self._run.backend, "engine", None)
        if engine is None:
            raise UsageError(f"writable= needs a container sandbox, and this run's is {self.kind}")
        owner, owner_started = ownership.owner()
        labels = {
            run_labels.LABEL_RUN_ID: self.run_id, run_labels.LABEL_TOOL: self.tool,
            run_labels.LABEL_OWNER: owner, run_labels.LABEL_OWNER_STARTED: owner_started,
            run_labels.LABEL_OWNER_NS: ownership.namespace_key(),
            run_labels.LABEL_DEADLINE: f"{time.time() + 2 * FETCH_SECONDS:.3f}", run_labels.LABEL_KEEP: "0",
        }  # fmt: skip
        check = getattr(self._run.backend, "check_writable", None)
        if check is not None:  # an image that runs its own worker: never the paths that worker runs from
            check(self.options.writable)
        self._originals = Originals()
        self._originals.read(engine, self.image, self.options.writable, labels)

    def _fill(self) -> None:
        """A resumed run's files (its snapshot's scratch, and its workspace copy), or the workspace copy; the
        writable paths of the image (writable=)."""
        laid = "copy_lower" in self._copy_spec and self._copy_laid
        copy = self.options.workspace_copy and self.workspace is not None and not laid
        if self._resume is None and not copy and self._originals is None:
            return  # nothing to fill (the common run): the transfer modules are not even imported
        from toolcage.files import upload

        def call(params: dict[str, Any]) -> CallResult:
            return self.call("upload", params)

        if self._resume is not None:
            try:
                if self.options.workspace_copy:
                    upload.send(call, self._resume.tar_of("workspace"), contract.WORKSPACE, base=True)
                upload.send(call, self._resume.tar_of("scratch"), contract.SCRATCH)
            finally:
                self._resume.close()
            self.log.info("run.resumed", entries=self._resume.entries)
        elif copy:
            assert self.workspace is not None
            got = upload.upload(
                call,
                self.workspace,
                contract.WORKSPACE,
                gitignore=self.options.workspace_gitignore,
                base=True,
                checked=True,
                scanned=self._scan,
            )
            self._scan = None  # its names: host memory, not needed past the copy
            self.log.info("workspace.copied", files=got.files, bytes=got.bytes, withheld=got.withheld_count)
            if got.withheld_count:  # what uid 65532 could not read through the mount is not in the copy either
                self.log.warning(
                    "workspace.withheld", count=got.withheld_count, paths=got.withheld[:20],
                    hint=f"uid {contract.SANDBOX_UID} (the sandbox) could not read these: `chmod o+rX` to copy them",
                )  # fmt: skip
        if self._originals is not None:
            self._originals.fill(call, self.log)

    # the async twin's side (toolcage.aio.AsyncSandbox): internal, not for users ----------------------
    def claim_start(self) -> None:
        """(Internal: start()'s first step, and AsyncSandbox.start's, before it awaits a slot.) The one
        start of this run."""
        with self._lock:
            if self._closed and not self._start_called:
                raise UsageError("this sandbox was closed before it started: make a new one")
            # a Sandbox is one run: a second start() would adopt a second slot (orphaning the first) or
            # create a second container under the first one's name
            if self._start_called:
                raise UsageError(
                    "this sandbox was already started: a Sandbox is one run; make a new one for another run"
                    " (Sandbox(...), pool.sandbox())"
                )
            self._start_called = True

    def adopt(self, slot: Slot) -> Sandbox:
        """(Internal: a pooled start()'s, and AsyncSandbox.start's.) Take ``slot``, one of a pool's
        pre-started sandboxes (``pool.take()``), for this run, and this run only: the slot's id is the run
        id (its labels were set when it was made); the run's deadline and secrets go to the worker now,
        over the protocol: without waiting for its answer unless the pool has connector sources (``tools=``:
        the answer lists their tools) or the run fills the slot (a copy pool's workspace, a resumed snapshot's
        files), so adopting a slot for a plain run never blocks."""
        run = self._run = slot.run.adopt(self.options)  # the pool's prestarted run, now this one's; its clock starts
        self.run_id, self.name, self.log = run.run_id, run.name, run.log
        # the session's callbacks (stderr, protocol violations, redaction) now reach this run
        redact = self._secrets.redact if self._secrets else None
        run.backend = slot.adopted_by(self.log, run.on_protocol_violation, redact)
        self._running = True
        run.begin(
            None, closer=self.close, image_id=slot.image_id, pool=slot.pool.id, container_id=self.container_id,
            slot_created_at=slot.created_at, slot_age_ms=round((run.started - slot.created) * 1000),
        )  # fmt: skip
        try:
            self._configure(deadline=time.time() + self.policy.timeouts.run_s)
            self._fill()  # a copy pool's workspace, or a snapshot's files: into the slot, after adoption
            self._expose_started()
        except BaseException:
            self.close()
            raise
        return self

    @property
    def fills_at_start(self) -> bool:
        """(Internal: AsyncSandbox.start's.) Does starting this run upload files (a workspace copy, a resumed
        snapshot's), so that adopting a slot blocks on the worker's answers?"""
        return self._resume is not None or (self.options.workspace_copy and self.workspace is not None)

    def _configure(self, deadline: float | None = None) -> None:
        """Hand the worker its connector sources and the secret values (the only time they cross), and
        for a pooled sandbox its run's deadline (epoch seconds)."""
        session = self._run.session
        assert session is not None
        params = connectors.configure_params(self.tool_sources, in_container(self.kind), self._secrets)
        if deadline is not None:
            params["deadline"] = round(deadline, 3)
        until = timing.answer_due(time.monotonic(), None, None, self.policy.timeouts.call_s, self._run.deadline)
        if deadline is not None and not self.tool_sources:
            # pooled, no connectors to list: the first call goes right behind it (see settle_configure)
            self._configure_answer = session.send_now(contract.CONFIGURE, params, until)
            return
        answer = session.request(contract.CONFIGURE, params, until)
        if isinstance(answer, Ended):
            raise self._run.explain_end(answer)
        self._configured(connectors.configured(answer))

    def settle_configure(self) -> None:
        """(Internal: before a call's answer, and a forwarded line's, toolcage.servers.serve.) The answer to
        a configuration sent without waiting (it comes before any later call's)."""
        wait, self._configure_answer = self._configure_answer, None
        if wait is None:
            return
        answer = wait()
        if isinstance(answer, Ended):
            raise self._run.explain_end(answer)
        try:
            took = connectors.configured(answer)
        except UsageError as exc:  # the host checked the secrets already: the worker is not the one we know
            self._run.end(ProtocolError(f"the sandbox refused its run's configuration ({exc.message}); it was killed"))
            assert self._run.dead is not None
            raise self._run.dead from None
        self._configured(took)

    def _configured(self, took: dict[str, Any]) -> None:
        self.connector_tools = list(took.get("tools") or [])
        self.log.info("run.configured", tools=self.connector_tools, secrets=took.get("secrets"))
        if self.audit is not None:
            self.audit.event_later(
                "run.configured",
                run_id=self.run_id,
                sources=[str(s.path) for s in self.tool_sources],
                tools=self.connector_tools,
                secrets=took.get("secrets"),
            )

    def interrupt(self) -> SandboxError:
        """Stop the run now, as its runner was told to (SIGINT, SIGTERM): kill the sandbox, record
        ``interrupted``. Never waits on the worker, which may be busy. Returns why the run ended
        (an earlier reason, such as the deadline, wins)."""
        return self._run.interrupt()

    # calls ----------------------------------------------------------------------------
    def call(
        self,
        tool: str,
        params: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        on_progress: OnProgress | None = None,
        cancel: Cancel | None = None,
    ) -> CallResult:
        """Call a tool in the sandbox. Tool outcomes come back as a CallResult; sandbox failures raise.

        ``on_progress(params)`` gets MCP-shaped progress while the call runs (``progress``, and
        ``message``: ``run_python``/``run_shell`` output as it comes, a connector's reports with
        ``total``); it runs on the reader thread, so keep it short. ``cancel`` (a :class:`Cancel`)
        lets another thread cancel the call: its processes are killed, the sandbox stays usable
        and the call returns with status ``cancelled``."""
        session, params, until = self.begin_call(tool, params, timeout)
        started = time.monotonic()
        try:
            answer = session.request(tool, params, until, on_progress=on_progress, cancel=cancel)
        except BaseException as exc:
            if not isinstance(exc, Exception):  # KeyboardInterrupt, or SystemExit from a signal handler
                self.interrupt()
            raise
        return self.end_call(tool, params, answer, started)

    def begin_call(
        self, tool: str, params: dict[str, Any] | None, timeout: float | None
    ) -> tuple[Session, dict[str, Any] | None, float]:
        """(Internal: call()'s first half, and AsyncSandbox.call's.) Check that a call can be made now; the
        session, the params as sent (a child's timeout cut to the time left in the run, toolcage.timing) and the
        monotonic time the answer is due by. Calls from several threads (or tasks) run at once: the worker
        matches answers by id."""
        if params is not None and not isinstance(params, dict):
            raise UsageError("params must be a JSON object")
        with self._lock:
            run = self._run
            if run.dead is not None:
                raise run.dead
            if run.session is None or not run.session.connected or self._closed:
                raise UsageError("the sandbox is not running: use it as a context manager or call start()")
            now, call_s = time.monotonic(), self.policy.timeouts.call_s
            params = timing.fit_params(tool, params, call_s, run.deadline - now)
            return run.session, params, timing.answer_due(now, params, timeout, call_s, run.deadline, tool)

    def end_call(
        self, tool: str, params: dict[str, Any] | None, answer: dict[str, Any] | Ended, started: float
    ) -> CallResult:
        """(Internal: call()'s second half, and AsyncSandbox.call's.) The worker's answer as a CallResult, audited;
        an answer that never came as the error it means."""
        with self._lock:
            if isinstance(answer, Ended):
                raise self._run.explain_end(answer)
            self.settle_configure()  # pooled: answered before this call was
            result = from_response(tool, self.run_id, answer, round((time.monotonic() - started) * 1000, 3))
            if result is None:
                self._run.end(
                    ProtocolError("protocol error: the worker sent a malformed response; the sandbox was killed")
                )
                assert self._run.dead is not None
                raise self._run.dead
            if tool not in records.UNAUDITED:
                self._run.calls += 1
            records.audit_call(self.audit, self.run_id, params, result, call_id=answer.get("id"))
            return result

    def update_network(self, network: Any, *, requested_by: str | None = None) -> NetworkChange:
        """Replace the running sandbox's network policy at once: ``network`` is a policy's ``network:`` section (a
        mapping such as ``{"mode": "proxy", "allow": [{"host": "pypi.org"}]}``, ``{"mode": "none"}``, or a
        NetworkPolicy). The change is checked as a policy at start is, and against the egress floor
        (PolicyError, when asked); once this returns, the egress proxy decides with it, the connections it no
        longer allows are cut, and the audit log has a ``network.changed`` record with ``requested_by`` (default:
        ``library:<user>``) and both policies' digests. Only a sandbox started with ``network.mode: proxy`` (an
        empty allow list refuses everything) can change (UsageError otherwise): no route is added to a running
        sandbox. ``{"mode": "none"}`` keeps the proxy and refuses everything."""
        from toolcage import options
        from toolcage.results import NetworkChange

        started = time.monotonic()
        with self._lock:
            if not self._running or self._closed:
                raise UsageError("the sandbox is not running: use it as a context manager or call start()")
            if self._run.dead is not None:
                raise self._run.dead
            session = self._run.session
        backend = self._run.backend
        update, check = getattr(backend, "update_network", None), getattr(backend, "check_network_changeable", None)
        if update is None or check is None:
            raise UsageError(f"a sandbox of kind {self.kind!r} has no egress proxy: its network cannot change")
        check()
        with self._network_lock:
            old = self.policy
            new = options.network_policy(old, network)
            answer = update(new)
            # in force at the proxy from here: recorded now, whatever the worker (below) does with its copy
            self.policy, self.options = new, dataclasses.replace(self.options, policy=new)
            change = NetworkChange(
                self.run_id, old.sha256(), new.sha256(), int(answer["cut"]), bool(answer["audit_only"]),
                round((time.monotonic() - started) * 1000, 3), requested_by or options.requester("library"),
            )  # fmt: skip
            records.network_changed(self.audit, change, old, new)
            self.log.info("network.changed", **change.to_dict())
            assert session is not None
            until = time.monotonic() + self.policy.timeouts.call_s
            told = session.request(contract.NETWORK, {"policy": json.loads(new.canonical_json())}, until)
            if isinstance(told, Ended):
                raise self._run.explain_end(told)
        return change

    @property
    def max_out_bytes(self) -> int:
        """File content that can leave this sandbox (a download's, a snapshot's default ``max_bytes``): what
        its policy lets its scratch and workspace copy hold, not a fixed cap (toolcage.files.download.out_bound)."""
        from toolcage.files import download as transfer

        return transfer.out_bound(self.policy.limits) + sum(size for _, size in self.options.writable)

    def download(
        self,
        remote_path: str,
        local_dir: str | os.PathLike[str],
        *,
        max_bytes: int | None = None,
        max_files: int | None = None,
    ) -> DownloadResult:
        """Copy a file or directory out of /scratch or /workspace into ``local_dir`` (made if missing),
        streamed in bounded chunks and checked as hostile: nothing is written outside ``local_dir``,
        and nothing under its final name unless the whole download succeeded (toolcage.files.download)."""
        from toolcage.files import download as transfer

        return transfer.download(
            lambda params: self.call("download", params),
            remote_path,
            local_dir,
            max_bytes=self.max_out_bytes if max_bytes is None else max_bytes,
            max_files=transfer.DEFAULT_MAX_FILES if max_files is None else max_files,
        )

    def upload(self, local_path: str | os.PathLike[str], remote_dir: str) -> UploadResult:
        """Copy a local file or directory into ``remote_dir`` under /scratch (made if missing), streamed
        in bounded chunks; the worker refuses what would land outside it and keeps nothing unless the
        whole upload succeeded (toolcage.files.upload)."""
        from toolcage.files import upload

        return upload.upload(lambda params: self.call("upload", params), local_path, remote_dir)

    def write_files(self, files: Mapping[str, bytes | str], *, mode: int = 0o644) -> UploadResult:
        """Write many files in one upload: ``{path: content}`` (text as UTF-8), paths under /scratch (relative
        ones land there) or a writable /workspace; parents are made (toolcage.files.batch)."""
        from toolcage.files import batch

        return batch.write_files(self.call, files, mode)

    def read_files(self, paths: Iterable[str], *, missing_ok: bool = False) -> dict[str, bytes]:
        """Read many files in one download: ``{path: bytes}`` by the paths as given (toolcage.files.batch)."""
        from toolcage.files import batch

        return batch.read_files(self.call, paths, missing_ok=missing_ok)

    def changes(
        self,
        *,
        path: str | None = None,
        download_to: str | os.PathLike[str] | None = None,
        max_bytes: int | None = None,
    ) -> Changes:
        """What the run changed in its writable workspace copy, against the host's workspace: ``added``,
        ``changed`` and ``removed`` paths and a ``diff`` that ``git apply`` takes in that directory (binary
        files included); ``download_to``: also write the added and changed files there (toolcage.files.changes).
        ``path``: a writable path of the image (writable=) instead, against the image's tree there: the diff
        applies in that directory of the image (``git apply`` in /testbed)."""
        from toolcage.files import changes

        if path is not None:
            if self._originals is None:
                raise changes.ChangesUsage(f"{path} is not writable in this run: start it with writable=({path!r},)")
            cap = dict(self.options.writable).get(path.rstrip("/") or "/", 0)
            return self._originals.changes(
                self.call, path, download_to=download_to, max_bytes=2 * cap if max_bytes is None else max_bytes
            )

        if not self.options.workspace_copy:
            raise changes.ChangesUsage(
                "this run's workspace is read-only, so nothing in it changed: start it with workspace_mode='copy'"
            )
        bound = 2 * self.policy.limits.workspace_copy  # the old side and the new: each at most the copy's size
        return changes.collect(
            self.call, self.workspace, gitignore=self.options.workspace_gitignore, prior=self._prior_changes,
            download_to=download_to, max_bytes=bound if max_bytes is None else max_bytes,
        )  # fmt: skip

    def snapshot(self, target: str | os.PathLike[str] | IO[bytes]) -> SnapshotInfo:
        """Write what the session holds (/scratch, and the workspace copy) to ``target``, a path or a binary
        stream, as a tar with a manifest, each file's sha256 and an HMAC under this host's key; resume it with
        ``Sandbox(resume=target)``, always in a fresh sandbox (toolcage.files.snapshot)."""
        from toolcage import __version__
        from toolcage.files import snapshot

        prior = sorted(set(self._prior_changes))
        if self.options.workspace_copy and self.workspace is not None:
            from toolcage.files.changes import touched_paths

            prior = touched_paths(self.call, gitignore=self.options.workspace_gitignore, prior=self._prior_changes)
        meta = {
            "toolcage": __version__,
            "run_id": self.run_id,
            "policy": self.policy.name,
            "workspace_from": str(self.workspace) if self.workspace is not None else None,
            "workspace_gitignore": self.options.workspace_gitignore,
            "changed": prior,
        }
        secret_values = list(self._secrets.wire().values()) if self._secrets else []
        return snapshot.write(
            self.call, target, workspace=self.options.workspace_copy, meta=meta,
            secret_values=secret_values, key=self._snapshot_key, max_bytes=self.max_out_bytes,
        )  # fmt: skip

    # background processes -------------------------------------------------------------
    def spawn(self, command: str | None = None, **options: Unpack[SpawnOptions]) -> Process:
        """Start a program in the background and return its handle at once (:class:`toolcage.processes.Process`):
        a shell ``command`` or an ``argv``, on pipes (stdout and stderr kept together, stdin open for
        ``write`` unless ``stdin=False``) or on a terminal (``pty=True``, or ``(rows, cols)``; default 24x80).
        It lives across calls until ``kill()`` or the sandbox's end, never longer."""
        from toolcage.processes import spawn

        return spawn(self, command, **options)

    def process(self, proc_id: int) -> Process:
        """A handle on a background process started earlier (by any client of this sandbox), by its id."""
        from toolcage.processes import Process

        return Process(self, proc_id)

    def processes(self) -> list[dict[str, Any]]:
        """Every background process the sandbox keeps: id, command or argv, pty, state, exit_code, signal,
        started_at, ended_at, output_bytes, stdin_open."""
        from toolcage.processes import listing

        return listing(self)

    # exposed ports -------------------------------------------------------------------
    def expose(self, port: int, host_port: int = 0) -> ExposedPort:
        """Reach the sandbox's TCP ``port`` from the host: a listener on 127.0.0.1:``host_port`` (0: a free
        one) relaying each connection into the sandbox (HTTP, WebSocket, any TCP), the sandbox keeping only
        ``lo`` and its policy's network. The same port again returns the same ExposedPort. Closed with the
        sandbox (toolcage.lifecycle.ports). UsageError for a bad port or a sandbox not running; SandboxError
        for a sandbox without an engine that can exec (``sandbox="none"``)."""
        from toolcage.lifecycle.ports import Ports, check_port, max_connections

        check_port(port)
        with self._lock:
            if self._ports is None:
                cap = max_connections(self.policy.limits.pids)
                self._ports = Ports(self._port_target, max_connections=cap, log=self.log)
            ports = self._ports
        return ports.expose(port, host_port)

    def exposed(self) -> dict[int, ExposedPort]:
        """The ports exposed now: sandbox port -> ExposedPort."""
        return self._ports.exposed() if self._ports is not None else {}

    def unexpose(self, port: int) -> None:
        """Stop listening for ``port`` (its relayed connections end with either side, or the sandbox)."""
        from toolcage.lifecycle.ports import check_port

        check_port(port)
        if self._ports is not None:
            self._ports.unexpose(port)

    def _expose_started(self) -> None:
        for port in self._expose_at_start:
            self.expose(port)

    def _port_target(self) -> tuple[EngineAPI, str, bool]:
        """Where an exposed port's relays run: the engine, the container, and whether it is a user's own image."""
        if not self._running or self._closed or self._run.dead is not None:
            raise UsageError("the sandbox is not running: start it before exposing a port")
        backend = self._run.backend
        cid = backend.container_id
        engine = getattr(backend, "engine", None)
        if cid is None or engine is None or not in_container(self.kind):
            raise SandboxError(
                f"a sandbox of kind {self.kind!r} runs in no container the engine can exec in: no port can be exposed"
            )
        return engine, cid, getattr(backend, "_foreign_config", None) is not None

    def usage(self) -> dict[str, Any]:
        """CPU time and peak memory of the whole sandbox so far (from its cgroup)."""
        res = self.call(contract.USAGE, timeout=5)
        self._usage = res.result if isinstance(res.result, dict) else {}
        return self._usage

    @property
    def run(self) -> Run:
        """(Internal: for toolcage.servers.serve's Forwarder.) The run's home: its session, deadline and
        records (a pooled sandbox's is its slot's from ``start()`` on)."""
        return self._run

    # teardown -------------------------------------------------------------------------
    def close(self) -> RunSummary | None:
        """End the run: gather usage, remove the sandbox (unless keep), free everything. Idempotent."""
        if self._closed:
            return self.summary
        run = self._run
        if self._running and run.dead is None and not run.input_closed:
            try:
                self.usage()
            except ToolcageError:
                pass
            except BaseException:
                self.interrupt()  # interrupted while asking: never wait on the worker again
        self._closed = True
        if self._ports is not None:  # every listener and relayed connection, before the container goes
            self._ports.close()
        if run.watchdog is not None:
            run.watchdog.stop()
        status = run.dead.status if run.dead is not None else "ok"
        try:
            if run.session is not None:
                run.session.close_input()
            if self.keep or not self.remove_in_background:
                telemetry.removal(run.run_id, functools.partial(run.backend.remove, self.keep))()
            else:  # off the caller's path; finished at exit, and by the reaper if the process dies first
                removal.schedule(telemetry.removal(run.run_id, functools.partial(run.backend.remove, False)))
        finally:
            if run.session is not None:
                run.session.close()
            if self._originals is not None:
                self._originals.close()
            if self._resume is not None:  # a start that failed before its fill: the spooled snapshot goes too
                self._resume.close()
            self.summary = run.finish(status, run.calls, self._usage)
        return self.summary
