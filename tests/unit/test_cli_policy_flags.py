"""One-off runs without a policy file: the policy flags (--memory, --allow-host, ...), --dry-run, and the
shell completion of tool and policy names; no Docker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from toolcage.cli.main import cli
from toolcage.policies import load_policy

CODE = ["--params", '{"code": "print(1)"}']


@pytest.fixture(autouse=True)
def no_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to build a Sandbox or a Pool fails the test: a dry run starts nothing."""
    import toolcage.pool
    import toolcage.sandbox

    def boom(*a: Any, **k: Any) -> None:
        raise AssertionError("a sandbox was started")

    monkeypatch.setattr(toolcage.sandbox, "Sandbox", boom)
    monkeypatch.setattr(toolcage.pool, "Pool", boom)


def dry(*args: str) -> Result:
    return CliRunner().invoke(cli, ["run", "run_python", *CODE, "--dry-run", *args])


def test_flags_set_the_policy_fields_and_dry_run_prints_it() -> None:
    """Each flag sets its policy field (sizes in the model's units); --dry-run prints the policy, exit 0."""
    out = dry("--memory", "1g", "--cpus", "0.5", "--output-cap", "4m", "--run-s", "600", "--call-s", "90")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["dry_run"] is True and doc["tool"] == "run_python" and doc["params"] == {"code": "print(1)"}
    limits, timeouts = doc["policy"]["limits"], doc["policy"]["timeouts"]
    assert (limits["memory"], limits["cpus"], limits["output_cap"]) == (1024**3, 0.5, 4 * 1024**2)
    assert (timeouts["run_s"], timeouts["call_s"], timeouts["idle_s"]) == (600, 90, 60)
    assert limits["pids"] == 64 and doc["policy"]["name"] == "default"  # the rest is the named policy's


def test_flags_are_an_overlay_the_loader_validates() -> None:
    """The effective policy is the named one extended by the flags' mapping, exactly as a file with extends."""
    doc = json.loads(dry("--policy", "mcp-session", "--memory", "1g", "--idle-s", "30").stdout)
    description = "mcp-session with --memory 1g --idle-s 30"  # the policy's own would no longer be true
    assert doc["policy"]["description"] == description
    over = {"limits": {"memory": "1g"}, "timeouts": {"idle_s": 30}, "description": description}
    assert doc["policy_sha256"] == load_policy({"extends": "mcp-session", **over}).sha256()


def test_without_flags_the_policy_is_the_named_one() -> None:
    """No flag: the dry run shows the bundled policy unchanged."""
    doc = json.loads(dry("--policy", "connector-http").stdout)
    assert doc["policy_sha256"] == load_policy("connector-http").sha256()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--memory", "100g"], "--memory 100g: out of bounds; the policy model takes at least 16m and at most 64g"),
        (["--memory", "8m"], "--memory 8m: out of bounds"),
        (["--memory", "lots"], "--memory lots: not a size"),
        (["--cpus", "0"], "--cpus 0: out of bounds; the policy model takes more than 0 and at most 64"),
        (["--cpus", "65"], "--cpus 65: out of bounds"),
        (["--output-cap", "10"], "--output-cap 10: out of bounds; the policy model takes at least 1k and at most 256m"),
        (["--run-s", "100000"], "--run-s 100000: out of bounds; the policy model takes more than 0 and at most 86400"),
        (["--idle-s", "-1"], "--idle-s -1: out of bounds"),
    ],
)
def test_a_value_out_of_bounds_is_a_usage_error_naming_the_flag(args: list[str], says: str) -> None:
    """A flag outside the model's bounds: exit 2, one stderr line with the flag and the bounds, no traceback."""
    out = dry(*args)
    assert out.exit_code == 2
    assert says in out.stderr and "Traceback" not in out.output
    assert json.loads(out.stdout)["error"]["reason"] == "usage"


def test_allow_host_on_a_no_network_policy_switches_to_the_proxy_with_only_those_hosts() -> None:
    """--allow-host on mode none: mode proxy, allowing only the named hosts (https, port 443), said on stderr."""
    out = dry("--allow-host", "api.example.com", "--allow-host", "*.example.org")
    assert out.exit_code == 0, out.output
    net = json.loads(out.stdout)["policy"]["network"]
    assert net["mode"] == "proxy" and net["allow_private_cidrs"] == []
    assert [(r["host"], r["schemes"], r["ports"]) for r in net["allow"]] == [
        ("api.example.com", ["https"], []),
        ("*.example.org", ["https"], []),
    ]
    assert "network mode proxy instead of the policy's none: only api.example.com, *.example.org" in out.stderr


