"""``toolcage mcp serve`` and ``toolcage mcp wrap``: the commands; what they run is imported only when
they run (``toolcage.servers.mcp_serve`` with the MCP SDK, ``toolcage.servers.mcp_wrap``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from toolcage.cli.output import use_json
from toolcage.errors import UsageError


@click.group()
def mcp() -> None:
    """Speak MCP (Model Context Protocol) to agent frameworks, IDEs and desktop apps."""


def _serve_command() -> Any:
    from toolcage.cli.options import pool_option, sandbox_options

    @mcp.command("serve")
    @sandbox_options
    @click.option(
        "--fresh-per-call",
        is_flag=True,
        help="A new sandbox for every tools/call (default: one sandbox per MCP session; scratch persists).",
    )
    @pool_option
    def serve(fresh_per_call: bool, pool_size: int | None, **opts: Any) -> None:
        """Serve the sandbox's tools (built-in and --tools connectors) as an MCP server on stdin/stdout.

        One sandbox per session by default, started before serving and removed at EOF, SIGINT or SIGTERM.
        stdout carries MCP only; diagnostics go to stderr.
        """
        from toolcage.cli import options

        use_json(False)  # stdout is the MCP stream: errors go to stderr only
        try:
            from toolcage.servers.mcp_serve import serve as serve_mcp
        except ModuleNotFoundError as exc:  # the MCP SDK is an extra; its message names it
            if "toolcage[mcp]" not in str(exc):
                raise
            raise UsageError(str(exc)) from None
        options.policy(opts)  # a bad policy or --timeout fails here, before anything starts
        if pool_size is None:
            serve_mcp(lambda: options.sandbox("mcp", opts), fresh_per_call=fresh_per_call)
            return
        # every sandbox (the session's, its replacements, or one per tools/call) adopted from a warm pool
        pool, make_sandbox = options.pool("mcp", opts, pool_size)
        with pool:
            serve_mcp(make_sandbox, fresh_per_call=fresh_per_call)

    return serve


def _wrap_command() -> Any:
    from toolcage.cli.options import sandbox_options

    # no connectors, no SafeFetch CA; an --image and a --secret of its own
    shared: Callable[[Any], Any] = sandbox_options(without=("tools", "ca_file", "image", "secret"))

    @mcp.command("wrap", context_settings={"allow_interspersed_args": False})
    @shared
    @click.option(
        "--secret",
        "secret",
        multiple=True,
        metavar="NAME=env:VAR|NAME=file:PATH",
        help="An environment variable NAME for the server only (repeatable): "
        "not in docker inspect, logs or the audit log.",
    )
    @click.option(
        "--image",
        metavar="REF",
        default=None,
        help="Run the server from this image, any the engine has (nothing is pulled), with its ENV, PATH and WORKDIR.",
    )
    @click.option(
        "--pip",
        "pip",
        metavar="PKG",
        multiple=True,
        help="A PyPI package the server needs (repeatable): an image with them is built once, offline, and reused.",
    )
    @click.option(
        "--apt",
        "apt",
        metavar="PKG",
        multiple=True,
        help="A Debian package the server needs (repeatable, e.g. --apt git): in the same image as --pip, "
        "downloaded on this host by its apt (a Debian bookworm host).",
    )
    @click.option("--allow-tool", metavar="TOOL", multiple=True, help="Offer only these tools (repeatable).")
    @click.option("--deny-tool", metavar="TOOL", multiple=True, help="Hide and refuse these tools (repeatable).")
    @click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- COMMAND [ARGS]...")
    def wrap(
        command: tuple[str, ...], image: str | None, pip: tuple[str, ...], apt: tuple[str, ...],
        allow_tool: tuple[str, ...], deny_tool: tuple[str, ...], **opts: Any,
    ) -> None:  # fmt: skip
        """Run a third-party stdio MCP server in a hardened container and relay MCP to it on stdin/stdout.

        Example: toolcage mcp wrap --pip mcp-server-time -- mcp-server-time

        The server gets the policy's limits, deadline and network (none, or only the allowed
        hosts through the egress proxy), --workspace read-only at /workspace, and each --secret
        as an environment variable (nowhere else). stdout carries MCP only; the server's stderr
        is shown on stderr, prefixed `toolcage: server:`.
        """
        from toolcage import logs
        from toolcage.cli import options
        from toolcage.cli.output import warn
        from toolcage.connectors import parse_secret_options
        from toolcage.servers.mcp_relay import ToolFilter
        from toolcage.servers.mcp_wrap import McpWrap, secret_store

        use_json(False)  # stdout is the MCP stream: errors go to stderr only
        if not command:
            raise UsageError(
                "give the server's command after --, e.g. toolcage mcp wrap --pip mcp-server-time -- mcp-server-time"
            )
        if allow_tool and deny_tool:
            raise UsageError("give --allow-tool or --deny-tool, not both")
        if image and (pip or apt):
            raise UsageError(
                "give --image REF or --pip/--apt PKG, not both: --pip and --apt build an image FROM the worker "
                "image, they add nothing to REF (install the server's packages in REF itself)"
            )
        if opts["sandbox"] == "none":
            from toolcage.servers.mcp_wrap import WRAP_NEEDS_A_CONTAINER

            raise UsageError(WRAP_NEEDS_A_CONTAINER)
        policy = options.policy(opts)  # a bad policy or --timeout fails here, before anything starts
        if pip or apt:
            from toolcage.image.debs import check_names
            from toolcage.image.derived import pip_requirements

            if pip:
                pip_requirements(pip)  # packages only, checked before Docker is asked anything
            check_names(apt)
        secrets = parse_secret_options(opts["secret"])
        secret_store(secrets)  # names and values checked before Docker is asked anything
        logs.configure(opts["verbose"], json_logs=False)
        engine, ref = _wrap_image(image, pip, warn, apt)
        tool_filter = ToolFilter(frozenset(allow_tool) if allow_tool else None, frozenset(deny_tool))
        server = McpWrap(
            policy, list(command), image=ref, workspace=opts["workspace"], secrets=secrets, tool_filter=tool_filter,
            keep=opts["keep"], egress_network=opts["egress_network"], egress_proxy=opts["egress_proxy"],
            audit=opts["audit_log"], engine=engine, sandbox=opts["sandbox"],
        )  # fmt: skip
        sys.exit(server.run())

    return wrap


def _wrap_image(image: str | None, pip: tuple[str, ...], warn: Any, apt: tuple[str, ...] = ()) -> tuple[Any, str]:
    """The engine and the image the server runs from: --image as it is, the derived image of --pip and
    --apt (built when missing or stale), or the worker image."""
    from toolcage.engine.docker_adapter import Engine
    from toolcage.errors import image_missing
    from toolcage.options import worker_image

    worker = worker_image()
    engine = Engine.default()
    engine.ping()
    if image:
        image_check(engine, image, warn)
        return engine, image
    if not pip and not apt:
        if engine.image(worker) is None:
            raise image_missing(worker)
        return engine, worker
    from toolcage.cli.image import build_derived_image
    from toolcage.image.build import check_worker_image
    from toolcage.image.derived import (
        REQUIREMENTS_LABEL,
        derived_current,
        pip_requirements,
        prepare_pip,
        unpinned,
        with_apt,
    )

    existing = engine.image(worker)
    if existing is not None and REQUIREMENTS_LABEL in ((existing.get("Config") or {}).get("Labels") or {}):
        raise UsageError(f"{worker} ($TOOLCAGE_IMAGE) is a derived image: --pip derives from the worker image")
    if check_worker_image(existing) == "foreign":
        raise UsageError(
            f"{worker} ($TOOLCAGE_IMAGE) is not a toolcage worker image: --pip and --apt build FROM the worker "
            f"image, not from an image of your own (install the server's packages in it and give --image {worker})"
        )
    tag = wrap_image_tag(pip_requirements(pip) if pip else b"", worker, apt)
    spec = prepare_pip(pip, tag, None, worker) if pip else None
    spec = with_apt(spec, apt, tag, None, worker) if apt else spec
    assert spec is not None
    if derived_current(engine, spec):
        return engine, tag  # nothing to build: nothing printed (an MCP client's log gets this at every session)
    loose = unpinned(pip)
    if loose:
        warn(
            f"--pip {' '.join(loose)}: not pinned to one release; the image built now is reused for as long as "
            f"--pip says the same, whatever the index holds later: pin it (e.g. --pip {loose[0]}==VERSION)"
        )
    build_derived_image(spec, None, False, emit_result=False, title="toolcage mcp wrap: the image for --pip")
    return engine, tag


def image_check(engine: Any, image: str, say_warning: Any) -> None:
    """``--image``: it exists here (nothing can be pulled); exit 2 otherwise. Any image runs: a worker image (or
    one built FROM it) with its own launcher, a user's own image with the worker image's runtime mounted
    read-only, whose launcher (toolcage.worker.mcp_host) starts the server with the image's ENV, PATH and WORKDIR."""
    from toolcage.image.build import check_worker_image, is_current

    info = engine.image(image)
    found = check_worker_image(info)
    if found == "missing":
        raise UsageError(
            f"--image {image}: no such image on this engine (`docker images` lists them; nothing is pulled): "
            "build or load it with docker, or use --pip PKG"
        )
    if found == "worker" and not is_current(info):
        say_warning(f"--image {image} was built from other toolcage sources; rebuild it if the server does not start")


def wrap_image_tag(requirements: bytes, parent: str, apt: tuple[str, ...] = ()) -> str:
    """The derived image for ``--pip``/``--apt``, named by what it holds: the same packages on the same worker
    image reuse it (with no --apt the name is what it was before --apt existed)."""
    import hashlib

    key = parent.encode() + bytes(1) + requirements + (bytes(1) + " ".join(sorted(apt)).encode() if apt else b"")
    return f"toolcage-mcp:{hashlib.sha256(key).hexdigest()[:16]}"


def register(group: click.Group) -> None:
    _serve_command()
    _wrap_command()
    group.add_command(mcp)


__all__ = ["image_check", "register", "wrap_image_tag"]
