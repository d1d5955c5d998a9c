"""``AsyncPool`` and ``AsyncSandbox(pool=...)`` with local workers (``sandbox="none"``): taking a slot holds
no thread and leaves the loop free, and ``max_concurrent_starts`` bounds the starts under way. Before, start()
went through ``asyncio.to_thread`` (so starts queued behind the loop's default executor) and waiting blocked."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import pytest

from toolcage import AsyncPool, AsyncSandbox, Pool, ToolcageError, UsageError
from toolcage.aio import take


@asynccontextmanager
async def default_executor_blocked() -> AsyncIterator[None]:
    """The loop's default executor has one thread, and it is busy until the block ends."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(1))
    release = threading.Event()
    busy = loop.run_in_executor(None, release.wait)
    try:
        yield
    finally:
        release.set()
        await busy


@asynccontextmanager
async def ticker(period: float = 0.01) -> AsyncIterator[list[float]]:
    """A task that ticks every ``period`` seconds; yields the gaps between its ticks."""
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(tick())
    try:
        yield gaps
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def run(body: Callable[[], Awaitable[Any]], timeout: float = 60) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(body(), timeout)

    return asyncio.run(bounded())


async def ping_in_one(pool: AsyncPool | Pool) -> str:
    sb = pool.sandbox() if isinstance(pool, AsyncPool) else AsyncSandbox(pool=pool)
    async with sb:
        assert (await sb.call("ping")).result == "pong"
        return sb.run_id


def test_fifty_starts_take_no_default_executor_thread() -> None:
    """50 runs from an AsyncPool, all at once, finish while the loop's one default-executor thread is busy."""

    async def body() -> list[str]:
        async with default_executor_blocked(), AsyncPool(sandbox="none", audit=False, size=4) as pool:
            return await asyncio.gather(*(ping_in_one(pool) for _ in range(50)))

    ids = run(body)
    assert len(set(ids)) == 50  # each run its own slot


def test_async_sandbox_with_a_plain_pool_adopts_without_the_default_executor() -> None:
    """AsyncSandbox(pool=Pool(...)).start() takes and adopts its slot in the loop (it was asyncio.to_thread)."""

    async def body() -> None:
        with Pool(sandbox="none", audit=False, size=2) as pool:
            sbs = [AsyncSandbox(pool=pool) for _ in range(8)]
            async with default_executor_blocked():
                await asyncio.wait_for(asyncio.gather(*(sb.start() for sb in sbs)), 30)
                results = await asyncio.gather(*(sb.call("ping") for sb in sbs))
                assert [r.result for r in results] == ["pong"] * 8
            for sb in sbs:  # a plain Pool's sandbox closes on the default executor
                await sb.close()
            assert pool.adopted == 8

    run(body)


def test_waiting_for_slots_leaves_the_loop_free() -> None:
    """wait_ready and 20 starts waiting for slots to start: a ticker task keeps ticking every 10 ms."""

    async def body() -> list[float]:
        async with AsyncPool(sandbox="none", audit=False, size=3) as pool, ticker() as gaps:
            assert pool.ready() == 0
            assert await pool.wait_ready(timeout=30)
            assert pool.ready() == 3
            await asyncio.gather(*(ping_in_one(pool) for _ in range(20)))
            return list(gaps)

    gaps = run(body)
    assert len(gaps) > 20 and max(gaps) < 0.5, max(gaps)


def test_max_concurrent_starts_is_obeyed() -> None:
    """With max_concurrent_starts=3, no more than 3 of 20 starts wait for a slot at once (and 3 do)."""
    seen: list[tuple[int, int]] = []

    async def body() -> None:
        async with AsyncPool(sandbox="none", audit=False, size=2, max_concurrent_starts=3) as pool:
            take_later = pool.pool.take_later

            def counted(handoff: Any) -> None:
                seen.append((pool.starting, len(pool.pool._handoffs) + 1))
                take_later(handoff)

            pool.pool.take_later = counted  # type: ignore[method-assign]
            await asyncio.gather(*(ping_in_one(pool) for _ in range(20)))
            assert pool.adopted == 20 and pool.starting == 0

    run(body)
    assert len(seen) == 20
    assert max(s for s, _ in seen) == 3 and max(w for _, w in seen) <= 3


def test_max_concurrent_starts_must_be_a_positive_integer() -> None:
    """A bad bound is a clear UsageError, before any slot starts."""
    for bad in (0, -1, 1.5, True, "4"):
        with pytest.raises(UsageError, match="max_concurrent_starts must be a positive integer"):
            AsyncPool(sandbox="none", audit=False, max_concurrent_starts=bad)


def test_a_cancelled_taker_gives_its_slot_back() -> None:
    """A taker cancelled while its slot is on the way: the slot goes back first in line, not lost."""

    async def body() -> None:
        with Pool(sandbox="none", audit=False, size=1) as pool:
            assert pool.wait_ready(timeout=30)
            task = asyncio.create_task(take(pool))
            await asyncio.sleep(0)  # the task asked: its slot is handed over, the loop not yet told
            assert pool.ready() == 0
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0)
            assert pool.ready() == 1 and pool.adopted == 0 and pool._waiting == 0

    run(body)


def test_a_taker_times_out_and_a_closed_pool_refuses() -> None:
    """No slot in time: ToolcageError, and the pool no longer counts the taker; closing tells waiting takers."""

    async def body() -> None:
        with Pool(sandbox="none", audit=False, size=1, parallel=1) as pool:
            assert pool.wait_ready(timeout=30)
            first = await take(pool)
            with pytest.raises(ToolcageError, match="no pooled sandbox became ready in time"):
                await take(pool, timeout=0.001)
            assert pool._waiting == 0 and not pool._handoffs
            pool.give_back(first)
            assert pool.ready() == 1
            assert await take(pool) is first
            pool._retire(first, "closed", now=True)  # taken, never adopted: the pool no longer holds it
            waiting = asyncio.create_task(take(pool))
            await asyncio.sleep(0)
            await asyncio.to_thread(pool.close)
            with pytest.raises(UsageError, match="the pool is closed"):
                await waiting

    run(body)


def test_what_stops_slots_from_starting_reaches_async_takers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slots that cannot start (the image missing, Docker down): start() and wait_ready() raise why, at once."""

    def cannot_start(self: Pool) -> Any:
        raise ToolcageError("the image is missing")

    monkeypatch.setattr(Pool, "_make_slot", cannot_start)

    async def body() -> None:
        async with AsyncPool(sandbox="none", audit=False, size=1, parallel=1) as pool:
            with pytest.raises(ToolcageError, match="the image is missing"):
                await asyncio.wait_for(pool.sandbox().start(), 10)
            with pytest.raises(ToolcageError, match="the image is missing"):
                await asyncio.wait_for(pool.wait_ready(), 10)

    run(body)
