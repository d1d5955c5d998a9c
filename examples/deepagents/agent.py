"""A small Deep Agent (LangChain ``deepagents``) whose file tools and shell run in a toolcage sandbox, on a
writable copy of a repository; its edits come back as a diff that ``git apply`` takes. Needs a real model:
ANTHROPIC_API_KEY (the default ``anthropic:claude-sonnet-4-6``) or another provider's key with ``--model``.

    ANTHROPIC_API_KEY=... .venv/bin/python examples/deepagents/agent.py [REPO] ["TASK"] [--model provider:name]

The one line that differs from deepagents' own examples is ``backend=``. The sandbox has no network (the
``default`` policy); ``allow_hosts`` would open named hosts through toolcage's egress proxy.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from deepagents import create_deep_agent
from deepagents.backends import CompositeBackend

from toolcage.integrations.deepagents import ToolcageSandbox


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("repo", nargs="?", default=".")
    ap.add_argument("task", nargs="?", default="Find a small bug or a missing docstring, fix it, and run the tests.")
    ap.add_argument("--model", default="anthropic:claude-sonnet-4-6")
    args = ap.parse_args()
    repo = Path(args.repo).resolve()

    with ToolcageSandbox(
        repo,  # copied into /workspace; the host's directory is never written
        workspace_gitignore=True,  # leave out .git, .venv, node_modules, .env ...
        session_s=1800,  # the sandbox lives 30 minutes at most
        command_timeout=120,  # a command may run 2 minutes unless the agent asks for another timeout
        # allow_hosts=["pypi.org", "files.pythonhosted.org"],  # egress allowlist, through toolcage's proxy
    ) as sandbox:
        # deepagents puts large tool results under its artifacts root ("/" by default, read-only here):
        # send them to the sandbox's scratch instead
        backend = CompositeBackend(default=sandbox, routes={}, artifacts_root="/scratch/.deepagents")
        agent = create_deep_agent(
            model=args.model,
            backend=backend,
            system_prompt="You work in /workspace, a copy of a repository (commands start there). Make the change "
            "asked for with your file tools, run the tests if there are any, and say what you changed.",
        )
        result = agent.invoke({"messages": [{"role": "user", "content": args.task}]})
        print(result["messages"][-1].content)
        changes = sandbox.changes()

    print(f"\nadded {list(changes.added)} changed {list(changes.changed)} removed {list(changes.removed)}")
    out = Path("agent.diff")
    out.write_text(changes.diff)
    print(f"diff written to {out} (apply it with: git -C {repo} apply {out.resolve()})")


if __name__ == "__main__":
    main()
