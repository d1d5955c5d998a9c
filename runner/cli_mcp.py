"""``toolcage mcp serve``: the command; the MCP SDK is imported only when it runs (``toolcage.mcp_server``)."""

from __future__ import annotations

from typing import Any

import click

from toolcage.output import use_json


@click.group()
def mcp() -> None:
    """Speak MCP (Model Context Protocol) to agent frameworks, IDEs and desktop apps."""


def _serve_command() -> Any:
    from toolcage.cli import sandbox_options

    @mcp.command("serve")
    @sandbox_options
    @click.option(
        "--fresh-per-call",
        is_flag=True,
        help="A new sandbox for every tools/call (default: one sandbox per MCP session; scratch persists).",
    )
    def serve(fresh_per_call: bool, **opts: Any) -> None:
        """Serve the sandbox's tools (built-in and --tools connectors) as an MCP server on stdin/stdout.

        One sandbox per session by default, started before serving and removed at EOF, SIGINT or SIGTERM.
        stdout carries MCP only; diagnostics go to stderr.
        """
        from toolcage.cli import _policy, _sandbox
        from toolcage.mcp_server import serve as serve_mcp

        use_json(False)  # stdout is the MCP stream: errors go to stderr only
        _policy(opts)  # a bad policy or --timeout fails here, before anything starts
        serve_mcp(lambda: _sandbox("mcp", opts), fresh_per_call=fresh_per_call)

    return serve


def register(group: click.Group) -> None:
    _serve_command()
    group.add_command(mcp)


__all__ = ["register"]
