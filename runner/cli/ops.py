"""The operator commands: audit, ps, gc, doctor (what you run to watch and clean up toolcage).

Split from ``toolcage.cli.main`` to keep each module to one purpose; output and errors follow the
one convention in ``toolcage.cli.output`` (results on stdout, ``--json`` for programs, escaped
diagnostics on stderr).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from toolcage.cli.output import emit, say, use_json
from toolcage.errors import NotFound, UsageError
from toolcage.textsafe import dumps, escape

_SINCE = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _parse_since(text: str) -> float:
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if not m:
        raise UsageError(f"--since wants a duration like 30s, 10m, 2h or 1d, not {text!r}")
    return float(m.group(1)) * _SINCE[m.group(2)]


def _audit_line(rec: dict[str, Any]) -> str:
    """One audit record for people: every field escaped (egress targets, methods and reasons
    come from inside the sandbox)."""
    skip = {"ts", "event", "run_id", "hash", "prev", "seq"}
    rest = " ".join(f"{escape(k)}={escape(v)}" for k, v in sorted(rec.items()) if k not in skip and v is not None)
    ts, run_id, event = (escape(rec.get(k, d)) for k, d in (("ts", "?"), ("run_id", "-"), ("event", "?")))
    return f"{ts[:23]}  {run_id:<8}  {event:<16} {rest}"


@click.command()
@click.option("--run", "run_id", default=None, help="Only this run id.")
@click.option("--since", default=None, help="Only the last DURATION (30s, 10m, 2h, 1d).")
@click.option("--json", "as_json", is_flag=True, help="Print records as JSON lines.")
@click.option("--verify", is_flag=True, help="Check the hash chain; exit 1 if a line was edited, dropped or moved.")
@click.option("--audit-log", type=click.Path(dir_okay=False), default=None, help="Audit log file.")
@click.option(
    "--ray", "ray_address", default=None, metavar="ADDRESS",
    help="Every node of this Ray cluster (toolcage.ray): each node's log, its chain checked there.",
)  # fmt: skip
@click.option("--limit", default=200, show_default=True, help="With --ray: at most this many records per node.")
def audit(
    run_id: str | None, since: str | None, as_json: bool, verify: bool, audit_log: str | None,
    ray_address: str | None, limit: int,
) -> None:  # fmt: skip
    """Read the audit log: what ran, with which policy, what it did, how it ended."""
    from datetime import datetime
    from pathlib import Path

    from toolcage.lifecycle import audit as audit_mod

    use_json(as_json)
    if ray_address is not None:
        if since is not None or audit_log is not None:  # each node reads its own log, all of it
            raise UsageError("audit --ray takes --run, --limit, --json and --verify, not --since or --audit-log")
        _cluster_audit(ray_address, run_id, limit, verify, as_json)
        return
    path = Path(audit_log).expanduser() if audit_log else audit_mod.default_path()
    if verify:
        problems = audit_mod.verify(path)
        n = 0 if problems else sum(1 for _ in audit_mod.read(path))
        if as_json:
            emit({"path": str(path), "intact": not problems, "problems": problems, "records": n})
        for p in problems:
            say(f"audit: {p}")
        if problems:
            sys.exit(1)
        if not as_json:
            click.echo(f"{escape(path)}: intact, {n} records")
        return
    if not path.exists():
        raise UsageError(f"no audit log at {path}")
    cutoff = time.time() - _parse_since(since) if since else None
    shown = 0
    for rec in audit_mod.read(path):
        if run_id and rec.get("run_id") != run_id:
            continue
        if cutoff is not None:
            try:
                if datetime.fromisoformat(str(rec.get("ts", "")).replace("Z", "+00:00")).timestamp() < cutoff:
                    continue
            except ValueError:
                continue
        shown += 1
        click.echo(dumps(rec, sort_keys=True) if as_json else _audit_line(rec))
    if run_id and not shown:
        window = f" in the last {since}" if since else ""
        raise NotFound(f"no records of run {run_id!r}{window} in {path}", run_id=run_id)


def _ray_connect(address: str) -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray: pip install 'toolcage[ray]'") from None
    import logging
    import socket

    host, sep, port = address.rpartition(":")
    if sep and port.isdigit() and host:  # Ray's init retries an unreachable GCS for minutes: ask once first
        try:
            socket.create_connection((host, int(port)), timeout=3).close()
        except OSError as exc:
            raise UsageError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}") from None
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    except Exception as exc:  # Ray's own errors: no cluster there, refused
        raise UsageError(f"cannot reach the Ray cluster at {address}: {exc}") from None
    return ray


def _cluster_audit(address: str, run_id: str | None, limit: int, verify: bool, as_json: bool) -> None:
    """Each node's audit log through its engine agent; exit 1 if a node's chain does not verify."""
    _ray_connect(address)
    from toolcage.ray import cluster_audit

    logs = cluster_audit(run_id=run_id, limit=limit, verify=verify)
    if not logs:
        raise NotFound(
            f"no toolcage engine agent in the Ray cluster at {address} (agents live while a Cluster is used)"
        )
    broken = False
    for log in logs:
        problems = log.get("problems") or []
        broken = broken or bool(problems) or "error" in log
        if as_json:
            click.echo(
                dumps(
                    {k: log.get(k) for k in ("node", "path", "problems", "error")}
                    | {"records": len(log.get("records", []))}
                )
            )
            continue
        node = escape(str(log.get("node", "?"))[:12])
        if "error" in log:
            say(f"node {node}: no answer: {escape(log['error'])}")
            continue
        state = "intact" if verify and not problems else ("NOT intact" if verify else "not checked")
        click.echo(f"== node {node} {escape(log['path'])}: {state}, {len(log['records'])} records shown")
        for p in problems:
            say(f"audit: node {node}: {p}")
        for rec in log["records"]:
            click.echo(f"{node}  {_audit_line(rec)}")
    if broken:
        sys.exit(1)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON (age_s in seconds, memory_bytes in bytes).")
@click.option(
    "--ray", "ray_address", default=None, metavar="ADDRESS", help="Every node of this Ray cluster (toolcage.ray)."
)
def ps(as_json: bool, ray_address: str | None) -> None:
    """Live runs (from Docker labels): name, tool, policy, image, age, memory."""
    from toolcage.engine.docker_adapter import Engine
    from toolcage.ops.views import format_age, live_runs

    use_json(as_json)
    if ray_address is not None:
        _ray_connect(ray_address)
        from toolcage.ray import cluster_ps

        rows = cluster_ps()
    else:
        rows = live_runs(Engine.default())
    if as_json:
        emit(rows)
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    cluster = ray_address is not None
    heads = ("NAME", "TOOL", "POLICY", "IMAGE", "AGE", "MEMORY", "OWNER")
    table = Table(*(("NODE",) if cluster else ()), *heads, box=None)
    for r in rows:
        mem = f"{r['memory_bytes'] / 2**20:.1f} MiB" if r["memory_bytes"] else "-"
        # Text, not str: a label like "[red]x" is shown, not read as rich markup
        cells = (
            *((str(r["node"])[:12],) if cluster else ()),
            r["name"],
            r["tool"],
            r["policy"],
            r.get("image"),  # (a node of an older release gives none)
            format_age(r["age_s"]),
            mem,
            r["owner"],
        )
        table.add_row(*(Text(escape("-" if c is None else c)) for c in cells))
    Console().print(table)
    if not rows:
        say("no live runs")


@click.command()
@click.option("--dry-run", is_flag=True, help="List what would be removed.")
@click.option("--kept", is_flag=True, help="Also remove what runs started with --keep left (only ever on request).")
@click.option(
    "--copies", is_flag=True, help="Also remove every cached workspace copy no run uses (--workspace-cache keeps them)."
)
@click.option("--json", "as_json", is_flag=True, help="Print what was (or would be) removed and kept, as JSON.")
def gc(dry_run: bool, kept: bool, copies: bool, as_json: bool) -> None:
    """Remove toolcage containers, networks and volumes whose owner is gone or whose deadline passed.

    Also the volumes sharing an image's files between its sandboxes, once the engine no longer has the image,
    and workspace copies whose cache fill did not finish (every cached copy with --copies).

    What a run started with --keep left is listed but removed only with --kept.
    """
    from toolcage.engine import sharedfiles
    from toolcage.engine.docker_adapter import Engine
    from toolcage.lifecycle.reaper import find_orphans, remove, shared_files_orphans

    use_json(as_json)
    engine = Engine.default()
    found = find_orphans(engine, include_kept=True) + shared_files_orphans(engine, copies=copies)
    doomed = [o for o in found if kept or not o.kept]
    left = [o for o in found if o.kept and not kept]
    if not dry_run:
        from toolcage.lifecycle import audit as audit_mod

        remove(engine, doomed, audit_mod.shared())
        sharedfiles.forget()
        from toolcage.engine import runtime

        runtime.forget()
    if as_json:
        emit(
            {
                "dry_run": dry_run,
                "removed" if not dry_run else "would_remove": [o.__dict__ for o in doomed],
                "kept": [o.__dict__ for o in left],
            }
        )
        return
    verb = "would remove" if dry_run else "removed"
    for o in doomed:
        click.echo(f"{verb} {o.kind} {escape(o.name)} (run {escape(o.run_id)}): {escape(o.reason)}")
    for o in left:
        click.echo(
            f"kept {o.kind} {escape(o.name)} (run {escape(o.run_id)}): started with --keep; gc --kept removes it"
        )
    if not found:
        say("nothing to collect")


def register(group: click.Group) -> None:
    from toolcage.cli.doctor import doctor

    for cmd in (audit, ps, gc, doctor):
        group.add_command(cmd)


__all__ = ["register"]
