"""toolcage's LangChain tools (``toolcage.integrations.langchain``) beside ``langchain-mcp-adapters`` over
``toolcage mcp serve`` and the raw ``Sandbox.call``, in one run.

    .venv/bin/python -m bench.langchain_tools [--runs 5] [--calls 300] [--json PATH]

Measured on the host:

1. ``first answer``: from nothing to the first tool call's answer, ``--runs`` times (min/median):
   - ``StructuredTool (sync)``: ``Sandbox()`` started, ``get_tools(sb)``, ``tools["run_shell"].invoke(...)``;
   - ``StructuredTool (async)``: the same with ``AsyncSandbox``, ``aget_tools`` and ``ainvoke``;
   - ``raw Sandbox.call``: ``Sandbox()`` started and ``sb.call("run_shell", ...)``;
   - ``MCP adapters, session``: ``MultiServerMCPClient.session()`` (which starts ``toolcage mcp serve``,
     its sandbox, and lists the tools), ``load_mcp_tools``, the first ``ainvoke``;
   - ``MCP adapters, get_tools()``: ``client.get_tools()`` (a server for the listing) and the first
     ``ainvoke`` (a server, so a sandbox, of its own).
2. ``warm call``: ``--calls`` calls on one open sandbox (p50/p90, after 20 unmeasured ones), of
   ``list_files`` on ``/scratch`` (no child process: the floor) and ``run_shell`` ``true`` (a child),
   each as a raw ``Sandbox.call``, a ``StructuredTool.invoke`` with a model's tool call (the agent's
   way: a ``ToolMessage`` back), ``ainvoke`` on an ``AsyncSandbox``, and an MCP adapter tool's ``ainvoke``
   in one session. The overhead is the p50 beside the raw call's.

langchain-mcp-adapters 0.3 needs mcp 1.x and toolcage's ``mcp serve`` mcp 2.x, so it is seldom in
toolcage's venv: it is used from there if it imports, else from the venv the MCP client tests make
(``.cache/mcp-clients/*``, ``tests/integration/mcp_clients/requirements.txt``), run as a subprocess
that starts this venv's ``toolcage`` executable; without either, its rows say so. Goal: a warm
StructuredTool call under 20 ms (reported, not enforced: under gVisor a child process alone, as
``run_shell`` starts, takes longer; the StructuredTool's own part is the figure beside the raw call).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from toolcage import AsyncSandbox, Sandbox, wait_removed
from toolcage.integrations.langchain import aget_tools, get_tools

REPO = Path(__file__).resolve().parent.parent
GOAL_WARM_MS = 20.0
# long enough for the warm loops under gVisor (the default policy's run_s is 60 s)
POLICY: dict[str, Any] = {"name": "bench-langchain", "timeouts": {"run_s": 1800, "idle_s": 900}}
POLICY_YAML = "version: 1\nname: bench-langchain\ntimeouts:\n  run_s: 1800\n  idle_s: 900\n"
SHELL = {"command": "true"}
LIST = {"path": "/scratch"}

# run by the MCP adapters' python: prints {"first_session": [...], "first_get_tools": [...], "warm": {...}}
MCP_CLIENT = r"""
import asyncio, json, os, sys, time
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools

toolcage, policy, runs, calls = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
env = {k: v for k, v in os.environ.items() if k.startswith(("TOOLCAGE_", "DOCKER_"))}
serve = ["mcp", "serve", "--policy", policy]
client = MultiServerMCPClient({"toolcage": {"transport": "stdio", "command": toolcage, "args": serve, "env": env}})

def call(tool, args, i):
    return tool.ainvoke({"type": "tool_call", "id": f"c{i}", "name": tool.name, "args": args})

