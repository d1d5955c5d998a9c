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

    from toolcage.cli.main import cli

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


def test_bundled_cache_is_current() -> None:
    """bundled.json holds every bundled policy file's data under that file's hash (after editing a
    bundled *.yaml, run `python -m toolcage.policies.bundled`)."""
    import json

    from toolcage.policies import bundled

    stale = "policies/bundled.json is not what the bundled *.yaml say: run `python -m toolcage.policies.bundled`"
    assert json.loads(bundled.CACHE.read_text(encoding="utf-8")) == bundled.compute(), stale


@pytest.mark.parametrize("name", ["connector-http", "default", "mcp-session"])
def test_cached_bundled_policy_equals_pydantic(name: str) -> None:
    """A bundled policy loaded from the cache (typed.build, no YAML, no pydantic) equals the
    same file through YAML and pydantic, hash included."""
    import yaml

    from toolcage.policies import bundled, bundled_policy_names

    assert name in bundled_policy_names()  # the parameters name every bundled file
    assert len(bundled_policy_names()) == 3
    path = bundled.HERE / f"{name}.yaml"
    # the cache is what loads it (else: `python -m toolcage.policies.bundled`, see test_bundled_cache_is_current)
    assert bundled.cached_data(name, path.read_bytes()) is not None, f"{name}.yaml is not in bundled.json"
    slow = validate_policy(yaml.safe_load(path.read_text(encoding="utf-8")), repr(str(path)))
    fast = load_policy(name)
    assert fast == slow
    assert fast.sha256() == slow.sha256()


def test_bundled_cache_misses_on_other_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bundled file that is not byte for byte the cached one goes through YAML and pydantic:
    an edit takes effect, right or wrong."""
    from toolcage.policies import bundled, loader

    src = bundled.HERE / "default.yaml"
    assert bundled.cached_data("default", src.read_bytes() + b"\n# edited\n") is None
    edited = tmp_path / "default.yaml"
    edited.write_text(src.read_text(encoding="utf-8").replace("pids: 64", "pids: 65"), encoding="utf-8")
    monkeypatch.setattr(loader, "_BUNDLED", tmp_path)
    assert load_policy("default").limits.pids == 65
    edited.write_text(src.read_text(encoding="utf-8").replace("pids: 64", 'pids: "64"'), encoding="utf-8")
    with pytest.raises(PolicyError, match=r"limits\.pids"):
        load_policy("default")


def test_bundled_policy_loads_without_yaml_or_pydantic() -> None:
    """Loading a bundled policy imports neither YAML nor pydantic (the `toolcage run` start-up)."""
    import subprocess
    import sys

    code = (
        "import sys; from toolcage.policies import load_policy; p = load_policy('default'); "
        "print(sorted(m for m in ('yaml', 'pydantic') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", "a stale bundled.json? see test_bundled_cache_is_current"
