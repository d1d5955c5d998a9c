"""policies.overlay: the one builder of "a policy with these hosts, timeouts and limits" for the CLI's flags
and the framework adapters; no Docker."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from toolcage.policies import Policy, PolicyError, load_policy
from toolcage.policies.overlay import AGENT_IDLE_S, AGENT_RUN_S, overlay


def test_nothing_set_is_the_base_as_loaded() -> None:
    """No knob: the base policy itself (the same hash), whatever form it came in."""
    for base in ("default", "connector-http", {"extends": "default", "limits": {"memory": "1g"}}):
        assert overlay(base).sha256() == load_policy(base).sha256()


def test_the_result_is_a_frozen_policy_the_model_checked() -> None:
    """A Policy (frozen dataclasses), equal to the same knobs written as a file that extends the base."""
    pol = overlay("mcp-session", memory="1g", idle_s=30, description="d")
    assert isinstance(pol, Policy)
    with pytest.raises(dataclasses.FrozenInstanceError):
        pol.timeouts.idle_s = 1  # type: ignore[misc]
    same = load_policy(
        {"extends": "mcp-session", "limits": {"memory": "1g"}, "timeouts": {"idle_s": 30}, "description": "d"}
    )
    assert pol.sha256() == same.sha256() and pol.limits.memory == 1 << 30


def test_hosts_are_added_to_the_base_rules_and_turn_on_the_proxy() -> None:
    """An allowlist adds to the base's rules (methods and all) and turns on the proxy; an empty one changes nothing."""
    pol = overlay("connector-http", allow_hosts=["pypi.org", {"host": "example.org", "methods": ["GET"]}])
    assert [r.host for r in pol.network.allow] == ["api.github.com", "pypi.org", "example.org"]
    assert pol.network.allow[0].methods == ("GET", "POST") and pol.network.allow[2].methods == ("GET",)
    assert pol.secrets == load_policy("connector-http").secrets  # a bound secret keeps the rule it needs
    off = overlay("default", allow_hosts=["*.pypi.org"])
    assert off.network.mode == "proxy" and [(r.host, r.schemes) for r in off.network.allow] == [
        ("*.pypi.org", ("https",))
    ]
    assert overlay("default", allow_hosts=[]).network.mode == "none"


def test_agent_sessions_get_an_hour_where_the_base_keeps_the_default_timeouts() -> None:
    """agent_session: the model's 60 s become 1 h run and 10 min idle; a base's own timeouts are kept; the
    caller's win; an added idle timeout is never past the deadline."""
    assert (AGENT_RUN_S, AGENT_IDLE_S) == (3600.0, 600.0)
    for base in ("default", {"extends": "default", "limits": {"memory": "1g"}}, {"limits": {"cpus": 0.5}}):
        t = overlay(base, agent_session=True).timeouts
        assert (t.run_s, t.idle_s, t.call_s) == (3600.0, 600.0, 30.0), base
    own = overlay({"extends": "default", "timeouts": {"run_s": 300}}, agent_session=True).timeouts
    assert (own.run_s, own.idle_s) == (300.0, 60.0)
    assert overlay("mcp-session", agent_session=True).timeouts == load_policy("mcp-session").timeouts
    short = overlay("default", agent_session=True, run_s=120).timeouts
    assert (short.run_s, short.idle_s) == (120.0, 120.0)
    mine = overlay("default", agent_session=True, run_s=7200, idle_s=30).timeouts
    assert (mine.run_s, mine.idle_s) == (7200.0, 30.0)
    assert overlay("default").timeouts == load_policy("default").timeouts  # the CLI's: no agent defaults


def test_the_description_says_what_was_set() -> None:
    """The base's description would no longer be true: the result's names the base and the knobs."""
    pol = overlay("default", allow_hosts=["pypi.org"], run_s=90, memory="1g")
    assert pol.description == "default with memory 1g, run_s 90, allow_hosts pypi.org" and pol.name == "default"


@pytest.mark.parametrize(
    ("knobs", "says"),
    [
        ({"allow_hosts": "pypi.org"}, "allow_hosts must be a list of host names or rule mappings, not str"),
        ({"allow_hosts": ["https://pypi.org"]}, "'https://pypi.org' is not a host name"),
        ({"allow_hosts": ["pypi.org:8443"]}, "for another scheme, port or the methods, give a rule"),
        ({"allow_hosts": ["bad host"]}, "invalid host 'bad host'"),
        ({"allow_hosts": [3]}, "3 is neither a host name nor a rule mapping"),
        ({"allow_hosts": [{"host": "x.org", "schemes": ["ftp"]}]}, "schemes"),
        ({"run_s": -1}, "run_s must be a positive number of seconds, not -1"),
        ({"idle_s": True}, "idle_s must be a positive number of seconds, not True"),
        ({"call_s": "30"}, "call_s must be a positive number of seconds, not '30'"),
        ({"run_s": 1e9}, "timeouts.run_s: Input should be less than or equal to 86400"),
        ({"memory": "1k"}, "limits.memory"),
        ({"memory": "lots"}, "limits.memory"),
        ({"memroy": "1g"}, "'memroy' is not a limit (limits: memory, cpus"),
        ({"base": "no-such-policy"}, "unknown policy 'no-such-policy'"),
    ],
)
def test_a_bad_value_is_a_policy_error_naming_it(knobs: dict[str, Any], says: str) -> None:
    """Every bad knob is a PolicyError (a ToolcageError) that names it, on one line; never another exception."""
    with pytest.raises(PolicyError) as info:
        overlay(**knobs)
    assert says in str(info.value) and "\n" not in str(info.value), str(info.value)