async def main():
    out = {"first_session": [], "first_get_tools": [], "warm": {}}
    for _ in range(runs):
        t = time.perf_counter()
        async with client.session("toolcage") as session:
            tools = {x.name: x for x in await load_mcp_tools(session)}
            msg = await call(tools["run_shell"], {"command": "true"}, 0)
            out["first_session"].append((time.perf_counter() - t) * 1000)
            assert msg.status == "success", msg
        t = time.perf_counter()
        tools = {x.name: x for x in await client.get_tools()}
        msg = await call(tools["run_shell"], {"command": "true"}, 0)
        out["first_get_tools"].append((time.perf_counter() - t) * 1000)
        assert msg.status == "success", msg
    async with client.session("toolcage") as session:
        tools = {x.name: x for x in await load_mcp_tools(session)}
        for name, args in (("list_files", {"path": "/scratch"}), ("run_shell", {"command": "true"})):
            for i in range(20):
                await call(tools[name], args, i)
            samples = []
            for i in range(calls):
                t = time.perf_counter()
                msg = await call(tools[name], args, i)
                samples.append((time.perf_counter() - t) * 1000)
                assert msg.status == "success", msg
            out["warm"][name] = samples
    print(json.dumps(out))

asyncio.run(main())
"""


def _mcp_python() -> tuple[str | None, str]:
    """A python with langchain-mcp-adapters, and where it is; None when there is none."""
    try:
        import langchain_mcp_adapters  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        pass
    else:
        return sys.executable, "toolcage's venv"
    for python in sorted((REPO / ".cache" / "mcp-clients").glob("*/bin/python")):
        ok = subprocess.run([str(python), "-c", "import langchain_mcp_adapters"], capture_output=True)
        if ok.returncode == 0:
            return str(python), str(python.parent.parent.relative_to(REPO))
    return None, "langchain-mcp-adapters is not installed (run tests/integration/test_mcp_langchain.py once)"


def _ms(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


async def _ams(fn: Callable[[], Awaitable[Any]]) -> float:
    t = time.perf_counter()
    await fn()
    return (time.perf_counter() - t) * 1000


def _tool_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_call", "id": "bench", "name": name, "args": args}


def first_sync_tools() -> float:
    t = time.perf_counter()
    with Sandbox(POLICY) as sb:
        tools = {x.name: x for x in get_tools(sb)}
        msg = tools["run_shell"].invoke(_tool_call("run_shell", SHELL))
        ms = (time.perf_counter() - t) * 1000
        assert msg.status == "success", msg
    return ms


def first_raw() -> float:
    t = time.perf_counter()
    with Sandbox(POLICY) as sb:
        r = sb.call("run_shell", SHELL)
        ms = (time.perf_counter() - t) * 1000
        assert r.ok, r
    return ms


async def first_async_tools() -> float:
    t = time.perf_counter()
    async with AsyncSandbox(POLICY) as sb:
        tools = {x.name: x for x in await aget_tools(sb)}
        msg = await tools["run_shell"].ainvoke(_tool_call("run_shell", SHELL))
        ms = (time.perf_counter() - t) * 1000
        assert msg.status == "success", msg
    return ms


def warm_sync(calls: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    with Sandbox(POLICY) as sb:
        tools = {x.name: x for x in get_tools(sb)}
        for name, args in (("list_files", LIST), ("run_shell", SHELL)):
            for _ in range(20):
                sb.call(name, args)
                tools[name].invoke(_tool_call(name, args))
            raw, tool = [], []
            for _ in range(calls):  # interleaved, so both see the same machine
                raw.append(_ms(lambda n=name, a=args: sb.call(n, a)))
                tool.append(_ms(lambda n=name, a=args: tools[n].invoke(_tool_call(n, a))))
            out[f"raw Sandbox.call {name}"] = raw
            out[f"StructuredTool.invoke {name}"] = tool
    return out


async def warm_async(calls: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    async with AsyncSandbox(POLICY) as sb:
        tools = {x.name: x for x in await aget_tools(sb)}
        for name, args in (("list_files", LIST), ("run_shell", SHELL)):
            for _ in range(20):
                await sb.call(name, args)
                await tools[name].ainvoke(_tool_call(name, args))
            raw, tool = [], []
            for _ in range(calls):
                raw.append(await _ams(lambda n=name, a=args: sb.call(n, a)))
                tool.append(await _ams(lambda n=name, a=args: tools[n].ainvoke(_tool_call(n, a))))
            out[f"raw AsyncSandbox.call {name}"] = raw
            out[f"StructuredTool.ainvoke {name}"] = tool
    return out


def mcp_adapters(runs: int, calls: int) -> tuple[dict[str, Any] | None, str]:
    python, where = _mcp_python()
    if python is None:
        return None, where
    toolcage = str(Path(sys.executable).with_name("toolcage"))
    with tempfile.TemporaryDirectory(prefix="bench-langchain-") as tmp:
        policy = Path(tmp) / "policy.yaml"
        policy.write_text(POLICY_YAML)
        proc = subprocess.run(
            [python, "-c", MCP_CLIENT, toolcage, str(policy), str(runs), str(calls)],
            capture_output=True,
            text=True,
            timeout=1800,
            env=os.environ.copy(),
        )
    if proc.returncode != 0:
        return None, f"the MCP adapters' run failed: {proc.stderr.strip().splitlines()[-1:]}"
    return json.loads(proc.stdout), where


def _row(label: str, samples: list[float], base: float | None = None, cold: bool = False) -> str:
    s = sorted(samples)
    p50 = statistics.median(s)
    other = s[0] if cold else s[min(len(s) - 1, int(len(s) * 0.9))]
    extra = f"{p50 - base:+8.2f}" if base is not None else " " * 8
    return f"  {label:<44} {p50:9.2f} {other:9.2f} {extra}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.langchain_tools", description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="cold starts per way (default 5)")
    ap.add_argument("--calls", type=int, default=300, help="warm calls per tool and way (default 300)")
    ap.add_argument("--json", help="also write the samples here")
    args = ap.parse_args(argv)

    first: dict[str, list[float]] = {"StructuredTool (sync)": [], "StructuredTool (async)": [], "raw Sandbox.call": []}
    first_raw()  # the image in the page cache
    wait_removed(60)
    for _ in range(args.runs):  # interleaved
        first["raw Sandbox.call"].append(first_raw())
        first["StructuredTool (sync)"].append(first_sync_tools())
        first["StructuredTool (async)"].append(asyncio.run(first_async_tools()))
    wait_removed(60)
    warm = warm_sync(args.calls)
    warm.update(asyncio.run(warm_async(args.calls)))
    wait_removed(60)
    mcp, where = mcp_adapters(args.runs, args.calls)
    if mcp is not None:
        first["MCP adapters, session()"] = mcp["first_session"]
        first["MCP adapters, get_tools()"] = mcp["first_get_tools"]
        for name, samples in mcp["warm"].items():
            warm[f"MCP adapter tool.ainvoke {name}"] = samples

    sandbox = os.environ.get("TOOLCAGE_SANDBOX") or "runc"
    print(f"toolcage LangChain tools, sandbox {sandbox}, {args.runs} cold runs, {args.calls} warm calls each")
    print(f"langchain-mcp-adapters: {where}")
    print(f"\nfirst tool answer (ms){'':<23} {'median':>9} {'min':>9} {'vs raw':>8}")
    base = statistics.median(first["raw Sandbox.call"])
    for label, samples in first.items():
        print(_row(label, samples, None if label.startswith("raw") else base, cold=True))
    print(f"\nwarm call on an open sandbox (ms){'':<12} {'p50':>9} {'p90':>9} {'vs raw':>8}")
    for tool in ("list_files", "run_shell"):
        raw_sync = statistics.median(warm[f"raw Sandbox.call {tool}"])
        raw_async = statistics.median(warm[f"raw AsyncSandbox.call {tool}"])
        for label, samples in warm.items():
            if not label.endswith(tool):
                continue
            base = None if label.startswith("raw") else raw_async if "ainvoke" in label else raw_sync
            print(_row(label, samples, base))
    print(f"\ngoal: a warm StructuredTool call under {GOAL_WARM_MS:.0f} ms (p50)")
    for tool in ("list_files", "run_shell"):
        p50s = {k: statistics.median(v) for k, v in warm.items() if k.startswith("StructuredTool") and k.endswith(tool)}
        over = [p50 - statistics.median(warm[k.replace("StructuredTool.invoke", "raw Sandbox.call").replace(
            "StructuredTool.ainvoke", "raw AsyncSandbox.call")]) for k, p50 in p50s.items()]  # fmt: skip
        worst = max(p50s.values())
        verdict = "met" if worst < GOAL_WARM_MS else "MISSED"
        print(f"  {tool:<11} worst p50 {worst:7.2f} ms: {verdict}; the StructuredTool's own part {max(over):+.2f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"first": first, "warm": warm, "mcp": where}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
