"""The policy model: defaults, strictness, sizes, hashing, and a clear error per bad file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from toolcage.policies import Policy, PolicyError, load_policy, parse_size, policy_from_json, validate_policy

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "policies"


def test_default_policy_values() -> None:
    """The bundled default is the documented safe baseline."""
    p = load_policy("default")
    assert p.limits.memory == 512 * 1024**2
    assert p.limits.cpus == 1.0
    assert p.limits.pids == 64
    assert p.timeouts.run_s == 60
    assert p.limits.scratch == 64 * 1024**2
    assert p.limits.output_cap == 1024**2
    assert p.network.mode == "none"


def test_bundled_default_equals_model_defaults() -> None:
    """default.yaml says exactly what the model's defaults say (docs cannot drift)."""
    assert load_policy("default").limits == Policy().limits
    assert load_policy("default").timeouts == Policy().timeouts


def test_policy_is_frozen() -> None:
    """A loaded policy cannot be changed in place."""
    p = load_policy("default")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.limits.pids = 10_000  # type: ignore[misc]


def test_sha256_is_stable_and_content_based() -> None:
    """Same content, same hash; any change, another hash."""
    a, b = load_policy("default"), load_policy("default")
    assert a.sha256() == b.sha256()
    assert len(a.sha256()) == 64
    changed = dataclasses.replace(a, description="x")
    assert changed.sha256() != a.sha256()


def test_json_round_trip() -> None:
    """The worker rebuilds the identical policy from its canonical JSON."""
    p = load_policy(FIX / "good-small.yaml")
    assert policy_from_json(p.canonical_json()) == p
    assert p.limits.output_cap == 4096


@pytest.mark.parametrize(
    ("value", "expected"),
    [("512m", 512 * 1024**2), ("64MiB", 64 * 1024**2), ("1g", 1024**3), ("4k", 4096), (1000, 1000), ("1.5k", 1536)],
)
def test_parse_size(value: object, expected: int) -> None:
    """Sizes accept bytes and binary-unit strings."""
    assert parse_size(value) == expected


@pytest.mark.parametrize("value", ["", "12q", "m", True, None, [1]])
def test_parse_size_rejects(value: object) -> None:
    """Anything else is refused, booleans included."""
    with pytest.raises(ValueError):
        parse_size(value)


BAD = [
    ("bad-memory-unit.yaml", "limits.memory"),
    ("bad-unknown-field.yaml", "limits.memroy: unknown field"),
    ("bad-string-bool.yaml", "limits.pids"),
    ("bad-network-mode.yaml", "network.mode"),
    ("bad-negative-timeout.yaml", "timeouts.run_s"),
    ("bad-not-mapping.yaml", "top level must be a mapping"),
    ("bad-yaml.yaml", "not valid YAML"),
    ("bad-version.yaml", "version"),
]


@pytest.mark.parametrize(("name", "needle"), BAD)
def test_bad_policy_files_name_the_field(name: str, needle: str) -> None:
    """Each broken fixture raises PolicyError naming what is wrong."""
    with pytest.raises(PolicyError) as info:
        load_policy(FIX / name)
    assert needle in str(info.value)
    assert name in str(info.value) or "YAML" in str(info.value)


def test_unknown_bundled_name() -> None:
    """An unknown bundled name lists the names that exist."""
    with pytest.raises(PolicyError, match=r"bundled policies are .*default"):
        load_policy("no-such-policy")


def test_missing_file() -> None:
    """A path that does not exist says so."""
    with pytest.raises(PolicyError, match="not found"):
        load_policy("/nonexistent/policy.yaml")


def test_policy_error_exit_code_is_what_the_cli_exits_with(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI exits with PolicyError.exit_code (2), read from the class, not a literal of its own."""
    from click.testing import CliRunner

    from toolcage.cli import cli

    assert PolicyError.exit_code == 2
    args = ["policy", "test", str(FIX / "bad-memory-unit.yaml"), "https://x/"]
    assert CliRunner().invoke(cli, args).exit_code == 2
    monkeypatch.setattr(PolicyError, "exit_code", 7)
    assert CliRunner().invoke(cli, args).exit_code == 7


def test_validator_messages_lose_pydantic_prefix() -> None:
    """A validator's message reaches the user without pydantic's "Value error," prefix."""
    with pytest.raises(PolicyError) as info:
        validate_policy({"version": 1, "name": "x", "limits": {"memory": "12q"}})
    assert "limits.memory: not a size" in str(info.value) and "Value error" not in str(info.value)
