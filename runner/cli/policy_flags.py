"""The policy knobs as flags (``--memory 1g``, ``--allow-host api.example.com``, ...) for one-off runs
without a policy file, and the shell completion of policy and tool names.

The flags do not validate anything themselves: they are the knobs of ``toolcage.policies.overlay`` (the
one builder of "a policy with these hosts, timeouts and limits", shared with the framework adapters), which
extends the named policy through the loader and the policy model like a file would, so the bounds are the
model's; this module only says a refusal in the flags' words. No agent-session defaults here: a one-off run
keeps the policy's timeouts. This module imports only click at start-up (``toolcage run`` is timed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from toolcage.errors import UsageError

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

    from toolcage.policies import Policy

# flag parameter name -> (section, field) of the policy it sets
FIELDS: dict[str, tuple[str, str]] = {
    "memory": ("limits", "memory"),
    "cpus": ("limits", "cpus"),
    "output_cap": ("limits", "output_cap"),
    "scratch": ("limits", "scratch"),
    "workspace_copy": ("limits", "workspace_copy"),
    "run_s": ("timeouts", "run_s"),
    "call_s": ("timeouts", "call_s"),
    "idle_s": ("timeouts", "idle_s"),
}
_SIZES = ("memory", "output_cap", "scratch", "workspace_copy")


def complete_policy(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Bundled policy names and the policy files (*.yaml, *.yml, *.json) of the current directory; a
    path being typed (it has a '/') is left to the shell's file completion."""
    from pathlib import Path

    from click.shell_completion import CompletionItem

    from toolcage.policies import bundled_policy_names

    if "/" in incomplete or incomplete.startswith("~"):
        return [CompletionItem(incomplete, type="file")]
    files = sorted(p.name for p in Path.cwd().iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.is_file())
    names = [*bundled_policy_names(), *files]
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def complete_tool(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The worker's built-in tools (a connector's tools are known only inside a sandbox)."""
    from click.shell_completion import CompletionItem

    from toolcage.worker.tools import BUILTIN

    return [CompletionItem(n) for n in sorted(BUILTIN) if n.startswith(incomplete)]


def policy_options() -> list[Callable[[Any], Any]]:
    """The flags that set one field of the run's policy each, on top of --policy (click decorators)."""
    return [
        click.option(
            "--allow-host",
            "allow_host",
            multiple=True,
            metavar="HOST",
            help="Let the sandbox reach HOST over https (port 443, through the egress proxy; '*.example.com': "
            "its subdomains); repeatable, added to the policy's network.allow. A policy with network "
            "mode none gets mode proxy, allowing only these hosts.",
        ),
        click.option("--memory", metavar="SIZE", default=None, help="limits.memory, e.g. 1g (16m to 64g)."),
        click.option("--scratch", metavar="SIZE", default=None, help="limits.scratch, the /scratch tmpfs, e.g. 1g."),
        click.option(
            "--workspace-copy",
            metavar="SIZE",
            default=None,
            help="limits.workspace_copy, the tmpfs of a --workspace-mode copy, e.g. 1g (counts against --memory).",
        ),
        click.option("--cpus", type=float, default=None, metavar="N", help="limits.cpus, e.g. 0.5 (up to 64)."),
        click.option(
            "--output-cap", metavar="SIZE", default=None, help="limits.output_cap per stream, e.g. 4m (1k to 256m)."
        ),
        click.option(
            "--run-s",
            type=float,
            default=None,
            metavar="S",
            help="timeouts.run_s: the run deadline in seconds (up to 86400); --timeout can only shorten it.",
        ),
        click.option("--call-s", type=float, default=None, metavar="S", help="timeouts.call_s: per-call timeout."),
        click.option(
            "--idle-s", type=float, default=None, metavar="S", help="timeouts.idle_s: end the run after S s idle."
        ),
    ]


def _description(opts: dict[str, Any], base: Policy) -> str:
    """The flags as given (the named policy's description would no longer be true: "No network, ...")."""
    given = [f"--{n.replace('_', '-')} {_shown(opts[n])}" for n in FIELDS if opts.get(n) is not None]
    given += [f"--allow-host {h}" for h in opts.get("allow_host") or ()]
    return f"{base.name} with {' '.join(given)}"


def _bounds(section: str, field: str) -> str:
    """What the policy model declares for a field, for the fix in an error message."""
    import typing

    import annotated_types as at

    from toolcage.policies import model

    cls = {"limits": model.Limits, "timeouts": model.Timeouts}[section]
    metas = typing.get_args(typing.get_type_hints(cls, include_extras=True)[field])[1:]
    lo = next((f"more than {m.gt}" for m in metas if isinstance(m, at.Gt)), None)
    lo = lo or next((f"at least {_human(m.ge, field)}" for m in metas if isinstance(m, at.Ge)), "")
    hi = next((f"at most {_human(m.le, field)}" for m in metas if isinstance(m, at.Le)), "")
    return " and ".join(p for p in (lo, hi) if p)


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _human(n: Any, field: str) -> str:
    if field not in _SIZES:
        return f"{n:g}"
    for unit, size in (("g", 1024**3), ("m", 1024**2), ("k", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def apply(base: Policy, opts: dict[str, Any]) -> Policy:
    """``base`` with the flags' fields set (``policies.overlay``: an overlay that extends it, validated by
    the loader and the policy model; a value out of bounds is a usage error naming the flag and the bounds)."""
    from toolcage.cli.output import say
    from toolcage.policies import PolicyError
    from toolcage.policies.overlay import overlay

    hosts = tuple(opts.get("allow_host") or ())
    knobs = {name: opts[name] for name in FIELDS if opts.get(name) is not None}
    if not knobs and not hosts:
        return base
    try:
        pol = overlay(base, allow_hosts=hosts, description=_description(opts, base), **knobs)
    except PolicyError as exc:
        text = str(exc)
        if exc.details.get("field") == "allow_hosts" and "entry" in exc.details:
            raise UsageError(
                f"--allow-host wants a host name such as api.example.com (https, port 443), not "
                f"{exc.details['entry']!r}; for another scheme, port or the methods, write a policy file with "
                "network.allow (README, Network)"
            ) from None
        for name, (section, field) in FIELDS.items():
            flag = f"--{name.replace('_', '-')} {_shown(opts.get(name))}"
            if opts.get(name) is not None and exc.details.get("field") == name:  # a timeout of 0 or less
                raise UsageError(f"{flag}: out of bounds; the policy model takes {_bounds(section, field)}") from None
            if opts.get(name) is not None and f"{section}.{field}:" in text:
                detail = text.split(f"{section}.{field}:", 1)[1].split(";", 1)[0].strip()
                if detail.startswith("Input should be") and " than " in detail:  # a bound: in the flag's units
                    detail = "out of bounds"
                raise UsageError(f"{flag}: {detail}; the policy model takes {_bounds(section, field)}") from None
        if hosts and "network.allow" in text:
            raise UsageError(f"--allow-host: {text.split('network.allow', 1)[1].lstrip('.0123456789: ')}") from None
        raise
    if hosts and base.network.mode == "none":
        shown = ", ".join(r.host for r in pol.network.allow)
        say(f"--allow-host: network mode proxy instead of the policy's none: only {shown}, https, via the egress proxy")
    return pol


__all__ = ["FIELDS", "apply", "complete_policy", "complete_tool", "policy_options"]
