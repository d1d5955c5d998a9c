"""Secrets: the policy binds each to one origin; the store checks, adds and redacts; the runner resolves and refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolcage.connectors import parse_secret_options, secret_store, tool_sources
from toolcage.errors import UsageError
from toolcage.policies import PolicyError, validate_policy
from toolcage.policies.decide import Target
from toolcage.worker.errors import BadParams, EgressDenied
from toolcage.worker.secrets import SecretStore

TOKEN = "tok_0123456789abcdef"


def policy(send_to: dict[str, Any] | None = None, allow: list[dict[str, Any]] | None = None, **extra: Any) -> Any:
    return validate_policy(
        {
            "name": "gh",
            "network": {"mode": "proxy", "allow": allow or [{"host": "api.github.com"}]},
            "secrets": {"GH": {"send_to": send_to or {"host": "api.github.com"}, **extra}},
        }
    )


def store(**extra: Any) -> SecretStore:
    s = SecretStore()
    s.load({"GH": TOKEN}, dict(policy(**extra).secrets))
    return s


@pytest.mark.parametrize(
    ("send_to", "allow", "words"),
    [
        ({"host": "evil.example"}, None, "network.allow does not allow"),
        ({"host": "api.github.com", "scheme": "http"}, None, "http://api.github.com:80"),
        ({"host": "api.github.com", "port": 8443}, None, "network.allow does not allow"),
        ({"host": "*.github.com"}, None, "one exact host"),
        ({"host": "api.github.com", "header": "Host"}, None, "cannot carry a secret"),
        ({"host": "api.github.com", "header": "Proxy-Authorization"}, None, "cannot carry a secret"),
        ({"host": "api.github.com", "format": "Bearer"}, None, "{value}"),
        ({"host": "api.github.com", "format": "{value} {value}"}, None, "{value}"),
        ({"host": "api.github.com", "format": "x\r\n{value}"}, None, "CR, LF"),
    ],
)
def test_bad_bindings_are_policy_errors(send_to: dict[str, Any], allow: Any, words: str) -> None:
    """A secret bound where requests may not go, to a wildcard, a framing header or a bad format is refused at load."""
    with pytest.raises(PolicyError, match=words.replace("{", r"\{").replace("}", r"\}").replace(".", r"\.")):
        policy(send_to, allow)


def test_binding_under_a_wildcard_rule_is_allowed() -> None:
    """An exact host matched by an allowed '*.' rule may be bound."""
    p = policy({"host": "api.github.com"}, [{"host": "*.github.com"}])
    assert p.secrets["GH"].send_to.origin() == "https://api.github.com:443"


def test_bad_secret_name_is_refused() -> None:
    """Secret names look like environment variables."""
    with pytest.raises(PolicyError, match="secret name"):
        validate_policy(
            {
                "network": {"mode": "proxy", "allow": [{"host": "a.test"}]},
                "secrets": {"no-dash": {"send_to": {"host": "a.test"}}},
            }
        )


def test_header_only_for_the_bound_origin() -> None:
    """The header is the policy's format with the value; any other scheme, host or port is secret_not_bound."""
    s = store()
    assert s.header_for("GH", Target("https", "api.github.com", 443, False)) == ("Authorization", f"Bearer {TOKEN}")
    for t in (
        Target("http", "api.github.com", 80, False),
        Target("https", "api.github.com", 8443, False),
        Target("https", "evil.example", 443, False),
    ):
        with pytest.raises(EgressDenied) as exc:
            s.header_for("GH", t)
        assert exc.value.data["reason"] == "secret_not_bound" and TOKEN not in str(exc.value.data)
    with pytest.raises(EgressDenied, match="no secret named"):
        s.header_for("OTHER", Target("https", "api.github.com", 443, False))


def test_value_is_exposed_only_when_the_policy_says_unsafe() -> None:
    """ctx.secret() reads a value only under unsafe_expose_to_handler."""
    with pytest.raises(EgressDenied, match="not exposed"):
        store().exposed("GH")
    assert store(unsafe_expose_to_handler=True).exposed("GH") == TOKEN


