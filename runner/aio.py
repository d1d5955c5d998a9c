"""``AsyncSandbox``: the async twin of :class:`~toolcage.sandbox.Sandbox`. Calls are native (the
sandbox's one reader thread wakes the event loop with each answer); start and close, which wait on
the engine, run on a thread so the loop never does."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from toolcage.results import CallResult, RunSummary
from toolcage.rpc.session import Ended, OnProgress
from toolcage.sandbox import Sandbox


class AsyncSandbox:
    """The async twin of :class:`Sandbox`: the same run; calls awaited natively, start and close on a thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sync = Sandbox(*args, **kwargs)

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

    async def start(self) -> AsyncSandbox:
        await asyncio.to_thread(self._sync.start)
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
        session, params, until = sb._before_call(tool, params, timeout)
        started = time.monotonic()
        answer = await session.request_async(tool, params, until, on_progress=on_progress)
        if isinstance(answer, Ended):  # the sandbox is killed on the way: not in the event loop
            return await asyncio.to_thread(sb._after_call, tool, params, answer, started)
        return sb._after_call(tool, params, answer, started)

    async def close(self) -> RunSummary | None:
        return await asyncio.to_thread(self._sync.close)
