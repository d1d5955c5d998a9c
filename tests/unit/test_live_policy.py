"""The live network change's pure parts: the floor a change is held to, audit-only decisions, doctor's word."""

from __future__ import annotations

from typing import Any

import pytest

from toolcage import PolicyError
from toolcage.options import network_policy
from toolcage.policies import Policy, validate_policy
from toolcage.policies.decide import Request, decide

START = validate_policy(
    {
        "name": "live",
        "network": {"mode": "proxy", "allow": [{"host": "api.example.com"}], "allow_private_cidrs": ["10.1.0.0/16"]},
        "secrets": {"KEY": {"send_to": {"host": "api.example.com"}}},
    }
)


def _net(*hosts: str, **more: Any) -> dict[str, Any]:
    return {"mode": "proxy", "allow": [{"host": h} for h in hosts], **more}


@pytest.mark.parametrize(
    ("network", "words"),
    [
        (_net("api.example.com", allow_private_cidrs=["10.1.0.0/16", "192.168.0.0/16"]), "never opens a private range"),
        (_net("api.example.com", "169.254.169.254"), "link-local"),
        (_net("api.example.com", "[::1]"), "egress floor"),
        (_net("api.example.com", "2130706433"), "egress floor"),  # 127.0.0.1 as one number
        (_net("api.example.com", "sub.localhost"), "the machine itself"),
        (_net("other.example.com"), "secret KEY is bound to https://api.example.com"),  # its origin taken away
        ({"mode": "none"}, "secret KEY"),
        (_net("api.example.com", unsafe_audit_only=True), "TOOLCAGE_EGRESS_AUDIT_ONLY=allow"),
        ({"mode": "proxy", "allow": "api.example.com"}, "allow"),
        ("proxy", "network section"),
    ],
)
def test_a_change_past_the_floor_or_the_model_is_refused_with_its_reason(network: Any, words: str) -> None:
    with pytest.raises(PolicyError) as err:
        network_policy(START, network)
    assert words in str(err.value), str(err.value)


def test_a_change_keeps_the_rest_of_the_policy_and_may_narrow_the_private_ranges() -> None:
    new = network_policy(START, _net("api.example.com", "*.pypi.org", allow_private_cidrs=[]))
    assert new.limits == START.limits and new.secrets == START.secrets and new.name == START.name
    assert [r.host for r in new.network.allow] == ["api.example.com", "*.pypi.org"]
    assert new.sha256() != START.sha256()


def test_audit_only_lets_the_allowlist_pass_and_never_the_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLCAGE_EGRESS_AUDIT_ONLY", "allow")
    p = network_policy(START, _net("api.example.com", unsafe_audit_only=True))
    learn = decide(Request("https://elsewhere.test/x"), p, lambda _h: ["93.184.216.34"])
    assert learn.allowed and learn.would_deny == "host elsewhere.test is not in the allowlist"
    assert learn.to_dict()["would_deny"] == learn.would_deny
    meta = decide(Request("http://169.254.169.254/latest"), p, lambda _h: [])
    assert not meta.allowed and "link-local" in meta.reason
    private = decide(Request("https://inside.test/"), p, lambda _h: ["192.168.1.5"])
    assert not private.allowed
    plain = decide(Request("https://api.example.com/"), p, lambda _h: ["93.184.216.34"])
    assert plain.allowed and plain.would_deny is None
    with pytest.raises(ValueError, match="mode 'none'"):
        validate_policy({"network": {"mode": "none", "unsafe_audit_only": True}})
    assert not Policy().network.unsafe_audit_only  # never the default


def test_doctor_says_when_audit_only_is_permitted(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolcage.ops import doctor

    out: dict[str, Any] = {"warnings": []}
    monkeypatch.delenv("TOOLCAGE_EGRESS_AUDIT_ONLY", raising=False)
    doctor._egress_mode(out)
    assert out == {"warnings": [], "egress_audit_only": False}
    monkeypatch.setenv("TOOLCAGE_EGRESS_AUDIT_ONLY", "allow")
    doctor._egress_mode(out)
    assert out["egress_audit_only"] is True and "audit-only" in out["warnings"][0]