def test_redaction_everywhere_in_a_value() -> None:
    """Every string, key and byte string with the value in any JSON spelling becomes [secret NAME]."""
    s = SecretStore()
    odd = 'x"y\\zé_0123456789'
    s.load({"GH": TOKEN, "ODD": odd}, {"GH": policy().secrets["GH"], "ODD": policy().secrets["GH"]})
    out = s.redact({"a": [f"Bearer {TOKEN}", {TOKEN: 1}], "b": 3, "c": None, "d": f"<{odd}>"})
    assert out == {"a": ["Bearer [secret GH]", {"[secret GH]": 1}], "b": 3, "c": None, "d": "<[secret ODD]>"}
    assert s.redact_text('{"v": "x\\"y\\\\z\\u00e9_0123456789"}') == '{"v": "[secret ODD]"}'
    assert s.redact_bytes(f"echo {TOKEN}!".encode()) == b"echo [secret GH]!"


@pytest.mark.parametrize(
    ("values", "field"),
    [({}, "missing"), ({"GH": TOKEN, "X": TOKEN}, "not_in_policy"), ({"GH": "short"}, "secrets")],
)
def test_store_refuses_values_that_do_not_match_the_policy(values: dict[str, str], field: str) -> None:
    """Every bound name must be given, no other, and no value shorter than 8 characters."""
    with pytest.raises(BadParams) as exc:
        SecretStore().load(values, dict(policy().secrets))
    assert exc.value.data[field]


def test_store_takes_values_once() -> None:
    """A second sandbox.configure cannot swap the values."""
    s = store()
    with pytest.raises(BadParams, match="already"):
        s.load({"GH": TOKEN}, dict(policy().secrets))


def test_runner_messages_say_what_to_do() -> None:
    """The runner's checks name the missing or unbound secret and the fix, before anything starts."""
    with pytest.raises(UsageError, match=r"needs GH \(give --secret"):
        secret_store(policy(), {})
    with pytest.raises(UsageError, match="binds no secret named X"):
        secret_store(policy(), {"GH": TOKEN, "X": TOKEN})
    assert not secret_store(validate_policy({}), None)


def test_secret_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--secret takes env: and file: references, never a literal, each name once."""
    monkeypatch.setenv("GH_TOKEN_VAR", TOKEN)
    f = tmp_path / "tok"
    f.write_text(TOKEN + "\n")
    assert parse_secret_options(["A=env:GH_TOKEN_VAR", f"B=file:{f}"]) == {"A": TOKEN, "B": TOKEN}
    for bad, words in [
        ([f"A={TOKEN}"], "literal"),
        (["A=env:NOPE_NOT_SET"], "not set"),
        ([f"A=file:{tmp_path}/none"], "cannot read"),
        (["A=env:GH_TOKEN_VAR", "A=env:GH_TOKEN_VAR"], "twice"),
        (["=env:X"], "expected NAME"),
    ]:
        with pytest.raises(UsageError, match=words):
            parse_secret_options(bad)


def test_tool_sources_kinds_and_refusals(tmp_path: Path) -> None:
    """A .py file, a folder of them, a package folder; anything else, or a path given twice, is refused."""
    (tmp_path / "one.py").write_text("")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("")
    got = tool_sources([tmp_path / "one.py", tmp_path / "folder", tmp_path / "pkg"])
    assert [(s.kind, s.target) for s in got] == [
        ("file", "/opt/toolcage/connectors/0/one.py"),
        ("folder", "/opt/toolcage/connectors/1"),
        ("package", "/opt/toolcage/connectors/2/pkg"),
    ]
    for bad, words in [
        ([tmp_path / "empty"], "no .py"),
        ([tmp_path / "notes.txt"], "not a .py"),
        ([tmp_path / "missing"], "does not exist"),
        ([tmp_path / "one.py", tmp_path / "one.py"], "twice"),
        (["/etc"], "host secrets"),
    ]:
        with pytest.raises(UsageError, match=words):
            tool_sources(bad)
