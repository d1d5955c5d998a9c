"""The OpenAI Agents SDK's MCPServerStdio against `toolcage mcp serve`, no model and no network.

Run by test_mcp_langchain.py in the same separate venv as the LangChain client (requirements.txt
here). Usage: ``python agents_client.py TOOLCAGE POLICY WORKSPACE``; prints one JSON document.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from agents.mcp import MCPServerStdio


def _result(res: Any) -> dict[str, Any]:
    text = "\n".join(c.text for c in res.content if c.type == "text")
    return {"is_error": bool(res.isError), "text": text, "structured": res.structuredContent}


async def main(toolcage: str, policy: str, workspace: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k.startswith(("TOOLCAGE_", "DOCKER_"))}
    params = {"command": toolcage, "args": ["mcp", "serve", "--policy", policy, "--workspace", workspace], "env": env}
    # the SDK's default read timeout is 5 s: a call may run for the policy's timeouts.call_s
    async with MCPServerStdio(params=params, client_session_timeout_seconds=60) as server:
        tools = await server.list_tools()
        return {
            "tools": sorted(t.name for t in tools),
            "run_python": _result(await server.call_tool("run_python", {"code": "print(6*7)"})),
            "grep": _result(await server.call_tool("grep", {"pattern": "workspace", "path": "/workspace"})),
            "exit_3": _result(await server.call_tool("run_python", {"code": "import sys; sys.exit(3)"})),
        }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:4]))))
