"""A policy with a few knobs turned: ``overlay(base, allow_hosts=..., run_s=..., idle_s=..., **limits)``.

The one builder of "this policy, plus these hosts and timeouts" for every door that offers the knobs
without a policy file: the CLI's flags (``toolcage.cli.policy_flags``), the OpenAI Agents SDK's client
options and the Deep Agents backend (``toolcage.integrations``). The result is an ordinary policy: the
knobs become a mapping that ``extends`` the base, through the loader and the model like a file, so the
bounds are the model's and a bad value is a :class:`~toolcage.policies.PolicyError`, never a traceback.

One set of defaults for all (what changed for each caller is in the history: issue 35):

- an allowlist is **added** to the base's rules, never replaces them, and turns the network's mode to
  ``proxy`` (the egress proxy is the only way out; mode ``none`` has no interface but ``lo``). Replacing
  would drop a rule a bound secret needs (the policy would not load) and surprise whoever wrote the base;
  to narrow a policy, write one. An empty allowlist changes nothing;
- a timeout or limit left ``None`` is the base's;
- ``agent_session=True`` (the framework adapters): a base that keeps the model's default run and idle
  timeouts (60 s each: the bundled ``default`` policy, and any policy that does not set them) gets
  :data:`AGENT_RUN_S` and :data:`AGENT_IDLE_S` for those the caller left ``None``: 60 s suits one call,
  not an agent that thinks between commands. A base that sets its own timeouts keeps them: that file is
  someone's decision. The idle timeout so added is never longer than the run's deadline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from toolcage.policies.errors import PolicyError

if TYPE_CHECKING:
    from toolcage.policies.loader import PolicySource
    from toolcage.policies.model import Policy

AGENT_RUN_S = 3600.0
"""An agent session's deadline when neither the caller nor the base policy chose one: one hour."""
AGENT_IDLE_S = 600.0
"""An agent session's idle timeout when neither the caller nor the base policy chose one: ten minutes."""

TIMEOUTS = ("run_s", "idle_s", "call_s")


def overlay(
    base: PolicySource = "default",
    *,
    allow_hosts: Iterable[str | Mapping[str, Any]] | None = None,
    run_s: float | None = None,
    idle_s: float | None = None,
    call_s: float | None = None,
    agent_session: bool = False,
    description: str | None = None,
    **limits: Any,
) -> Policy:
    """``base`` (a bundled name, a file, a mapping or a Policy) with these knobs set, validated.

    ``allow_hosts``: host names (``"pypi.org"``, ``"*.example.com"``: https, port 443) or rule mappings
    (``{"host": ..., "schemes": [...], "ports": [...], "methods": [...]}``), added to the base's
    ``network.allow``; any entry makes the mode ``proxy``. ``run_s``/``idle_s``/``call_s``: the timeouts,
    in seconds. ``limits``: fields of ``limits`` (``memory="1g"``, ``cpus=0.5``, ``scratch``,
    ``workspace_copy``, ``output_cap``, ``pids``, ``nofile``, ``concurrency``). ``agent_session``: the agent
    defaults of the module docstring. ``description``: the result's (default: the base's name and what
    was set; the base's own would no longer be true). ``None`` leaves a knob as the base has it; with
    nothing set the base comes back as loaded. Raises ``PolicyError`` naming the knob."""
    from toolcage.policies.loader import load_policy
    from toolcage.policies.model import Limits, Timeouts
    from toolcage.policies.typed import to_dict

    policy = load_policy(base)
    fields = [f.name for f in dataclasses.fields(Limits)]
    unknown = sorted(set(limits) - set(fields))
    if unknown:
        known = ", ".join(fields)
        raise PolicyError(
            f"overlay: {', '.join(map(repr, unknown))} is not a limit (limits: {known})", field=unknown[0]
        )
    times = {"run_s": run_s, "idle_s": idle_s, "call_s": call_s}
    for name, value in times.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not value > 0):
            raise PolicyError(f"{name} must be a positive number of seconds, not {value!r}", field=name)
    if agent_session:
        model = Timeouts()
        if (policy.timeouts.run_s, policy.timeouts.idle_s) == (model.run_s, model.idle_s):
            deadline = AGENT_RUN_S if run_s is None else float(run_s)
            times["run_s"] = deadline
            if idle_s is None:
                times["idle_s"] = min(AGENT_IDLE_S, deadline)
    rules = _rules(allow_hosts)

    over: dict[str, Any] = {}
    shown: list[str] = []
    set_limits = {k: v for k, v in limits.items() if v is not None}
    if set_limits:
        over["limits"] = set_limits
        shown += [f"{k} {v}" for k, v in set_limits.items()]
    set_times = {k: float(v) for k, v in times.items() if v is not None}
    if set_times:
        over["timeouts"] = set_times
        shown += [f"{k} {v:g}" for k, v in set_times.items()]
    if rules:
        over["network"] = {"mode": "proxy", "allow": to_dict(policy)["network"]["allow"] + rules}
        shown += [f"allow_hosts {r['host']}" for r in rules]
    if not over:
        return policy
    over["description"] = description if description is not None else f"{policy.name} with {', '.join(shown)}"
    return load_policy({"extends": policy, **over})


def _rules(allow_hosts: Iterable[str | Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """The allowlist entries as ``network.allow`` rules; a host name is checked here for the mistakes a
    person makes (a URL, a port), the rest by the model (``policies.names``)."""
    if allow_hosts is None:
        return []
    if isinstance(allow_hosts, str | bytes) or not isinstance(allow_hosts, Iterable):
        raise PolicyError(
            f"allow_hosts must be a list of host names or rule mappings, not {type(allow_hosts).__name__}",
            field="allow_hosts",
        )
    rules = []
    for entry in allow_hosts:
        if isinstance(entry, str):
            if "://" in entry or "/" in entry or (":" in entry and not _ip_literal(entry)):
                raise PolicyError(
                    f"allow_hosts: {entry!r} is not a host name: give one such as api.example.com (https, port "
                    "443); for another scheme, port or the methods, give a rule (network.allow)",
                    field="allow_hosts",
                    entry=entry,
                )
            rules.append({"host": entry})
        elif isinstance(entry, Mapping):
            rules.append(dict(entry))
        else:
            raise PolicyError(
                f"allow_hosts: {entry!r} is neither a host name nor a rule mapping", field="allow_hosts", entry=entry
            )
    return rules


def _ip_literal(host: str) -> bool:
    from toolcage.policies.names import ip_literal

    return ip_literal(host) is not None


__all__ = ["AGENT_IDLE_S", "AGENT_RUN_S", "overlay"]
