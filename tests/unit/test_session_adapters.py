"""The framework adapters on any session of toolcage's (toolcage.types.SandboxLike), not only a local Sandbox:
a Deep Agents backend and LangChain tools over a stand-in for a Ray cluster's session; no Docker, no Ray."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from toolcage.errors import NodeLost
from toolcage.results import CallResult

LISTING = [{"name": "exec", "description": "run a program", "params_schema": {"type": "object"}}]


class FakeSession:
    """A session with the surface's ``call`` and ``run_id`` only, as a ClusterSandbox is to the adapters."""

    run_id = "run-1"

    def __init__(self, *, writable: bool = True, lost_after: int | None = None) -> None:
        self.writable, self.lost_after = writable, lost_after
        self.calls: list[tuple[str, Any]] = []
        self.closed = False

    def call(self, tool: str, params: dict[str, Any] | None = None, *, timeout: float | None = None) -> CallResult:
        self.calls.append((tool, params))
        if self.lost_after is not None and len(self.calls) > self.lost_after:
            raise NodeLost("node abc was lost mid-run: its node died", node="abc")
        if tool == "tools.list":
            return CallResult("ok", tool, self.run_id, result=LISTING)
        argv = (params or {}).get("argv")
        if argv and argv[:2] == ["test", "-w"]:
            return CallResult("ok", tool, self.run_id, result={"exit_code": 0 if self.writable else 1})
        return CallResult("ok", tool, self.run_id, result={"exit_code": 0, "stdout": "hi\n", "stderr": ""})

    def close(self) -> None:
        self.closed = True


class FakeAsyncSession:
    """The async face only (as an AsyncClusterSandbox is to the adapters)."""

    run_id = "run-2"

    def __init__(self) -> None:
        self.inner = FakeSession()

    async def call(
        self, tool: str, params: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> CallResult:
        await asyncio.sleep(0)
        return self.inner.call(tool, params)


def test_a_deep_agents_backend_runs_on_a_session_it_was_given() -> None:
    """ToolcageSandbox.on_session: commands go to that session's call, from /workspace when it is writable
    (else /scratch); close() closes the session."""
    pytest.importorskip("deepagents")
    from toolcage.integrations.deepagents import ToolcageSandbox

    session = FakeSession()
    backend = ToolcageSandbox.on_session(session)  # type: ignore[arg-type]
    assert backend.root == "/workspace" and backend.id == "run-1" and backend.container_id is None
    r = backend.execute("echo hi")
    assert r.exit_code == 0 and r.output == "hi\n"
    assert session.calls[-1][0] == "exec" and session.calls[-1][1]["cwd"] == "/workspace"
    backend.close()
    assert session.closed
    assert ToolcageSandbox.on_session(FakeSession(writable=False)).root == "/scratch"  # type: ignore[arg-type]


def test_a_lost_cluster_session_is_an_ended_backend_not_a_traceback() -> None:
    """A NodeLost from the session ends the backend: exit code 125 with the status, and every later call says so."""
    pytest.importorskip("deepagents")
    from toolcage.integrations.deepagents import ENDED_EXIT_CODE, ToolcageSandbox

    backend = ToolcageSandbox.on_session(FakeSession(lost_after=1))  # type: ignore[arg-type]
    r = backend.execute("echo hi")
    assert r.exit_code == ENDED_EXIT_CODE and "status node_lost" in r.output, r
    assert backend.ended is not None and backend.ended.status == "node_lost"
    (up,) = backend.upload_files([("/scratch/a", b"a")])
    assert up.error is not None and "node_lost" in up.error


@pytest.mark.parametrize("make", [FakeSession, FakeAsyncSession])
def test_langchain_tools_bind_to_any_session_sync_or_async(make: Any) -> None:
    """get_tools/aget_tools take a session that is neither Sandbox nor AsyncSandbox: invoke and ainvoke both call it."""
    pytest.importorskip("langchain_core")
    from toolcage.integrations.langchain import aget_tools, get_tools

    session = make()
    (tool,) = get_tools(session, include=["exec"])
    assert tool.metadata == {"toolcage_tool": "exec", "toolcage_run_id": session.run_id}
    assert "hi" in str(tool.invoke({"argv": ["echo", "hi"]}))
    (atool,) = asyncio.run(aget_tools(session, include=["exec"]))
    assert "hi" in str(asyncio.run(atool.ainvoke({"argv": ["echo", "hi"]})))


def test_langchain_refuses_what_is_not_a_session() -> None:
    """Something without call and run_id is a UsageError naming its type."""
    pytest.importorskip("langchain_core")
    from toolcage.errors import UsageError
    from toolcage.integrations.langchain import get_tools

    with pytest.raises(UsageError, match=r"must be a toolcage session .* got dict"):
        get_tools({})  # type: ignore[arg-type]
