"""A pool over many images (issue 36, point 5): ``pool.sandbox(image=...)`` takes a slot of that image
from its sub-pool, filled on demand; warm slots across images stay within ``max_warm`` (the least
recently asked-for image's are evicted); a slot is never reused; nothing is left after close().

The images are tiny ``docker import``s made here (bench.images.burst_image: one file each, its own
content id); the worker runs in them from the runtime mounts, as in a cold run of the image.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from bench.images import burst_image
from toolcage import DEFAULT_IMAGE, UsageError
from toolcage.aio import AsyncPool
from toolcage.errors import ImageMissing
from toolcage.pool import Pool

pytestmark = [
    pytest.mark.usefixtures("no_leaks"),
    pytest.mark.runc_only(
        "the pool's bookkeeping per image, host-side; a foreign image under gVisor: test_foreign_image_attacks"
    ),
]


def eventually(check: Callable[[], bool], timeout: float = 20.0) -> bool:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if check():
            return True
        time.sleep(0.1)
    return check()


def image_of(engine: Any, container_id: str | None) -> str:
    assert container_id is not None
    info = engine.inspect(container_id)
    assert info is not None
    return str(info["Image"])


def slots(engine: Any, pool: Pool) -> list[dict[str, Any]]:
    return [c for c in engine.containers(f"toolcage.pool={pool.id}") if c["State"] == "running"]


def test_each_image_gets_its_own_slot_and_a_slot_is_never_reused(engine: Any) -> None:
    refs = [burst_image(n, engine) for n in (1, 2, 3)]
    with Pool(size=1, audit=False) as pool:
        seen: list[str] = []
        for ref in [*refs, refs[0]]:
            with pool.sandbox(image=ref) as sb:
                assert sb.call("write_file", {"path": "a.txt", "content": ref}).ok
                # the container runs that image (its content id), with the worker from the runtime mounts
                assert image_of(engine, sb.container_id) == engine.image(ref)["Id"]
                assert sb.container_id not in seen
                seen.append(sb.container_id)
        with pool.sandbox() as sb:  # the pool's own image is unchanged
            assert image_of(engine, sb.container_id) == engine.image(DEFAULT_IMAGE)["Id"]
        assert set(pool.images()) == set(refs)
        assert pool.images() == dict.fromkeys(refs, 0)  # filled on demand: nothing started ahead


def test_warm_slots_across_images_are_bounded_and_the_least_recent_evicted(engine: Any) -> None:
    refs = [burst_image(n, engine) for n in (4, 5, 6)]
    with Pool(size=1, max_warm=2, audit=False) as pool:
        assert pool.wait_ready(timeout=60)
        pool.warm(refs[0])
        pool.warm(refs[1])
        assert pool.wait_ready(1, image=refs[0], timeout=60)
        assert pool.wait_ready(1, image=refs[1], timeout=60)
        pool.warm(refs[2])  # a third: refs[0], asked for least recently, gives its slot up
        assert pool.wait_ready(1, image=refs[2], timeout=60)
        assert eventually(lambda: pool.images() == {refs[0]: 0, refs[1]: 1, refs[2]: 1})
        # the engine holds the pool's own slot and the two warm ones, no more
        assert eventually(lambda: len(slots(engine, pool)) == 3)
        with pool.sandbox(image=refs[2]) as sb:  # taken ahead: not refilled
            assert image_of(engine, sb.container_id) == engine.image(refs[2])["Id"]
        time.sleep(1.0)
        assert pool.ready(image=refs[2]) == 0
    assert not slots(engine, pool)


def test_per_image_keeps_each_image_asked_for_warm_within_the_bound(engine: Any) -> None:
    refs = [burst_image(n, engine) for n in (7, 8)]
    with Pool(size=1, per_image=1, max_warm=1, audit=False) as pool:
        with pool.sandbox(image=refs[0]) as sb:
            assert sb.call("write_file", {"path": "a.txt", "content": "1"}).ok
        assert pool.wait_ready(1, image=refs[0], timeout=60)  # refilled: per_image
        with pool.sandbox(image=refs[1]) as sb:  # asking for another evicts the first's warm slot
            assert sb.call("write_file", {"path": "a.txt", "content": "2"}).ok
        assert eventually(lambda: pool.ready(image=refs[0]) == 0)
        assert pool.wait_ready(1, image=refs[1], timeout=60)


def test_an_idle_image_sub_pool_ends(engine: Any) -> None:
    ref = burst_image(9, engine)
    with Pool(size=1, idle_s=1.5, audit=False) as pool:
        with pool.sandbox(image=ref) as sb:
            assert sb.call("write_file", {"path": "a.txt", "content": "1"}).ok
        sub = pool.for_image(ref)
        assert eventually(lambda: sub._closed, timeout=10)
        assert all(not t.is_alive() for t in sub._threads) or eventually(
            lambda: all(not t.is_alive() for t in sub._threads)
        )
        assert pool.for_image(ref) is not sub  # asked again: a new one
        assert ref in pool.images()


def test_a_missing_image_is_a_clear_error_and_other_images_still_serve(engine: Any) -> None:
    with Pool(size=1, audit=False) as pool:
        with (
            pytest.raises(ImageMissing, match="toolcage-test-burst-missing:never"),
            pool.sandbox(image="toolcage-test-burst-missing:never"),
        ):
            pass
        with pool.sandbox(image=burst_image(1, engine)) as sb:
            assert sb.call("write_file", {"path": "a.txt", "content": "1"}).ok
        with pytest.raises(UsageError):
            pool.warm(burst_image(1, engine), count=-1)


def test_async_pool_takes_slots_of_many_images(engine: Any) -> None:
    refs = [burst_image(n, engine) for n in (10, 11, 12)]

    async def main() -> list[str]:
        async with AsyncPool(size=1, audit=False, max_concurrent_starts=2) as pool:
            pool.warm(refs[0])
            assert await pool.wait_ready(1, image=refs[0], timeout=60)

            async def one(ref: str) -> str:
                async with pool.sandbox(image=ref) as sb:
                    got = await sb.call("write_file", {"path": "a.txt", "content": ref})
                    assert got.ok
                    return image_of(engine, sb.container_id)

            return list(await asyncio.gather(*(one(r) for r in refs)))

    assert asyncio.run(main()) == [engine.image(r)["Id"] for r in refs]


def test_a_pooled_slot_of_a_foreign_image_runs_its_programs_as_a_cold_run_does(engine: Any) -> None:
    """The pooled path (ENV_POOLED, adoption) in a foreign image: the image's config is the slot's from its
    start, so exec runs the image's own shell with its PATH, HOME and WORKDIR, as a cold Sandbox does."""
    from toolcage import Sandbox

    ref = "toolcage-base:bookworm"  # a Debian image without the worker label: a foreign image
    assert engine.image(ref) is not None, f"{ref} is built by `toolcage image build` (the worker's base)"
    argv = ["sh", "-c", "command -v sh; echo $PATH; echo $HOME; pwd; id -u; cat /etc/debian_version"]
    with Sandbox(image=ref, audit=False) as cold:
        want = cold.call("exec", {"argv": argv})
    assert want.ok, want.error
    with Pool(size=1, audit=False) as pool:
        pool.warm(ref)
        assert pool.wait_ready(1, image=ref, timeout=60)
        with pool.sandbox(image=ref) as sb:
            got = sb.call("exec", {"argv": argv})
            assert got.ok, got.error
            assert image_of(engine, sb.container_id) == engine.image(ref)["Id"]
    assert got.result["stdout"] == want.result["stdout"]
    assert got.result["stdout"].splitlines()[4] != "0"  # never root
