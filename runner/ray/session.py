"""A session on one node of a :class:`~toolcage.ray.cluster.Cluster`: :class:`ClusterSandbox` and its async
twin :class:`AsyncClusterSandbox`, the session surface of ``Sandbox``/``AsyncSandbox``
(:mod:`toolcage.types`) wherever the sandbox runs.

The sandbox stays on its node; each call goes through that node's agent. The files facet (download, upload,
changes, snapshot) runs here, on the driver, over ``call``: the same door rules as for a local ``Sandbox``, the
driver's memory and CPU. A session knows its cluster by type only (the cluster makes its sessions).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import os
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Unpack

import ray

from toolcage.errors import SandboxInterrupted, UsageError
from toolcage.interpreter import AsyncCodeInterpreter, CodeInterpreter
from toolcage.ray import direct
from toolcage.ray.handle import NodeAgent, actor_lost

if TYPE_CHECKING:
    from toolcage.files.changes import Changes
    from toolcage.files.safetar import DownloadResult
    from toolcage.files.snapshot import SnapshotInfo
    from toolcage.files.upload import UploadResult
    from toolcage.processes import AsyncProcess, Process, SpawnOptions
    from toolcage.ray.cluster import Cluster
    from toolcage.results import CallResult, NetworkChange, RunSummary
    from toolcage.types import AsyncSandboxLike, SandboxLike, SnapshotTarget


_WAITERS: ThreadPoolExecutor | None = None
_WAITERS_LOCK = threading.Lock()


def _waiters() -> ThreadPoolExecutor:
    """The threads async calls on the direct channel wait on: not the loop's default executor, whose few
    threads (cores + 4) would queue a gather of more calls than that behind one another."""
    global _WAITERS
    with _WAITERS_LOCK:
        if _WAITERS is None:
            _WAITERS = ThreadPoolExecutor(max_workers=256, thread_name_prefix="toolcage-ray-call")
        return _WAITERS


class _Abort:
    """Lets an async caller break the connection its call waits on (before or after the call took it)."""

    def __init__(self) -> None:
        self.cancelled = False
        self._conn: Any = None
        self._lock = threading.Lock()

    def hold(self, conn: Any) -> bool:
        with self._lock:
            self._conn = conn
            if self.cancelled and conn is not None:
                conn.abort()
            return not self.cancelled

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            if self._conn is not None:
                self._conn.abort()


class ClusterSandbox(CodeInterpreter):
    """A session on one node of a :class:`Cluster`: the sandbox stays on that node, calls go through its agent."""

    def __init__(self, cluster: Cluster, options: dict[str, Any]) -> None:
        known = {
            "workspace", "workspace_mode", "workspace_gitignore", "resume", "secrets", "node", "wait_s", "tool",
            "image",
        }  # fmt: skip
        bad = set(options) - known
        if bad:
            raise UsageError(f"cluster.sandbox() does not take {', '.join(sorted(bad))}")
        self.cluster = cluster
        self.options = dict(options)
        self._agent: NodeAgent | None = None
        self.session: str | None = None
        self.run_id: str | None = None
        self.name: str | None = None
        self.summary: RunSummary | None = None
        self._prior: list[str] = []  # what a resumed snapshot had changed (toolcage.files.changes)

    @property
    def node(self) -> str | None:
        return self._agent.node_id if self._agent is not None else None

    @property
    def workspace_copy(self) -> bool:
        return (self.options.get("workspace_mode") or "ro") == "copy"

    def _open_args(self, resumed: Any) -> dict[str, Any]:
        opts = {k: v for k, v in self.options.items() if k not in {"node", "wait_s", "resume", "image"}}
        if opts.get("workspace") is not None:
            opts["workspace"] = str(opts["workspace"])
        if resumed is not None and resumed.workspace:  # an empty copy, filled here from the verified snapshot
            opts["workspace"] = None
            opts["workspace_mode"] = "copy"
        if opts.get("secrets"):
            opts["secrets"] = dict(opts["secrets"])
        return opts

    def start(self) -> ClusterSandbox:
        """Open the session on a node. A ``resume`` is verified here, with this driver's key, before any node
        is asked (SnapshotInvalid otherwise), then sent through the session's relay in bounded chunks."""
        from toolcage.files import snapshot

        c = self.cluster
        c._check_open()
        resume = self.options.get("resume")
        resumed = None
        if resume is not None:
            source = io.BytesIO(resume) if isinstance(resume, bytes | bytearray) else resume
            resumed = snapshot.verify(source, c.snapshot_key)
            if resumed.workspace:
                self.options["workspace_mode"] = "copy"
        try:
            # a run's own image: by content id, resolved here (the node runs what this driver named)
            image = c.resolve_image(self.options["image"]) if self.options.get("image") is not None else None
            args = (c._job_hex(), {**self._open_args(resumed), **({"image": image[1]} if image else {})})
            agent, outcome = c._admitted("open", args, self.options.get("wait_s"), self.options.get("node"), image)
            info = c._settle(agent, outcome)
            self._agent, self.session, self.run_id, self.name = agent, info["session"], info["run_id"], info["name"]
            if resumed is not None:
                self._fill(resumed)
        except BaseException:
            if resumed is not None:
                resumed.close()
            if self.session is not None:
                with contextlib.suppress(Exception):
                    self.close()
            raise
        return self

    def _fill(self, resumed: Any) -> None:
        from toolcage.files import upload
        from toolcage.policies import contract

        def put(params: dict[str, Any]) -> CallResult:
            return self.call("upload", params)

        try:
            if resumed.workspace:
                upload.send(put, resumed.tar_of("workspace"), contract.WORKSPACE, base=True)
            upload.send(put, resumed.tar_of("scratch"), contract.SCRATCH)
        finally:
            resumed.close()
        self._prior = list(resumed.changed)

    def _ref(self, method: str, *args: Any) -> Any:
        if self._agent is None or self.session is None:
            raise UsageError("the cluster sandbox is not started (use it in a with block, or call start())")
        return getattr(self._agent.handle, method).remote(self.session, *args)

    def _get(self, ref: Any) -> Any:
        assert self._agent is not None
        try:
            outcome = ray.get(ref)
        except Exception as exc:
            if actor_lost(exc):
                raise self.cluster._lost(self._agent, exc) from None
            raise
        return self.cluster._settle(self._agent, outcome)

    def _invoke(self, method: str, *args: Any, abort: _Abort | None = None) -> Any:
        """``method(session, *args)`` on the agent: on its direct channel when it has one, else through Ray."""
        if self._agent is None or self.session is None:
            raise UsageError("the cluster sandbox is not started (use it in a with block, or call start())")
        agent = self._agent
        try:
            outcome = self.cluster._ask(agent, method, (self.session, *args), abort.hold if abort else None)
        except direct.ChannelError as exc:
            if abort is not None and abort.cancelled:  # our own abort: the agent cancels the call, the node lives
                raise SandboxInterrupted("the call was cancelled", node=agent.node_id) from None
            raise self.cluster._broken(agent, exc) from None
        except Exception as exc:
            if actor_lost(exc):
                raise self.cluster._lost(agent, exc) from None
            raise
        return self.cluster._settle(agent, outcome)

    def call(self, tool: str, params: dict[str, Any] | None = None, *, timeout: float | None = None) -> CallResult:
        result: CallResult = self._invoke("call", tool, params, timeout)
        return result

    def write_files(self, files: Mapping[str, bytes | str], *, mode: int = 0o644) -> UploadResult:
        result: UploadResult = self._get(self._ref("write_files", dict(files), mode))
        return result

    def read_files(self, paths: Iterable[str], *, missing_ok: bool = False) -> dict[str, bytes]:
        result: dict[str, bytes] = self._get(self._ref("read_files", list(paths), missing_ok))
        return result

    def update_network(self, network: Any, *, requested_by: str | None = None) -> NetworkChange:
        """As :meth:`toolcage.Sandbox.update_network`, on the node (its agent changes its run's egress proxy);
        ``requested_by`` defaults to ``cluster:<user>`` of this driver."""
        result: NetworkChange = self._get(self._ref("update_network", *_network_args(network, requested_by)))
        return result

    # the files facet: run here, on the driver, through ``call`` (the agent relays one bounded chunk of the
    # worker's at a time and holds nothing whole), so its memory and CPU are the caller's, and the door rules
    # (toolcage.files.download, safetar, changes, snapshot) apply here as they do for a local Sandbox
    def download(
        self, remote_path: str, local_dir: str | os.PathLike[str], *, max_bytes: int | None = None,
        max_files: int | None = None,
    ) -> DownloadResult:  # fmt: skip
        """``Sandbox.download`` of the session, wherever it runs, streamed into ``local_dir`` here."""
        from toolcage.files import download as transfer

        return transfer.download(
            lambda params: self.call("download", params), remote_path, local_dir,
            max_bytes=transfer.out_bound(self.cluster.policy.limits) if max_bytes is None else max_bytes,
            max_files=transfer.DEFAULT_MAX_FILES if max_files is None else max_files,
        )  # fmt: skip

    def upload(self, local_path: str | os.PathLike[str], remote_dir: str) -> UploadResult:
        """``Sandbox.upload`` of a file or directory here into ``remote_dir`` of the session, wherever it runs."""
        from toolcage.files import upload

        return upload.upload(lambda params: self.call("upload", params), local_path, remote_dir)

    def changes(self, *, download_to: str | os.PathLike[str] | None = None, max_bytes: int | None = None) -> Changes:
        """``Sandbox.changes``: the diff is made here, against ``workspace`` as this driver sees it."""
        from pathlib import Path

        from toolcage.files import changes

        if not self.workspace_copy:
            raise changes.ChangesUsage(
                "this run's workspace is read-only, so nothing in it changed: start it with workspace_mode='copy'"
            )
        ws = self.options.get("workspace")
        bound = 2 * self.cluster.policy.limits.workspace_copy  # the old side and the new
        return changes.collect(
            self.call, Path(ws).resolve() if ws is not None else None,
            gitignore=bool(self.options.get("workspace_gitignore")), prior=self._prior, download_to=download_to,
            max_bytes=bound if max_bytes is None else max_bytes,
        )  # fmt: skip

    def snapshot(self, target: SnapshotTarget) -> SnapshotInfo:
        """``Sandbox.snapshot``, written here (a path or a binary stream) and signed with this driver's key
        (``Cluster(snapshot_key=)``, else this host's); resume it with ``cluster.sandbox(resume=...)`` of a
        driver with the same key."""
        from toolcage import __version__, connectors
        from toolcage.files import download as transfer
        from toolcage.files import snapshot
        from toolcage.files.changes import touched_paths

        prior = sorted(set(self._prior))
        ws = self.options.get("workspace")
        if self.workspace_copy:
            gitignore = bool(self.options.get("workspace_gitignore"))
            prior = touched_paths(self.call, gitignore=gitignore, prior=self._prior)
        meta = {
            "toolcage": __version__, "run_id": self.run_id, "policy": self.cluster.policy.name,
            "workspace_from": str(ws) if ws is not None else None,
            "workspace_gitignore": bool(self.options.get("workspace_gitignore")), "changed": prior,
        }  # fmt: skip
        store = connectors.secret_store(self.cluster.policy, self.options.get("secrets"))
        return snapshot.write(
            self.call, target, workspace=self.workspace_copy, meta=meta,
            secret_values=list(store.wire().values()) if store else [], key=self.cluster.snapshot_key,
            max_bytes=transfer.out_bound(self.cluster.policy.limits),
        )  # fmt: skip

    def spawn(self, command: str | None = None, **options: Unpack[SpawnOptions]) -> Process:
        """As :meth:`toolcage.Sandbox.spawn`: a background process on this session's node (over ``call``)."""
        from toolcage.processes import spawn

        return spawn(self, command, **options)

    def process(self, proc_id: int) -> Process:
        from toolcage.processes import Process

        return Process(self, proc_id)

    def processes(self) -> list[dict[str, Any]]:
        from toolcage.processes import listing

        return listing(self)

    def usage(self) -> dict[str, Any]:
        """``Sandbox.usage``: CPU time and peak memory of the whole sandbox so far (from its cgroup, on its node)."""
        from toolcage.policies import contract

        res = self.call(contract.USAGE, timeout=5)
        return res.result if isinstance(res.result, dict) else {}

    def close(self) -> RunSummary | None:
        """End the session: its node's agent closes the sandbox and answers its summary. Idempotent."""
        if self._agent is None or self.session is None:
            return self.summary
        ref = self._ref("close")
        self.session = None
        self.summary = self._get(ref)
        return self.summary

    def __enter__(self) -> ClusterSandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self._agent is not None and self._agent.lost:
            return  # nothing to close: the node's reaper removes what is left
        self.close()


