"""The ``toolcage`` command (click): run, serve, tools, policy test (here), image build
(``toolcage.cli.image``) and the operator commands audit, ps, gc, doctor (``toolcage.cli.ops``).

How it talks is decided once, in ``toolcage.cli.output``: results on stdout (JSON with ``--json``,
always JSON for run, policy test and image build), diagnostics as escaped plain text on
stderr, every error translated in one place into that output and its exit code: 0 ok, 1 the
tool reported an error, 2 usage or policy error, 3 sandbox failure (timeout, memory, crash, Docker).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import signal
import sys
from typing import Any

import click

from toolcage.cli import policy_flags
from toolcage.cli.output import CallOutput, ToolcageGroup, emit, say, use_json, warn
from toolcage.errors import ToolcageError, UsageError
from toolcage.policies import Policy, codes, contract
from toolcage.textsafe import dumps, escape


def _on_signal(signum: int, frame: Any) -> None:
    # unwinds through `with Sandbox`, so the container is removed before the process exits
    signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the clean-up
    from toolcage.lifecycle import removal

    removal.stop_helper()  # interrupted, the container is removed before the process exits
    say(f"{signal.Signals(signum).name}: removing the sandbox")
    raise SystemExit(128 + signum)


def _parse_params(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    text = sys.stdin.read() if raw == "-" else raw
    try:
        params = json.loads(text) if text.strip() else None
    except ValueError as exc:
        raise UsageError(f"--params is not valid JSON: {exc}") from None
    if params is not None and not isinstance(params, dict):
        raise UsageError('--params must be a JSON object, e.g. \'{"code": "print(1)"}\'')
    return params


def _prepared_call(tool: str, raw: str | None, opts: dict[str, Any]) -> dict[str, Any] | None:
    """Everything `run` can check before a container starts: params JSON, policy, --timeout,
    the tool and its params (host-side, toolcage.precheck). Loads the policy once into opts.
    (A child's timeout is cut to the time left in the run by the sandbox, for every door: toolcage.timing.)"""
    from toolcage.precheck import check_call

    params = _parse_params(raw)
    _policy(opts)
    check_call(tool, params, opts["image"], connectors=bool(opts.get("tools")))
    return params


def _policy(opts: dict[str, Any]) -> Policy:
    """The run's policy: --policy, the policy flags set over it (--memory, --allow-host, ...: one overlay
    the policy model validates, toolcage.cli.policy_flags), then --timeout; warns when --timeout asks
    for more than that policy allows."""
    from toolcage.options import resolve_policy
    from toolcage.policies import load_policy

    if isinstance(opts["policy"], Policy):
        return opts["policy"]
    base = policy_flags.apply(load_policy(opts["policy"]), opts)
    timeout = opts["timeout"]
    if timeout is not None and timeout > base.timeouts.run_s:
        warn(f"--timeout {timeout:g}s is more than the policy's run deadline; using {base.timeouts.run_s:g}s")
    pol = resolve_policy(base, timeout)
    opts["policy"] = pol
    return pol


def sandbox_options(f: Any = None, *, without: tuple[str, ...] = ()) -> Any:
    """The options every sandboxed command shares; ``without`` leaves some out, by parameter name
    (``toolcage mcp wrap`` has no connectors and an --image of its own)."""
    if f is None:
        return lambda g: sandbox_options(g, without=without)
    opts = [
        click.option(
            "--sandbox",
            "sandbox",
            type=click.Choice(["container", "gvisor", "auto", "none"]),
            default="container",
            envvar=contract.ENV_SANDBOX,
            show_default=True,
            help="'gvisor': a container under gVisor's runsc; 'auto': the strongest the engine has (gvisor, "
            "then container); 'none' runs the worker as a local process: NO isolation, development only.",
        ),
        click.option(
            "--policy",
            default="default",
            show_default=True,
            shell_complete=policy_flags.complete_policy,
            help="Bundled policy name or a policy file path.",
        ),
        *policy_flags.policy_options(),
        click.option(
            "--workspace",
            type=click.Path(),  # checked by toolcage.workspace, so every workspace problem is reason "workspace"
            default=None,
            help="Directory mounted read-only at /workspace (default: none mounted).",
        ),
        click.option(
            "--timeout",
            type=float,
            default=None,
            help="Run deadline in seconds; can only tighten the policy's timeouts.run_s.",
        ),
        click.option("--keep", is_flag=True, help="Leave the container after the run, for debugging."),
        click.option(
            "--image", default=None, help="Worker image (default toolcage-worker:<version>, or $TOOLCAGE_IMAGE)."
        ),
        click.option("-v", "--verbose", count=True, help="Log run events on stderr (-vv for debug)."),
        click.option(
            "--egress-network",
            default=None,
            help="Docker network for the egress proxy's outbound side (network.mode: proxy; "
            "default: a per-run bridge).",
        ),
        click.option(
            "--ca-file",
            type=click.Path(dir_okay=False),
            default=None,
            help="Extra CA bundle (PEM) that SafeFetch trusts, e.g. a corporate CA.",
        ),
        click.option(
            "--audit-log",
            type=click.Path(dir_okay=False),
            default=None,
            help="Audit log file (default $TOOLCAGE_AUDIT_LOG or ~/.local/state/toolcage/audit.jsonl).",
        ),
        click.option(
            "--egress-proxy",
            default=None,
            help="Upstream HTTP proxy for allowed traffic (default $TOOLCAGE_EGRESS_PROXY).",
        ),
        click.option(
            "--tools",
            "tools",
            multiple=True,
            type=click.Path(),
            help="Connector source: a .py file, a folder of them or a package folder (repeatable); mounted read-only.",
        ),
        click.option(
            "--secret",
            "secret",
            multiple=True,
            metavar="NAME=env:VAR|NAME=file:PATH",
            help="A secret the policy binds (repeatable); the sandboxed code never reads it.",
        ),
    ]
    for opt in reversed(opts):
        probe: Any = opt(lambda: None)  # the option's parameter name, read off what click attached
        if probe.__click_params__[0].name not in without:
            f = opt(f)
    return f


@click.group(cls=ToolcageGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="toolcage")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """toolcage: run tool handlers you did not write in a hardened, per-run Docker sandbox."""
    from toolcage import logs

    logs.configure(0, json_logs=False)  # warnings as `toolcage: warning: …` (a command's -v reconfigures)
    if ctx.invoked_subcommand != "run":
        gc.enable()  # main() turned it off; `run` turns it back on once it has what it imports


def _run_options(tool: str, opts: dict[str, Any]) -> dict[str, Any]:
    """The shared options as the keyword options Sandbox and Pool take (toolcage.options resolves them),
    mapped once; logging is configured first."""
    from toolcage import logs

    logs.configure(opts["verbose"], json_logs=False)  # stderr is for people: plain, escaped text
    return {
        "tool": tool,
        "workspace": opts["workspace"],
        "tools": opts["tools"],
        "sandbox": opts["sandbox"],
        "image": opts["image"],
        "run_timeout": None,  # applied by _policy, with its warning
        "egress_network": opts["egress_network"],
        "egress_proxy": opts["egress_proxy"],
        "ca_file": opts["ca_file"],
        "audit": opts["audit_log"],
    }


def _sandbox(tool: str, opts: dict[str, Any], **more: Any) -> Any:
    """The Sandbox the shared options describe (``more``: a command's own, e.g. ``run``'s workspace mode)."""
    from toolcage.connectors import parse_secret_options
    from toolcage.sandbox import Sandbox

    kwargs = _run_options(tool, opts)
    return Sandbox(_policy(opts), keep=opts["keep"], secrets=parse_secret_options(opts["secret"]), **kwargs, **more)


def _pool(tool: str, opts: dict[str, Any], size: int) -> Any:
    """A warm pool for the life of this process (``--pool N``), described by the shared options; and
    how to make a sandbox that adopts one of its slots (with this process's secrets)."""
    from toolcage.connectors import parse_secret_options
    from toolcage.pool import Pool
    from toolcage.sandbox import Sandbox

    kwargs = _run_options(tool, opts)
    if opts["keep"]:
        raise UsageError("--keep cannot be used with --pool: a pooled container is always removed after its run")
    secrets = parse_secret_options(opts["secret"])
    pool = Pool(_policy(opts), size=size, **kwargs)
    return pool, lambda: Sandbox(pool=pool, secrets=secrets)


def pool_option(f: Any) -> Any:
    return click.option(
        "--pool",
        "pool_size",
        type=click.IntRange(min=1),
        default=None,
        metavar="N",
        help="Keep N sandboxes pre-started for the life of this process; each serves one run, then is removed.",
    )(f)


def dry_run_option(f: Any) -> Any:
    return click.option(
        "--dry-run",
        is_flag=True,
        help="Check the tool, its params and the policy, print the effective policy (after the flags) as JSON "
        "and exit 0; nothing starts.",
    )(f)


def _dry_run(tool: str, opts: dict[str, Any], params: dict[str, Any] | None = None) -> None:
    """What a run would be made of, as one JSON document on stdout: the checked policy (after --policy,
    the policy flags and --timeout), its sha256, and the sandbox, image and tool asked for."""
    from toolcage.options import worker_image
    from toolcage.policies.typed import to_dict

    pol = _policy(opts)
    out: dict[str, Any] = {"dry_run": True, "tool": tool}
    if params is not None:
        out["params"] = params
    out.update(
        sandbox=opts["sandbox"],
        image=worker_image(opts["image"]),
        policy_sha256=pol.sha256(),
        policy=to_dict(pol),
    )
    emit(out)


@cli.command()
@click.argument("tool", shell_complete=policy_flags.complete_tool)
@click.option("--params", default=None, help="Tool params as a JSON object, or '-' to read it from stdin.")
@click.option(
    "--download",
    "downloads",
    multiple=True,
    metavar="REMOTE:LOCAL",
    help="After the call, copy REMOTE (a file or directory under /scratch or /workspace) into the local "
    "directory LOCAL (made if missing), checked as hostile. Repeatable.",
)
@click.option(
    "--upload",
    "uploads",
    multiple=True,
    metavar="LOCAL:REMOTE",
    help="Before the call, copy the local file or directory LOCAL into the directory REMOTE under /scratch "
    "(made if missing). Repeatable.",
)
@click.option(
    "--workspace-mode",
    type=click.Choice(["ro", "copy"]),
    default="ro",
    show_default=True,
    help="ro: --workspace is mounted read-only; copy: /workspace is a writable copy of it (limits.workspace_copy), "
    "the host's directory never touched.",
)
@click.option(
    "--workspace-gitignore",
    is_flag=True,
    help="With --workspace-mode copy: leave out of the copy what the workspace's .gitignore files ignore, and .git.",
)
@click.option(
    "--diff",
    "diff_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --workspace-mode copy: after the call, write what it changed as git's diff to this file "
    "(`git apply` takes it in the workspace); the JSON result gains changes (added, changed, removed).",
)
@click.option(
    "--snapshot",
    "snapshot_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="After the call, write the session (/scratch, and the workspace copy) to this snapshot archive.",
)
@click.option(
    "--resume",
    "resume_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Start from this snapshot (checked first; a changed one is refused): its files, in a fresh sandbox.",
)
@click.option(
    "--stream/--no-stream",
    "stream",
    default=None,
    help="Show the call's output on stderr as it comes (stdout keeps the one JSON result); "
    "default: when stderr is a terminal.",
)
@sandbox_options
@dry_run_option
def run(
    tool: str,
    params: str | None,
    dry_run: bool,
    stream: bool | None,
    downloads: tuple[str, ...],
    uploads: tuple[str, ...],
    workspace_mode: str,
    workspace_gitignore: bool,
    diff_file: str | None,
    snapshot_file: str | None,
    resume_file: str | None,
    **opts: Any,
) -> None:
    """Run one TOOL call in a fresh sandbox and print the result as JSON.

    Example: toolcage run run_python --params '{"code": "print(2+2)"}'

    One-off limits without a policy file: toolcage run http_fetch --allow-host api.github.com --memory 256m
    --run-s 120 --params '{"url": "https://api.github.com/zen"}' (add --dry-run to see the policy that makes).
    """
    use_json(True)
    pairs = [_download_pair(d) for d in downloads]
    sends = [_upload_pair(u) for u in uploads]
    parsed = _prepared_call(tool, params, opts)
    if dry_run:
        _dry_run(tool, opts, parsed)
        return
    if _Command.own_process and opts["sandbox"] != "none" and not opts["keep"]:
        from toolcage.lifecycle import removal

        removal.start_helper()  # the container is removed after this process exits, not before
    if diff_file is not None and workspace_mode != "copy" and resume_file is None:
        raise UsageError("--diff needs --workspace-mode copy: a read-only workspace cannot change")
    for flag, path in (("--diff", diff_file), ("--snapshot", snapshot_file)):
        if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise UsageError(f"{flag}: the directory of {escape(path)!r} does not exist")  # before the run, not after
    sb = _sandbox(
        tool, opts, workspace_mode=workspace_mode, workspace_gitignore=workspace_gitignore, resume=resume_file
    )
    _collect_from_here()
    changes = snap = None
    shown = CallOutput(show=sys.stderr.isatty() if stream is None else stream, is_output=_output_streams(tool))
    try:
        with sb:
            if opts["tools"]:
                from toolcage.precheck import check_connector

                check_connector(tool, sb.connector_tools)
            sent = [_send(sb, local, remote) for local, remote in sends]  # a failed upload stops the run
            try:
                res = sb.call(tool, parsed, on_progress=shown if shown.wanted else None)
            finally:
                shown.end()
            fetched = [_fetch(sb, remote, local) for remote, local in pairs]  # before the sandbox goes
            if diff_file is not None:
                changes = sb.changes()
                with open(diff_file, "w", encoding="utf-8") as f:
                    f.write(changes.diff)
            if snapshot_file is not None:
                snap = sb.snapshot(snapshot_file)
    except (KeyboardInterrupt, SystemExit):
        # SIGINT/SIGTERM mid-run: the sandbox is gone (status interrupted); say so on stdout, then exit
        # with the signal's code (130 SIGINT, 143 SIGTERM), which main() and the signal handler choose
        # with what the call printed so far (streamed by the worker as it came), as a timeout keeps it
        if sb.summary is not None and sb.summary.status == "interrupted":
            out = {"status": "interrupted", "tool": tool, "name": sb.name, "run_id": sb.run_id}
            out["run_wall_ms"] = sb.summary.wall_ms
            if shown.is_output:
                out["output"] = shown.text
            emit(out)
        raise
    summary = sb.summary
    out = res.to_dict()
    out["name"] = sb.name
    if summary is not None:
        out.update(run_wall_ms=summary.wall_ms, cpu_ms=summary.cpu_ms, peak_memory_bytes=summary.peak_memory_bytes)
    if sent:
        out["uploads"] = sent
    if fetched:
        out["downloads"] = [d for d, _ in fetched]
    if changes is not None:
        out["changes"] = {**changes.to_dict(), "diff_file": os.path.abspath(str(diff_file))}
    if snap is not None:
        out["snapshot"] = snap.to_dict()
    emit(out)
    if res.error and res.error.get("code") in codes.USAGE_CODES:
        message, data = str(res.error.get("message")), res.error.get("data")
        # the worker's -32601 names the method (data) in its message when it names the closest tools too
        named = data is None or (isinstance(data, str) and repr(data) in message)
        say(message if named else f"{message}: {dumps(data)}")
        sys.exit(2)
    failed = [code for _, code in fetched if code]
    if failed and res.exit_code == 0:
        sys.exit(max(failed))  # the call went well, a download did not: its error's code (2 bad input, 3 refused)
    sys.exit(res.exit_code)  # the status's own (toolcage.results.Status)


def _output_streams(tool: str) -> bool:
    """Whether the call's progress is its output: a built-in tool that runs code (run_python, run_shell,
    run_node, exec) streams what it prints; a connector's progress is its own reports."""
    from toolcage.worker.tools import BUILTIN, Catalog

    return tool in BUILTIN and Catalog().get(tool).runs_code


def _download_pair(spec: str) -> tuple[str, str]:
    """``--download REMOTE:LOCAL``, split at its first colon (a sandbox path has none to spare)."""
    remote, sep, local = spec.partition(":")
    if not sep or not remote or not local:
        raise UsageError(f"--download takes REMOTE:LOCAL, e.g. /scratch/out:./out (got {escape(spec)!r})")
    return remote, local


def _upload_pair(spec: str) -> tuple[str, str]:
    """``--upload LOCAL:REMOTE``, split at its last colon (a sandbox path has none to spare)."""
    local, sep, remote = spec.rpartition(":")
    if not sep or not remote or not local:
        raise UsageError(f"--upload takes LOCAL:REMOTE, e.g. ./in:/scratch/in (got {escape(spec)!r})")
    if not os.path.lexists(local):
        raise UsageError(f"--upload: no such local file or directory: {escape(local)!r}")
    return local, remote


def _send(sb: Any, local: str, remote: str) -> dict[str, Any]:
    """One ``--upload``: what it wrote (its error propagates: the call does not run without its input)."""
    got = sb.upload(local, remote)
    return {"local": local, **dataclasses.asdict(got)}


def _fetch(sb: Any, remote: str, local: str) -> tuple[dict[str, Any], int]:
    """One ``--download``: what it wrote, or its error (said on stderr too), and that error's exit code."""
    try:
        got = sb.download(remote, local)
    except ToolcageError as exc:
        say(exc.message)
        return {"remote": remote, "local": local, "error": exc.to_dict()}, exc.exit_code
    info = {k: v for k, v in dataclasses.asdict(got).items() if k != "local_dir"}
    return {"remote": remote, "local": got.local_dir, **info}, 0


@cli.command()
@sandbox_options
@click.option(
    "--tool-label", default="serve", show_default=True, help="Tool name used in the container name and labels."
)
@pool_option
@dry_run_option
def serve(tool_label: str, pool_size: int | None, dry_run: bool, **opts: Any) -> None:
    """Bridge JSON-RPC on this process's stdin/stdout into one sandboxed run.

    Send newline-delimited JSON-RPC 2.0 requests on stdin; responses come back on stdout.
    The run ends at stdin EOF or at the policy's run deadline. With --pool N, every request
    runs in a fresh sandbox of its own, adopted from N kept pre-started (up to N at once).
    """
    from toolcage.servers.serve import bridge

    if dry_run:
        use_json(True)  # the result is one JSON document, as `run --dry-run`'s
        _dry_run(tool_label, opts)
        return
    use_json(False)  # stdout is the JSON-RPC stream: errors go to stderr only
    if pool_size is not None:
        from toolcage.servers.serve_pool import bridge_fresh

        pool, make_sandbox = _pool(tool_label, opts, pool_size)
        with pool:
            bridge_fresh(make_sandbox, sys.stdin.buffer, sys.stdout.buffer, workers=pool_size)
        return
    with _sandbox(tool_label, opts) as sb:
        bridge(sb, sys.stdin.buffer, sys.stdout.buffer)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print names, descriptions and params JSON schemas.")
@sandbox_options
def tools(as_json: bool, **opts: Any) -> None:
    """List the tools: the built-in ones, and with --tools the connectors too (read in a sandbox,
    since their code is never imported on the host)."""
    from toolcage.worker.tools import Catalog

    use_json(as_json)
    if opts["tools"]:
        if not opts["secret"]:
            # listing calls no handler: a policy's secrets are not needed to read the connectors' tools
            opts["policy"] = dataclasses.replace(_policy(opts), secrets={})
        with _sandbox("tools", opts) as sb:
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
# for (or for --help): `toolcage run` does not pay for them
cli.lazy_commands.update(
    image="toolcage.cli.image",  # image build
    mcp="toolcage.cli.mcp",  # mcp serve, mcp wrap
    **dict.fromkeys(("audit", "ps", "gc", "doctor"), "toolcage.cli.ops"),
)


def _structlog_without_rich() -> None:
    """The command only (never the library, whose host application may want it): structlog's dev
    module imports rich, when installed, for pretty tracebacks that toolcage never renders (it
    prints exceptions as plain escaped text). Loading structlog without it saves about 50 ms on
    every run; rich stays importable for the tables of `ps` and `audit`."""
    if "structlog" in sys.modules or "rich" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]  # import rich -> ImportError, for structlog.dev only
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]


