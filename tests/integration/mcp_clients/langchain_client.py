"""LangChain's MCP adapter against `toolcage mcp serve`, no model: run by test_mcp_langchain.py in its own venv.

langchain-mcp-adapters 0.3 imports only with mcp 1.x and toolcage uses mcp 2.x, so this runs in a
separate environment (requirements.txt here). Usage: ``python langchain_client.py TOOLCAGE POLICY
WORKSPACE``; prints one JSON document of what LangChain saw, for the test to assert on.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, ToolException
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools


def _text(content: Any) -> str:
    """The text of a tool's output (a string or a list of content blocks)."""
    if isinstance(content, str):
        return content
    return "\n".join(b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text")


async def _call(tools: dict[str, BaseTool], name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Invoke a tool as an agent does (a tool call), and keep what a ToolMessage carries."""
    msg = await tools[name].ainvoke({"type": "tool_call", "id": "call-1", "name": name, "args": args})
    assert isinstance(msg, ToolMessage), type(msg)
    artifact = msg.artifact or {}
    return {"status": msg.status, "text": _text(msg.content), "structured": artifact.get("structured_content")}


async def main(toolcage: str, policy: str, workspace: str) -> dict[str, Any]:
    # mcp's stdio client passes the server only a few variables (PATH, HOME, ...): forward the
    # ones that say which engine and audit log to use
    env = {k: v for k, v in os.environ.items() if k.startswith(("TOOLCAGE_", "DOCKER_"))}
    client = MultiServerMCPClient(
        {
            "toolcage": {
                "transport": "stdio",
                "command": toolcage,
                "args": ["mcp", "serve", "--policy", policy, "--workspace", workspace],
                "env": env,
            }
        }
    )
    out: dict[str, Any] = {}

    # the README's way: tools from get_tools(), each call in a new session (a new sandbox)
    listed = {t.name: t for t in await client.get_tools()}
    out["tools"] = {name: sorted(t.args) for name, t in listed.items()}
    out["descriptions"] = {name: bool(t.description) for name, t in listed.items()}
    out["fresh"] = await _call(listed, "run_python", {"code": "print(6*7)"})

    # one explicit session: one sandbox for every call, so scratch persists between them
    async with client.session("toolcage") as session:
        tools = {t.name: t for t in await load_mcp_tools(session)}
        out["session"] = {
            "read_workspace": await _call(tools, "read_file", {"path": "/workspace/hello.txt"}),
            "list_workspace": await _call(tools, "list_files", {}),
            "write": await _call(tools, "write_file", {"path": "note.txt", "content": "kept"}),
            "read_back": await _call(tools, "run_python", {"code": "print(open('note.txt').read())"}),
            "exit_3": await _call(tools, "run_python", {"code": "import sys; print('bye'); sys.exit(3)"}),
            "missing": await _call(tools, "read_file", {"path": "/workspace/missing.txt"}),
            "write_workspace": await _call(tools, "write_file", {"path": "/workspace/x", "content": "no"}),
            "bad_params": await _call(tools, "list_files", {"max_entries": "ten"}),
        }
        # handle_tool_errors=False: the legacy way, the failure raises ToolException
        strict = {t.name: t for t in await load_mcp_tools(session, handle_tool_errors=False)}
        try:
            await strict["run_python"].ainvoke({"code": "raise SystemExit(4)"})
            out["raised"] = None
        except ToolException as exc:
            out["raised"] = {"type": type(exc).__name__, "message": str(exc)}
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:4]))))
