"""A small SandboxAgent (OpenAI Agents SDK) whose shell and apply_patch run in a toolcage sandbox, on a writable
copy of a repository; its edits come back as a diff that ``git apply`` takes. Needs OPENAI_API_KEY (a real model).

    OPENAI_API_KEY=... .venv/bin/python examples/openai_agents/agent.py [REPO] ["TASK"]

The one line that differs from the SDK's Docker example is the client. The sandbox has no network (the
``default`` policy); ``allow_hosts`` would open named hosts through toolcage's egress proxy.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from agents import RunConfig, Runner
from agents.sandbox import SandboxAgent, SandboxRunConfig
from agents.sandbox.capabilities import Filesystem, Shell

from toolcage.integrations.openai_agents import (
    ToolcageSandboxClient,
    ToolcageSandboxClientOptions,
    toolcage_session,
)


async def main(repo: Path, task: str) -> None:
    client = ToolcageSandboxClient()
    options = ToolcageSandboxClientOptions(
        workspace=str(repo),  # copied into /workspace; the host's directory is never written
        workspace_gitignore=True,  # leave out .git, .venv, node_modules, .env ...
        # allow_hosts=("pypi.org", "files.pythonhosted.org"),  # egress allowlist, through toolcage's proxy
    )
    agent = SandboxAgent(
        name="fixer",
        model="gpt-5.4-mini",
        instructions="You work in /workspace, a copy of a repository. Make the change asked for, run the tests "
        "if there are any, and say what you changed.",
        capabilities=[Filesystem(), Shell()],
    )
    session = await client.create(options=options)
    async with session:  # one sandbox for the whole run; we keep it to read the diff afterwards
        result = await Runner.run(agent, task, run_config=RunConfig(sandbox=SandboxRunConfig(session=session)))
        print(result.final_output)
        changes = await toolcage_session(session).changes()
    await client.delete(session)
    print(f"\nadded {list(changes.added)} changed {list(changes.changed)} removed {list(changes.removed)}")
    out = Path("agent.diff")
    out.write_text(changes.diff)
    print(f"diff written to {out} (apply it with: git -C {repo} apply {out.resolve()})")


if __name__ == "__main__":
    repo = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    task = sys.argv[2] if len(sys.argv) > 2 else "Add a short docstring to the first function that has none."
    asyncio.run(main(repo, task))