class AsyncClusterSandbox(AsyncCodeInterpreter):
    """:class:`ClusterSandbox` for an event loop: the same session; Ray's answers are awaited, not waited for."""

    def __init__(self, sync: ClusterSandbox) -> None:
        self._sync = sync

    @property
    def node(self) -> str | None:
        return self._sync.node

    @property
    def run_id(self) -> str | None:
        return self._sync.run_id

    @property
    def summary(self) -> RunSummary | None:
        """As :attr:`ClusterSandbox.summary`: the run's summary once it is closed."""
        return self._sync.summary

    async def start(self) -> AsyncClusterSandbox:
        await asyncio.to_thread(self._sync.start)
        return self

    async def _await(self, ref: Any) -> Any:
        s = self._sync
        assert s._agent is not None
        try:
            outcome = await ref
        except Exception as exc:
            if actor_lost(exc):
                raise s.cluster._lost(s._agent, exc) from None
            raise
        return s.cluster._settle(s._agent, outcome)

    async def call(
        self, tool: str, params: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> CallResult:
        s = self._sync
        if s._agent is None or s._agent.direct is None:
            result: CallResult = await self._await(s._ref("call", tool, params, timeout))
            return result
        # on the direct channel, waited for on a thread; a cancel closes the call's connection, and the agent
        # cancels the call in the sandbox as a local AsyncSandbox's cancel does (a Ray call would run on)
        abort = _Abort()
        call = functools.partial(s._invoke, "call", tool, params, timeout, abort=abort)
        job = asyncio.get_running_loop().run_in_executor(_waiters(), call)
        try:
            result = await asyncio.shield(job)
        except asyncio.CancelledError:
            abort.cancel()
            with contextlib.suppress(BaseException):
                await job
            raise
        return result

    async def write_files(self, files: Mapping[str, bytes | str], *, mode: int = 0o644) -> UploadResult:
        result: UploadResult = await self._await(self._sync._ref("write_files", dict(files), mode))
        return result

    async def update_network(self, network: Any, *, requested_by: str | None = None) -> NetworkChange:
        result: NetworkChange = await self._await(
            self._sync._ref("update_network", *_network_args(network, requested_by))
        )
        return result

    async def read_files(self, paths: Iterable[str], *, missing_ok: bool = False) -> dict[str, bytes]:
        result: dict[str, bytes] = await self._await(self._sync._ref("read_files", list(paths), missing_ok))
        return result

    async def download(
        self, remote_path: str, local_dir: str | os.PathLike[str], *, max_bytes: int | None = None,
        max_files: int | None = None,
    ) -> DownloadResult:  # fmt: skip
        return await asyncio.to_thread(self._sync.download, remote_path, local_dir, max_bytes=max_bytes,
                                       max_files=max_files)  # fmt: skip

    async def upload(self, local_path: str | os.PathLike[str], remote_dir: str) -> UploadResult:
        return await asyncio.to_thread(self._sync.upload, local_path, remote_dir)

    async def changes(
        self, *, download_to: str | os.PathLike[str] | None = None, max_bytes: int | None = None
    ) -> Changes:
        return await asyncio.to_thread(self._sync.changes, download_to=download_to, max_bytes=max_bytes)

    async def snapshot(self, target: SnapshotTarget) -> SnapshotInfo:
        return await asyncio.to_thread(self._sync.snapshot, target)

    async def spawn(self, command: str | None = None, **options: Unpack[SpawnOptions]) -> AsyncProcess:
        """As :meth:`toolcage.AsyncSandbox.spawn`, on this session's node."""
        from toolcage.processes import spawn_async

        return await spawn_async(self, command, **options)

    def process(self, proc_id: int) -> AsyncProcess:
        from toolcage.processes import AsyncProcess

        return AsyncProcess(self, proc_id)

    async def processes(self) -> list[dict[str, Any]]:
        from toolcage.processes import listing_async

        return await listing_async(self)

    async def usage(self) -> dict[str, Any]:
        """As :meth:`ClusterSandbox.usage`, awaited."""
        from toolcage.policies import contract

        res = await self.call(contract.USAGE, timeout=5)
        return res.result if isinstance(res.result, dict) else {}

    async def close(self) -> RunSummary | None:
        s = self._sync
        if s._agent is None or s.session is None:
            return s.summary
        ref = s._ref("close")
        s.session = None
        s.summary = await self._await(ref)
        return s.summary

    async def __aenter__(self) -> AsyncClusterSandbox:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        s = self._sync
        if s._agent is not None and s._agent.lost:
            return
        await self.close()


def _network_args(network: Any, requested_by: str | None) -> tuple[Any, str]:
    """A network change as it crosses to the agent: plain data (a NetworkPolicy as its mapping), and who asks."""
    from toolcage.options import requester
    from toolcage.policies import NetworkPolicy
    from toolcage.policies.typed import to_dict

    return (to_dict(network) if isinstance(network, NetworkPolicy) else network), requested_by or requester("cluster")


if TYPE_CHECKING:  # the session surface (toolcage.types): mypy names a member these lack or spell differently

    def _sandbox(sb: ClusterSandbox) -> SandboxLike:
        return sb

    def _async_sandbox(sb: AsyncClusterSandbox) -> AsyncSandboxLike:
        return sb


__all__ = ["AsyncClusterSandbox", "ClusterSandbox"]
