"""The OpenAI Agents SDK's sandbox clients on one machine, in one run: ToolcageSandboxClient beside the SDK's own
DockerSandboxClient on the same image (the local ``toolcage-worker:<version>``; never pulled), and toolcage's pool.

    .venv/bin/python -m bench.openai_agents [--runs 5] [--commands 30]

- **first answer**: from the SDK asking for a sandbox (``client.create``) through ``session.start()`` (the
  manifest applied) to the answer of its first command (``exec("true")``); the pool row is ``pool.sandbox()``
  started and its first ``exec`` answered (the SDK client cannot take a pooled sandbox: a pool's slots have no
  writable workspace copy);
- **per command**: a warm ``session.exec("true", shell=False)``, and ``exec("true")`` as the SDK's shell tool
  sends it (``sh -lc``), medians over ``--commands`` calls.

Prints a table (medians and minimums over ``--runs`` sessions).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from toolcage import DEFAULT_IMAGE, wait_removed

Exec = Callable[[bool], Awaitable[Any]]


async def _commands(run: Exec, n: int) -> tuple[list[float], list[float]]:
    plain, shell = [], []
    for _ in range(n):
        t = time.perf_counter()
        await run(False)
        plain.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        await run(True)
        shell.append((time.perf_counter() - t) * 1000)
    return plain, shell


async def _sessions(client: Any, options: Callable[[], Any], runs: int, commands: int) -> dict[str, list[float]]:
    """``runs`` sessions of ``client``: create to the first command's answer, then ``commands`` warm ones."""
    out: dict[str, list[float]] = {"first": [], "plain": [], "shell": []}
    for _ in range(runs):
        t = time.perf_counter()
        session = await client.create(options=options())
        try:
            await session.start()
            r = await session.exec("true", shell=False)
            out["first"].append((time.perf_counter() - t) * 1000)
            assert r.exit_code == 0
            plain, shell = await _commands(lambda sh, s=session: s.exec("true", shell=sh), commands)
            out["plain"] += plain
            out["shell"] += shell
        finally:
            await session.aclose()
            await client.delete(session)
        wait_removed(60)  # toolcage removes its containers off the caller's path: not into the next run
    return out


async def toolcage_client(runs: int, commands: int) -> dict[str, list[float]]:
    from toolcage.integrations.openai_agents import ToolcageSandboxClient, ToolcageSandboxClientOptions

    return await _sessions(ToolcageSandboxClient(), ToolcageSandboxClientOptions, runs, commands)


async def sdk_docker(runs: int, commands: int, image: str) -> dict[str, list[float]]:
    import docker  # type: ignore[import-untyped]
    from agents.sandbox.sandboxes.docker import DockerSandboxClient, DockerSandboxClientOptions

    engine = docker.from_env()
    engine.images.get(image)  # present locally, or this row fails: the SDK client would pull it
    return await _sessions(
        DockerSandboxClient(engine),
        lambda: DockerSandboxClientOptions(image=image, network_mode="none"),
        runs,
        commands,
    )


async def toolcage_pool(runs: int, commands: int) -> dict[str, list[float]]:
    from toolcage import AsyncPool

    out: dict[str, list[float]] = {"first": [], "plain": [], "shell": []}
    async with AsyncPool("default", size=1) as pool:
        for _ in range(runs):
            await pool.wait_ready()
            await asyncio.sleep(0.2)  # let the refill settle: the figure is a ready slot's
            t = time.perf_counter()
            sb = pool.sandbox()
            await sb.start()
            try:
                r = await sb.call("exec", {"argv": ["true"]})
                out["first"].append((time.perf_counter() - t) * 1000)
                assert r.ok

                async def run(sh: bool, sb: Any = sb) -> Any:
                    params = {"argv": ["sh", "-lc", "true"]} if sh else {"argv": ["true"]}
                    return await sb.call("exec", params)

                plain, shell = await _commands(run, commands)
                out["plain"] += plain
                out["shell"] += shell
            finally:
                await sb.close()
    wait_removed(60)
    return out


def _fmt(v: list[float]) -> str:
    return f"{statistics.median(v):,.1f} (min {min(v):,.1f})" if v else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--commands", type=int, default=30)
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    args = ap.parse_args()
    rows: list[tuple[str, dict[str, list[float]] | str]] = []
    for name, fn in (
        ("ToolcageSandboxClient", lambda: toolcage_client(args.runs, args.commands)),
        (
            f"SDK DockerSandboxClient ({args.image}, network none)",
            lambda: sdk_docker(args.runs, args.commands, args.image),
        ),
        ("toolcage AsyncPool (size 1), exec tool", lambda: toolcage_pool(args.runs, args.commands)),
    ):
        try:
            rows.append((name, asyncio.run(fn())))
        except Exception as exc:  # a row that cannot run says why; the others still print
            rows.append((name, f"failed: {type(exc).__name__}: {exc}"))
    print(f"\n{args.runs} sessions each, {args.commands} warm commands per session; ms, median (min)\n")
    print("| client | first answer | per command (`true`) | per command (`sh -lc true`) |")
    print("|---|---:|---:|---:|")
    for name, got in rows:
        if isinstance(got, str):
            print(f"| {name} | {got} | | |")
        else:
            print(f"| {name} | {_fmt(got['first'])} | {_fmt(got['plain'])} | {_fmt(got['shell'])} |")


if __name__ == "__main__":
    main()
