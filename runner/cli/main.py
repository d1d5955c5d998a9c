"""The ``toolcage`` command (click): the group, serve, tools, policy test (here), run
(``toolcage.cli.run``), image build (``toolcage.cli.image``), mcp serve and wrap (``toolcage.cli.mcp``)
and the operator commands audit, ps, gc, doctor (``toolcage.cli.ops``). The options the sandboxed
commands share: ``toolcage.cli.options``; how the process starts and ends: ``toolcage.cli.startup``.

How it talks is decided once, in ``toolcage.cli.output``: results on stdout (JSON with ``--json``,
always JSON for run, policy test and image build), diagnostics as escaped plain text on
stderr, every error translated in one place into that output and its exit code: 0 ok, 1 the
tool reported an error, 2 usage or policy error, 3 sandbox failure (timeout, memory, crash, Docker).
"""

from __future__ import annotations

import dataclasses
import gc
import signal
import sys
from typing import Any

import click

from toolcage.cli import options, policy_flags, startup
from toolcage.cli.output import ToolcageGroup, emit, say, use_json
from toolcage.errors import UsageError
from toolcage.policies import contract
from toolcage.textsafe import escape


@click.group(cls=ToolcageGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="toolcage")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """toolcage: run tool handlers you did not write in a hardened, per-run Docker sandbox."""
    from toolcage import logs

    logs.configure(0, json_logs=False)  # warnings as `toolcage: warning: …` (a command's -v reconfigures)
    if ctx.invoked_subcommand != "run":
        gc.enable()  # main() turned it off; `run` turns it back on once it has what it imports


@cli.command()
@options.sandbox_options
@click.option(
    "--tool-label", default="serve", show_default=True, help="Tool name used in the container name and labels."
)
@options.pool_option
@options.dry_run_option
def serve(tool_label: str, pool_size: int | None, dry_run: bool, **opts: Any) -> None:
    """Bridge JSON-RPC on this process's stdin/stdout into one sandboxed run.

    Send newline-delimited JSON-RPC 2.0 requests on stdin; responses come back on stdout.
    The run ends at stdin EOF or at the policy's run deadline. With --pool N, every request
    runs in a fresh sandbox of its own, adopted from N kept pre-started (up to N at once).
    """
    from toolcage.servers.serve import bridge

    if dry_run:
        use_json(True)  # the result is one JSON document, as `run --dry-run`'s
        options.dry_run(tool_label, opts)
        return
    use_json(False)  # stdout is the JSON-RPC stream: errors go to stderr only
    if pool_size is not None:
        from toolcage.servers.serve_pool import bridge_fresh

        pool, make_sandbox = options.pool(tool_label, opts, pool_size)
        with pool:
            bridge_fresh(make_sandbox, sys.stdin.buffer, sys.stdout.buffer, workers=pool_size)
        return
    with options.sandbox(tool_label, opts) as sb:
        bridge(sb, sys.stdin.buffer, sys.stdout.buffer)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print names, descriptions and params JSON schemas.")
@options.sandbox_options
def tools(as_json: bool, **opts: Any) -> None:
    """List the tools: the built-in ones, and with --tools the connectors too (read in a sandbox,
    since their code is never imported on the host)."""
    from toolcage.worker.tools import Catalog

    use_json(as_json)
    if opts["tools"]:
        if not opts["secret"]:
            # listing calls no handler: a policy's secrets are not needed to read the connectors' tools
            opts["policy"] = dataclasses.replace(options.policy(opts), secrets={})
        with options.sandbox("tools", opts) as sb:
            res = sb.call(contract.TOOLS_LIST)
        listing = res.result if isinstance(res.result, list) else []
    else:
        listing = Catalog().describe()
    if as_json:
        emit(listing)
        return
    width = max(len(t["name"]) for t in listing)
    for t in listing:
        click.echo(f"{escape(t['name']):<{width}}  {escape(t['description'])}")


@cli.group()
def policy() -> None:
    """Check policies and URLs against them."""


@policy.command("test")
@click.argument("policy_ref", metavar="POLICY", shell_complete=policy_flags.complete_policy)
@click.argument("url")
@click.option("--method", default="GET", show_default=True, help="HTTP method of the request.")
@click.option(
    "--resolve",
    "resolve",
    multiple=True,
    metavar="HOST=IP",
    help="Answer for HOST instead of DNS (repeatable; several for one host give several answers).",
)
def policy_test(policy_ref: str, url: str, method: str, resolve: tuple[str, ...]) -> None:
    """Would POLICY let a sandbox fetch URL? Prints {"allowed", "reason"}; exit 0 allowed, 1 denied, 2 error.

    Runs the same decide() as SafeFetch and the egress proxy, with the system resolver for
    names not given with --resolve (a name that cannot be resolved is denied).
    """
    import ipaddress

    use_json(True)
    from toolcage.policies import load_policy
    from toolcage.policies.decide import Request, decide, system_resolver
    from toolcage.policies.names import NameError_, normalize_host

    fixed: dict[str, list[str]] = {}
    for item in resolve:
        host, sep, ip = item.partition("=")
        if not sep or not host or not ip:
            raise UsageError(f"--resolve wants HOST=IP, not {item!r}")
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise UsageError(f"--resolve {item!r}: {ip!r} is not an IP address") from None
        try:
            fixed.setdefault(normalize_host(host), []).append(ip)
        except NameError_ as exc:
            raise UsageError(f"--resolve {item!r}: {exc}") from None

    def resolver(name: str) -> list[str]:
        if name in fixed:
            return fixed[name]
        return system_resolver(name)

    p = load_policy(policy_ref)
    d = decide(Request(url, method.upper()), p, resolver)
    emit({"allowed": d.allowed, "reason": d.reason, "rule": d.rule, "addresses": list(d.addresses)})
    sys.exit(0 if d.allowed else 1)


# the other commands live in modules of their own, imported when one of their commands is asked
# for (or for --help): `toolcage run` pays for its own module only
cli.lazy_commands.update(
    run="toolcage.cli.run",  # run
    image="toolcage.cli.image",  # image build
    mcp="toolcage.cli.mcp",  # mcp serve, mcp wrap
    rm="toolcage.cli.rm",  # rm RUN: one run and everything of it
    daemon="toolcage.cli.daemon",  # daemon start, stop, status
    **dict.fromkeys(("audit", "ps", "gc", "doctor"), "toolcage.cli.ops"),
)


def main(prog_name: str | None = None) -> None:
    """The command's own process. ``prog_name``: how the command was typed, for usage messages (click works
    it out from this process when None; the daemon passes its client's)."""
    startup.Command.own_process = True
    # no collections while the command imports (about 10 ms of them): what it imports lives as long
    # as the process; each command turns the collector back on (`run` once it has imported what it needs)
    gc.disable()
    startup.structlog_without_rich()
    signal.signal(signal.SIGTERM, startup.on_signal)
    signal.signal(signal.SIGINT, startup.on_signal)
    try:
        try:
            cli(prog_name=prog_name)
        except KeyboardInterrupt:
            say("interrupted; the sandbox was removed")
            sys.exit(130)
    except SystemExit as exc:
        startup.exit_now(exc.code)


if __name__ == "__main__":
    main()


__all__ = ["cli", "main"]
