"""``toolcage rm RUN``: remove one run and everything of it (toolcage.lifecycle.discard).

A module of its own, registered with the other commands (``toolcage.cli.main``); output and errors follow
``toolcage.cli.output``: what was removed on stdout (``--json`` for programs), a refusal as one stderr line.
"""

from __future__ import annotations

import click

from toolcage.cli.output import emit, say, use_json
from toolcage.errors import UsageError
from toolcage.textsafe import escape


@click.command("rm")
@click.argument("run", metavar="RUN")
@click.option("--dry-run", is_flag=True, help="List what would be removed.")
@click.option("--json", "as_json", is_flag=True, help="Print what was (or would be) removed, as JSON.")
def rm(run: str, dry_run: bool, as_json: bool) -> None:
    """Remove one run and everything of it: its container, its egress proxy and network, its volumes.

    RUN is a run id (as `toolcage ps`, `gc --dry-run` and the audit log show it) or the name of one of its
    containers. For a run started with --keep, after `docker inspect`/`docker logs`, or after `docker rm`
    left its volumes. Refused for a run whose owner process still lives, or was started in another PID
    namespace or on another machine before its deadline (the judgement `gc` makes).
    """
    from toolcage.engine.docker_adapter import Engine
    from toolcage.lifecycle.discard import discard, find_run

    use_json(as_json)
    engine = Engine.default()
    found = find_run(engine, run)
    if found.refusal is not None:
        raise UsageError(f"rm: {found.refusal}", run_id=found.run_id)
    if not dry_run:
        from toolcage.lifecycle import audit as audit_mod

        discard(engine, found, audit_mod.shared())
    if as_json:
        emit({"run_id": found.run_id, "dry_run": dry_run, "would_remove" if dry_run else "removed": [
            o.__dict__ for o in found.objects
        ]})  # fmt: skip
        return
    verb = "would remove" if dry_run else "removed"
    for o in found.objects:
        click.echo(f"{verb} {o.kind} {escape(o.name)} (run {escape(o.run_id)})")
    say(f"run {found.run_id}: {verb} {len(found.objects)} objects")


def register(group: click.Group) -> None:
    group.add_command(rm)


__all__ = ["register"]