def test_allow_host_adds_to_the_policy_allowlist() -> None:
    """--allow-host on a proxy policy keeps its rules (methods and all) and adds the host; no mode note."""
    out = dry("--policy", "connector-http", "--allow-host", "api.example.com")
    net = json.loads(out.stdout)["policy"]["network"]
    assert [r["host"] for r in net["allow"]] == ["api.github.com", "api.example.com"]
    assert net["allow"][0]["methods"] == ["GET", "POST"] and "instead of" not in out.stderr


@pytest.mark.parametrize(
    ("host", "says"),
    [
        ("https://api.example.com", "--allow-host wants a host name such as api.example.com"),
        ("api.example.com:8443", "write a policy file with network.allow"),
        ("bad host", "--allow-host: invalid host 'bad host'"),
    ],
)
def test_allow_host_refuses_what_is_not_a_host(host: str, says: str) -> None:
    """A URL, a port or a malformed name after --allow-host is exit 2 with the fix."""
    out = dry("--allow-host", host)
    assert out.exit_code == 2 and says in out.stderr and "Traceback" not in out.output


def test_timeout_still_only_shortens_the_run_deadline_the_flags_set() -> None:
    """--run-s sets run_s; --timeout then only shortens it (a larger one is clamped with a warning)."""
    assert json.loads(dry("--run-s", "600", "--timeout", "30").stdout)["policy"]["timeouts"]["run_s"] == 30
    out = dry("--run-s", "600", "--timeout", "900")
    assert json.loads(out.stdout)["policy"]["timeouts"]["run_s"] == 600 and "using 600s" in out.stderr


def test_dry_run_still_checks_the_tool_and_params() -> None:
    """--dry-run refuses what the run would refuse: an unknown tool is exit 2."""
    out = CliRunner().invoke(cli, ["run", "nosuch", "--params", "{}", "--dry-run"])
    assert out.exit_code == 2 and "nosuch" in out.stderr


def test_serve_dry_run_prints_the_policy() -> None:
    """`serve --dry-run` prints the effective policy as JSON and starts nothing, --pool or not."""
    for extra in ([], ["--pool", "2"]):
        out = CliRunner().invoke(cli, ["serve", "--dry-run", "--memory", "1g", *extra])
        assert out.exit_code == 0, out.output
        doc = json.loads(out.stdout)
        assert doc["tool"] == "serve" and doc["policy"]["limits"]["memory"] == 1024**3


def test_mcp_wrap_gets_the_flags_through_the_shared_options() -> None:
    """`mcp wrap` shares the sandbox options: a flag out of bounds is refused before Docker is asked."""
    out = CliRunner().invoke(cli, ["mcp", "wrap", "--memory", "100g", "--", "server"])
    assert out.exit_code == 2 and "--memory 100g: out of bounds" in out.stderr


def complete(line: str, cwd: Path | None = None) -> list[str]:
    """What bash completion offers for the last word of ``line`` (click's own protocol)."""
    words = line.split(" ")
    env = {"_TOOLCAGE_COMPLETE": "bash_complete", "COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1)}
    out = CliRunner().invoke(cli, [], env=env, prog_name="toolcage")
    assert out.exit_code == 0, out.output
    return [ln.split(",", 1)[1] for ln in out.stdout.splitlines()]


def test_completion_of_tool_names() -> None:
    """`toolcage run <TAB>` offers the built-in tools, filtered by what is typed."""
    assert complete("toolcage run run_") == ["run_node", "run_python", "run_shell"]
    assert "http_fetch" in complete("toolcage run ")


def test_completion_of_policy_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--policy and `policy test` offer the bundled names and the policy files of the current directory."""
    (tmp_path / "mine.yaml").write_text("version: 1\n")
    (tmp_path / "notes.txt").write_text("")
    monkeypatch.chdir(tmp_path)
    assert complete("toolcage run run_python --policy ") == ["connector-http", "default", "mcp-session", "mine.yaml"]
    assert complete("toolcage policy test m") == ["mcp-session", "mine.yaml"]
    assert complete("toolcage mcp serve --policy def") == ["default"]


def test_completion_of_a_policy_path_is_left_to_the_shell() -> None:
    """A --policy value with a '/' completes as a file path (the shell's own completion)."""
    env = {"_TOOLCAGE_COMPLETE": "bash_complete", "COMP_WORDS": "toolcage run x --policy ./p", "COMP_CWORD": "4"}
    out = CliRunner().invoke(cli, [], env=env, prog_name="toolcage")
    assert out.stdout.splitlines() == ["file,./p"]
