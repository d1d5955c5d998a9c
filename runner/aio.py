"""``AsyncSandbox`` and ``AsyncPool``: the async twins of :class:`~toolcage.sandbox.Sandbox` and
:class:`~toolcage.pool.Pool`. Calls, and taking a pool's slot, are native (the thread that has the
answer or the slot wakes the event loop); what waits on the engine (a cold start, close) runs on a thread.

The twins share one run through a named contract, never each other's privates: ``Sandbox.claim_start``,
``adopt``, ``begin_call`` and ``end_call``; ``Pool.take_later``, ``forget``, ``give_back``,
``wanted_ready``, ``ready_for`` and ``watch`` (internal methods, documented as such where they are
defined). ``tests/unit/test_aio_contract.py`` checks that this module reaches no other object's
``_private`` attribute."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import os
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import IO, TYPE_CHECKING, Any, TypeVar, Unpack

from toolcage.errors import ToolcageError, UsageError
from toolcage.interpreter import AsyncCodeInterpreter
from toolcage.pool import READY_WAIT_S, Pool, Slot
from toolcage.results import CallResult, NetworkChange, RunSummary
from toolcage.rpc.session import Ended, OnProgress
from toolcage.sandbox import Sandbox

if TYPE_CHECKING:
    from toolcage.files.changes import Changes
    from toolcage.files.download import DownloadResult
    from toolcage.files.snapshot import SnapshotInfo
    from toolcage.files.upload import UploadResult
    from toolcage.lifecycle.ports import ExposedPort
    from toolcage.processes import AsyncProcess, SpawnOptions

T = TypeVar("T")


async def take(pool: Pool, timeout: float = READY_WAIT_S * 2) -> Slot:
    """:meth:`Pool.take` for an event loop: the oldest waiting slot, or the next one to start. No thread
    waits: the pool hands the slot over from whichever thread has it (a filler, mostly) by waking the
    loop. A taker cancelled or timed out while its slot was on the way gives it back, first in line."""
    loop = asyncio.get_running_loop()
    got: asyncio.Future[Slot] = loop.create_future()

    def settle(item: Slot | ToolcageError) -> None:  # in the loop
        if got.done():  # the taker gave up while the slot was on its way
            if isinstance(item, Slot):
                pool.give_back(item)
        elif isinstance(item, Slot):
            got.set_result(item)
        else:
            got.set_exception(item)

    def handoff(item: Slot | ToolcageError) -> bool:  # under the pool's lock, from any thread
        try:
            loop.call_soon_threadsafe(settle, item)
        except RuntimeError:  # the loop is closed: nobody takes it
            return False
        return True

    def expire() -> None:
        if pool.forget(handoff) and not got.done():
            got.set_exception(ToolcageError("no pooled sandbox became ready in time"))

    timer = loop.call_later(timeout, expire)
    pool.take_later(handoff)
    try:
        return await got
    except asyncio.CancelledError:
        if not pool.forget(handoff) and got.done() and not got.cancelled() and got.exception() is None:
            pool.give_back(got.result())  # handed over, but the task was cancelled before it resumed
        raise
    finally:
        timer.cancel()


async def _on_thread(executor: ThreadPoolExecutor | None, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on ``executor`` (None: the loop's default one), with the caller's context (as ``to_thread``)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(executor, call)


class AsyncSandbox(AsyncCodeInterpreter):
    """The async twin of :class:`Sandbox`: the same run; calls awaited natively, a cold start and close on a thread.

    ``pool``: a :class:`Pool` or an :class:`AsyncPool`; ``start()`` then takes a slot without a
    thread (and adopts it in the loop: one request sent, its answer read with the first call's);
    from an AsyncPool, within its ``max_concurrent_starts``, and close runs on the pool's own threads."""

    def __init__(self, *args: Any, pool: Pool | AsyncPool | None = None, **kwargs: Any) -> None:
        self._apool = pool if isinstance(pool, AsyncPool) else None
        self._pool = pool.pool if isinstance(pool, AsyncPool) else pool
        self._sync = Sandbox(*args, pool=self._pool, **kwargs)

    @property
    def run_id(self) -> str:
        return self._sync.run_id

    @property
    def name(self) -> str:
        return self._sync.name

    @property
    def container_id(self) -> str | None:
        return self._sync.container_id

    @property
    def summary(self) -> RunSummary | None:
        """Wall time, CPU time and peak memory of the run, once it is closed (as on Sandbox)."""
        return self._sync.summary

    async def __aenter__(self) -> AsyncSandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def _executor(self) -> ThreadPoolExecutor | None:
        return self._apool._threads() if self._apool is not None else None

    async def start(self) -> AsyncSandbox:
        sb, pool = self._sync, self._pool
        if pool is None:  # a cold start waits on the engine
            await _on_thread(None, sb.start)
            return self
        async with self._apool._start_slot() if self._apool is not None else contextlib.nullcontext():
            sb.claim_start()
            slot = await take(pool)
            if sb.tool_sources or sb.fills_at_start:  # adoption waits for the connectors' tools, or the fill
                await _on_thread(self._executor, sb.adopt, slot)
            else:
                sb.adopt(slot)  # sends the run's configuration; its answer is read with the first call's
        return self

    async def call(
        self,
        tool: str,
        params: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        on_progress: OnProgress | None = None,
    ) -> CallResult:
        """As :meth:`Sandbox.call`, natively: no thread waits for the answer, so many calls can be in
        flight on one sandbox at once (``asyncio.gather``); the worker runs up to the policy's
        ``limits.concurrency`` of those that run code side by side. Cancelling the awaiting task
        (``task.cancel()``, ``asyncio.wait_for``) cancels the call in the sandbox: its processes are
        killed and the sandbox stays usable. ``on_progress`` runs on the reader thread, not in the loop."""
        sb = self._sync
        session, params, until = sb.begin_call(tool, params, timeout)
        started = time.monotonic()
        answer = await session.request_async(tool, params, until, on_progress=on_progress)
        if isinstance(answer, Ended):  # the sandbox is killed on the way: not in the event loop
            return await _on_thread(self._executor, sb.end_call, tool, params, answer, started)
        return sb.end_call(tool, params, answer, started)

    async def download(
        self,
        remote_path: str,
        local_dir: str | os.PathLike[str],
        *,
        max_bytes: int | None = None,
        max_files: int | None = None,
    ) -> DownloadResult:
        """As :meth:`Sandbox.download`, on a thread (it writes files as the chunks come)."""
        return await _on_thread(
            self._executor,
            functools.partial(self._sync.download, max_bytes=max_bytes, max_files=max_files),
            remote_path,
            local_dir,
        )

    async def upload(self, local_path: str | os.PathLike[str], remote_dir: str) -> UploadResult:
        """As :meth:`Sandbox.upload`, on a thread (it reads files as the chunks go)."""
        return await _on_thread(self._executor, self._sync.upload, local_path, remote_dir)

    async def write_files(self, files: Mapping[str, bytes | str], *, mode: int = 0o644) -> UploadResult:
        """As :meth:`Sandbox.write_files`, on a thread."""
        return await _on_thread(self._executor, functools.partial(self._sync.write_files, files, mode=mode))

    async def read_files(self, paths: Iterable[str], *, missing_ok: bool = False) -> dict[str, bytes]:
        """As :meth:`Sandbox.read_files`, on a thread."""
        return await _on_thread(self._executor, functools.partial(self._sync.read_files, paths, missing_ok=missing_ok))

    async def changes(
        self,
        *,
        path: str | None = None,
        download_to: str | os.PathLike[str] | None = None,
        max_bytes: int | None = None,
    ) -> Changes:
        """As :meth:`Sandbox.changes`, on a thread (``path``: a writable path of the image, writable=)."""
        return await _on_thread(
            self._executor,
            functools.partial(self._sync.changes, path=path, download_to=download_to, max_bytes=max_bytes),
        )

    async def snapshot(self, target: str | os.PathLike[str] | IO[bytes]) -> SnapshotInfo:
        """As :meth:`Sandbox.snapshot`, on a thread (it writes the archive as the chunks come)."""
        return await _on_thread(self._executor, self._sync.snapshot, target)

    async def update_network(self, network: Any, *, requested_by: str | None = None) -> NetworkChange:
        """As :meth:`Sandbox.update_network`, on a thread (it waits for the proxy's confirmation)."""
        return await _on_thread(
            self._executor, functools.partial(self._sync.update_network, network, requested_by=requested_by)
        )

    async def spawn(self, command: str | None = None, **options: Unpack[SpawnOptions]) -> AsyncProcess:
        """As :meth:`Sandbox.spawn`: the handle's methods are awaited (:class:`toolcage.processes.AsyncProcess`)."""
        from toolcage.processes import spawn_async

        return await spawn_async(self, command, **options)

    def process(self, proc_id: int) -> AsyncProcess:
        from toolcage.processes import AsyncProcess

        return AsyncProcess(self, proc_id)

    async def processes(self) -> list[dict[str, Any]]:
        from toolcage.processes import listing_async

        return await listing_async(self)

    def expose(self, port: int, host_port: int = 0) -> ExposedPort:
        """As :meth:`Sandbox.expose` (it only binds a listener: no thread needed)."""
        return self._sync.expose(port, host_port)

    def exposed(self) -> dict[int, ExposedPort]:
        return self._sync.exposed()

    def unexpose(self, port: int) -> None:
        self._sync.unexpose(port)

    async def usage(self) -> dict[str, Any]:
        """As :meth:`Sandbox.usage`, on a thread."""
        return await _on_thread(self._executor, self._sync.usage)

    async def close(self) -> RunSummary | None:
        return await _on_thread(self._executor, self._sync.close)


class AsyncPool:
    """The async twin of :class:`Pool`: the same warm slots; ``async with pool.sandbox() as sb:`` takes one
    without a thread waiting, and ``await pool.wait_ready()`` leaves the loop free.

    ``max_concurrent_starts``: at most this many of its sandboxes start at once (wait for a slot, adopt
    it); the rest wait their turn in the loop, holding no thread. None (default): no bound. It also
    sizes the pool's own threads, for what must block (a close, an adoption that lists connector
    tools), so runs never queue behind asyncio's default executor (default: as many as that one's,
    ``min(32, cpus + 4)``). The other arguments are :class:`Pool`'s; ``.pool`` is the Pool itself,
    which sync code may share (``Sandbox(pool=apool.pool)``)."""

    def __init__(
        self, policy: Any = "default", *, max_concurrent_starts: int | None = None, **pool_options: Any
    ) -> None:
        if max_concurrent_starts is not None and (
            isinstance(max_concurrent_starts, bool) or not isinstance(max_concurrent_starts, int)
            or max_concurrent_starts < 1
        ):  # fmt: skip
            raise UsageError("max_concurrent_starts must be a positive integer (or None: no bound)")
        self.max_concurrent_starts = max_concurrent_starts
        self.pool = Pool(policy, **pool_options)
        self._executor = ThreadPoolExecutor(
            max_workers=max_concurrent_starts or min(32, (os.cpu_count() or 1) + 4),
            thread_name_prefix=f"toolcage-pool-{self.pool.id}",
        )
        # one bound per event loop (an asyncio.Semaphore belongs to the loop that first waits on it)
        self._bounds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self.starting = 0  # starts under way now (within the bound)
        self._closed = False

    @property
    def id(self) -> str:
        return self.pool.id

    @property
    def size(self) -> int:
        return self.pool.size

    @property
    def adopted(self) -> int:
        """Runs served."""
        return self.pool.adopted

    def sandbox(
        self,
        *,
        secrets: Mapping[str, str] | None = None,
        image: str | None = None,
        resume: str | os.PathLike[str] | IO[bytes] | None = None,
        snapshot_key: bytes | None = None,
    ) -> AsyncSandbox:
        """An AsyncSandbox that adopts one slot when started (``async with pool.sandbox() as sb:``);
        ``image``, ``resume``: as :meth:`Pool.sandbox`."""
        sb = AsyncSandbox(pool=self.pool.for_image(image), secrets=secrets, resume=resume, snapshot_key=snapshot_key)
        sb._apool = self  # within this pool's max_concurrent_starts, closed on its threads
        return sb

    def warm(self, image: str | None = None, count: int = 1) -> None:
        """Start ``count`` slots of ``image`` ahead (as :meth:`Pool.warm`; never blocks)."""
        self.pool.warm(image, count)

    def ready(self, image: str | None = None) -> int:
        """How many slots wait, started and answering (of ``image``: default the pool's own)."""
        return self.pool.ready(image)

    async def wait_ready(self, count: int | None = None, timeout: float = 60.0, image: str | None = None) -> bool:
        """Until ``count`` (default: ``size``) slots wait; False on timeout (as :meth:`Pool.wait_ready`,
        without blocking the loop or holding a thread). Raises what stops slots from starting."""
        pool, loop = self.pool.for_image(image), asyncio.get_running_loop()
        changed = asyncio.Event()

        def watcher() -> None:  # under the pool's lock, from any thread
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(changed.set)

        want = pool.wanted_ready(count)
        until = loop.time() + timeout
        pool.watch(watcher)
        try:
            while True:
                changed.clear()
                done = pool.ready_for(want)
                if done is not None:
                    return done
                left = until - loop.time()
                if left <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(left, 0.5))
        finally:
            pool.watch(watcher, on=False)

    @contextlib.asynccontextmanager
    async def _start_slot(self) -> AsyncIterator[None]:
        """One start's turn, within ``max_concurrent_starts``."""
        bound = None
        if self.max_concurrent_starts is not None:
            loop = asyncio.get_running_loop()
            bound = self._bounds.get(loop)
            if bound is None:
                bound = self._bounds[loop] = asyncio.Semaphore(self.max_concurrent_starts)
        async with bound if bound is not None else contextlib.nullcontext():
            self.starting += 1
            try:
                yield
            finally:
                self.starting -= 1

    def _threads(self) -> ThreadPoolExecutor | None:
        """The pool's own threads; once it is closed, the loop's default executor (a sandbox taken
        before may close after its pool)."""
        return None if self._closed else self._executor

    async def close(self) -> None:
        """Remove every waiting slot and stop refilling (on a thread: it waits for the removals). Idempotent."""
        await _on_thread(self._threads(), self.pool.close)
        self._closed = True
        self._executor.shutdown(wait=False)

    async def __aenter__(self) -> AsyncPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = ["AsyncPool", "AsyncSandbox"]
