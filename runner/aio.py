"""``AsyncSandbox``: the async twin of :class:`~toolcage.sandbox.Sandbox` (the same run, its blocking
calls moved to a worker thread so an event loop never waits on the engine or the worker)."""

from __future__ import annotations

import asyncio
from typing import Any

from toolcage.results import CallResult, RunSummary
from toolcage.sandbox import Sandbox
from toolcage.session import Cancel, OnProgress


class AsyncSandbox:
    """The async twin of :class:`Sandbox`: the same run, its blocking calls moved to a thread."""

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
        """As :meth:`Sandbox.call`. Cancelling the awaiting task (``task.cancel()``,
        ``asyncio.wait_for``) cancels the call in the sandbox: its processes are killed and the
        sandbox stays usable. ``on_progress`` runs on the reader thread, not in the event loop."""
        cancel = Cancel()
        task = asyncio.ensure_future(
            asyncio.to_thread(self._sync.call, tool, params, timeout=timeout, on_progress=on_progress, cancel=cancel)
        )
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            cancel.cancel("cancelled by the caller")
            raise

    async def close(self) -> RunSummary | None:
        return await asyncio.to_thread(self._sync.close)