class _Command:
    # set by main(): this process is the command itself, not a test or a program calling cli(), so
    # what is process-wide (the garbage collector, a forked helper) is the command's to decide
    own_process = False


def _collect_from_here() -> None:
    """The garbage collector back on (main() turned it off), for the objects made from now on only:
    what the command imported lives as long as the process, and without this every collection,
    the last at exit (about 35 ms) among them, walks it all again."""
    if _Command.own_process and not gc.isenabled():
        gc.freeze()
        gc.enable()


def main() -> None:
    _Command.own_process = True
    # no collections while the command imports (about 10 ms of them): what it imports lives as long
    # as the process; each command turns the collector back on (`run` once it has imported what it needs)
    gc.disable()
    _structlog_without_rich()
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        try:
            cli()
        except KeyboardInterrupt:
            say("interrupted; the sandbox was removed")
            sys.exit(130)
    except SystemExit as exc:
        _exit_now(exc.code)


def _exit_now(code: Any) -> None:
    """End the command without the interpreter's tear-down (about 30 ms of freeing everything it
    imported, on every run: issue 27). What must happen at exit happens first, in the interpreter's
    order: other threads' work (every non-daemon thread joined), the atexit hooks (pending
    removals, the audit writer's flush, logging's shutdown, weakref finalizers), stdout and stderr
    flushed. Only the command's own process does this (``main``), never a program calling ``cli()``."""
    import atexit
    import threading

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xFF
    else:  # SystemExit("message"): printed and 1, as the interpreter does
        print(code, file=sys.stderr)
        status = 1
    try:
        for t in threading.enumerate():
            if t is not threading.main_thread() and not t.daemon:
                t.join()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                status = status or 120  # as the interpreter exits when it cannot flush stdout
        os._exit(status)


if __name__ == "__main__":
    main()


__all__ = ["cli", "main"]
