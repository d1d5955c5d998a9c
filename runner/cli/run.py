"""``toolcage run``: one tool call in a fresh sandbox, its result as one JSON document on stdout; and
what it moves around the call (--upload, --download, --diff, --snapshot). Loaded when ``run`` is asked
for (``toolcage.cli.main`` lists it among its lazy commands)."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

import click

from toolcage.cli import options, policy_flags, startup
from toolcage.cli.output import CallOutput, emit, say, use_json
from toolcage.errors import SandboxError, ToolcageError, UsageError
from toolcage.policies import codes
from toolcage.textsafe import dumps, escape


@click.command()
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
    "--workspace-cache",
    is_flag=True,
    help="With --workspace-mode copy: lay the copy over a tree the engine keeps, made by the first run of this tree "
    "(later runs of the same tree start in milliseconds; a tree changed since is copied anew). "
    "`toolcage gc --copies` removes the kept trees.",
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
@click.option(
    "--expose",
    "expose",
    multiple=True,
    type=click.IntRange(1, 65535),
    metavar="PORT",
    help="Reach the sandbox's TCP PORT from the host while the call runs: a listener on 127.0.0.1 (a free port, "
    "said on stderr) relays each connection into the sandbox, which keeps no network. Repeatable.",
)
@options.sandbox_options
@options.dry_run_option
def run(
    tool: str,
    params: str | None,
    dry_run: bool,
    stream: bool | None,
    downloads: tuple[str, ...],
    uploads: tuple[str, ...],
    workspace_mode: str,
    workspace_gitignore: bool,
    workspace_cache: bool,
    diff_file: str | None,
    snapshot_file: str | None,
    resume_file: str | None,
    expose: tuple[int, ...],
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
    parsed = options.prepared_call(tool, params, opts)
    if dry_run:
        options.dry_run(tool, opts, parsed)
        return
    if startup.Command.own_process and opts["sandbox"] != "none" and not opts["keep"]:
        from toolcage.lifecycle import removal

        removal.start_helper()  # the container is removed after this process exits, not before
    if diff_file is not None and workspace_mode != "copy" and resume_file is None:
        raise UsageError("--diff needs --workspace-mode copy: a read-only workspace cannot change")
    for flag, path in (("--diff", diff_file), ("--snapshot", snapshot_file)):
        if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise UsageError(f"{flag}: the directory of {escape(path)!r} does not exist")  # before the run, not after
    sb = options.sandbox(
        tool, opts, workspace_mode=workspace_mode, workspace_gitignore=workspace_gitignore, resume=resume_file,
        workspace_cache=workspace_cache,
    )  # fmt: skip
    startup.collect_from_here()
    changes = snap = None
    shown = CallOutput(
        show=sys.stderr.isatty() if stream is None else stream,
        is_output=_output_streams(tool),
        keep=2 * sb.policy.limits.output_cap,  # what a finished call's stdout and stderr may hold
    )
    try:
        with sb:
            if opts["tools"]:
                from toolcage.precheck import check_connector

                check_connector(tool, sb.connector_tools)
            sent = [_send(sb, local, remote) for local, remote in sends]  # a failed upload stops the run
            for port in expose:  # listening before the call starts: its server is reachable as soon as it is up
                say(f"exposed sandbox port {port} at {sb.expose(port).url()}")
            try:
                res = sb.call(tool, parsed, on_progress=shown if shown.wanted else None)
            except SandboxError as exc:
                # the sandbox ended mid-call (the run's deadline before the worker's own timed-out answer, the
                # memory limit, a crash): what the call printed so far, as it streamed, is not lost either
                if shown.text:
                    exc.details.update(shown.kept())
                raise
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
            out.update(shown.kept())
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


def register(group: click.Group) -> None:
    group.add_command(run)


__all__ = ["register", "run"]
