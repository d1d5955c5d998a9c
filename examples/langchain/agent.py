"""A small LangGraph coding agent whose tools run in a toolcage sandbox, with no MCP subprocess.

    pip install 'toolcage[langchain]' langchain langchain-anthropic   # or another provider's package
    export ANTHROPIC_API_KEY=...
    python examples/langchain/agent.py --workspace ~/src/project "Add a docstring to every function in util.py"

The agent gets toolcage's tools (run_python, run_shell, exec, read_file, write_file, grep, list_files, ...)
bound to one sandbox: a hardened container with a writable *copy* of the workspace (the host's files are
never written), no network unless the policy allows hosts, and the policy's limits. When the agent is
done, its edits come back as a diff, which is printed (and written to --diff FILE), ready for
``git apply``. ``--model`` takes any ``init_chat_model`` name (``provider:model``); ``--policy`` a bundled
name or a policy file. Not run by the tests (it needs a model); tests/integration/test_langchain_tools.py
runs the same loop with a scripted model.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from toolcage import AsyncSandbox
from toolcage.integrations.langchain import aget_tools

SYSTEM = (
    "You are a careful coding agent. The project is in /workspace (a writable copy: edit it in place). "
    "/scratch is yours for anything else. Use the tools to look before you change anything, run the "
    "project's tests when there are any, and finish with a short summary of what you changed."
)


def make_agent(model_name: str, tools: list[Any]) -> Any:
    """LangChain's agent (a LangGraph graph) over the tools; langgraph's prebuilt one without langchain."""
    from langchain.chat_models import init_chat_model

    model = init_chat_model(model_name)
    try:
        from langchain.agents import create_agent
    except ImportError:
        from langgraph.prebuilt import create_react_agent

        return create_react_agent(model, tools, prompt=SYSTEM)
    return create_agent(model, tools, system_prompt=SYSTEM)


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("task", help="what the agent should do")
    ap.add_argument("--workspace", default=".", help="the project (copied into the sandbox; default .)")
    ap.add_argument("--model", default="anthropic:claude-sonnet-4-5", help="an init_chat_model name")
    ap.add_argument("--policy", default="default", help="a bundled policy name or a policy file")
    ap.add_argument("--diff", help="also write the agent's changes here, as a git diff")
    ap.add_argument("--max-steps", type=int, default=40, help="the agent's recursion limit (default 40)")
    args = ap.parse_args()

    # a session policy: longer than the default 60 s, which suits one-shot runs
    policy = args.policy if args.policy != "default" else {"timeouts": {"run_s": 1800, "idle_s": 600}}
    async with AsyncSandbox(policy, workspace=args.workspace, workspace_mode="copy", workspace_gitignore=True) as sb:
        tools = await aget_tools(sb)  # the sandbox's tools with their JSON schemas; no MCP server
        agent = make_agent(args.model, tools)
        async for step in agent.astream(
            {"messages": [("user", args.task)]}, {"recursion_limit": args.max_steps}, stream_mode="updates"
        ):
            for update in step.values():
                for msg in (update or {}).get("messages", []):
                    msg.pretty_print()  # each model turn and tool result (a failed call shows its status)
        changes = await sb.changes()
    print(f"\nchanged: {list(changes.changed)}  added: {list(changes.added)}  removed: {list(changes.removed)}")
    if changes.diff:
        print(changes.diff)
        if args.diff:
            Path(args.diff).write_text(changes.diff)
            print(f"written to {args.diff}: apply it with  git apply {args.diff}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
