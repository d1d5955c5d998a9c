"""A policy given in code (a mapping or a Policy object) to load_policy and every door that takes one:
validated as a file is, within the model's bounds, and able to set a session's length."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from toolcage import AsyncSandbox, Pool, Sandbox
from toolcage.policies import Policy, PolicyError, Timeouts, load_policy


def test_a_mapping_is_read_like_a_file() -> None:
    """Fields a mapping leaves out take the model's safe defaults; the ones it gives are kept."""
    p = load_policy({"name": "long", "timeouts": {"run_s": 3600, "idle_s": 600}})
    assert (p.name, p.timeouts.run_s, p.timeouts.idle_s) == ("long", 3600, 600)
    assert p.limits == Policy().limits and p.network == Policy().network
    assert p == load_policy({"name": "long", "timeouts": {"run_s": 3600, "idle_s": 600}})  # same hash, same run


def test_extends_merges_over_a_bundled_policy(tmp_path: Path) -> None:
    """``extends`` starts from another policy (name, path, or Policy); nested mappings merge, the rest replaces."""
    base = load_policy("mcp-session")
    p = load_policy({"extends": "mcp-session", "timeouts": {"idle_s": 60}, "limits": {"memory": "1g"}})
    assert p.name == base.name and p.timeouts.run_s == base.timeouts.run_s and p.timeouts.idle_s == 60
    assert p.limits.memory == 1024**3 and p.limits.pids == base.limits.pids
    assert load_policy({"extends": base, "timeouts": {"idle_s": 60}}).timeouts == p.timeouts
    child = tmp_path / "child.yaml"
    child.write_text("extends: mcp-session\ntimeouts: {idle_s: 60}\n")  # a file may extend too
    assert load_policy(child).timeouts == p.timeouts


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ({"timeouts": {"run_s": 86401}}, "timeouts.run_s: Input should be less than or equal to 86400"),
        ({"timeouts": {"run_s": "600"}}, "timeouts.run_s: Input should be a valid number"),
        ({"limits": {"memroy": "1g"}}, "limits.memroy: unknown field"),
        ({"extends": "nope"}, "unknown policy 'nope'"),
        ({"extends": 7}, "extends: a bundled name or a file path"),
        (Policy(timeouts=Timeouts(run_s=-1)), "timeouts.run_s: Input should be greater than 0"),
        (Policy(timeouts=Timeouts(idle_s=10**9)), "timeouts.idle_s"),
        (42, "not int"),
    ],
)
def test_code_is_held_to_the_model(source: object, needle: str) -> None:
    """A mapping or a Policy built in code gets the file's one-line PolicyError, never a pass past a bound."""
    with pytest.raises(PolicyError) as err:
        load_policy(source)  # type: ignore[arg-type]
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_extends_loop_is_an_error(tmp_path: Path) -> None:
    """A file that extends itself is one PolicyError, not a recursion."""
    loop = tmp_path / "loop.yaml"
    loop.write_text(f"extends: {loop}\n")
    with pytest.raises(PolicyError, match="deep"):
        load_policy(loop)


def test_sandbox_takes_a_session_length_from_code() -> None:
    """Sandbox(policy={...}) runs with the run_s and idle_s given (past the default 60 s), and run_timeout
    still only tightens."""
    with Sandbox(policy={"timeouts": {"run_s": 3600, "idle_s": 900}}, sandbox="none", audit=False) as sb:
        assert (sb.policy.timeouts.run_s, sb.policy.timeouts.idle_s) == (3600, 900)
        assert sb.call("ping").ok
    long = load_policy({"timeouts": {"run_s": 3600}})
    with Sandbox(policy=long, run_timeout=100, sandbox="none", audit=False) as sb:
        assert sb.policy.timeouts.run_s == 100


def test_every_door_refuses_a_bad_policy_object_before_it_starts() -> None:
    """Sandbox, AsyncSandbox and Pool hold a Policy built in code to the model (it was taken as is)."""
    bad = dataclasses.replace(Policy(), timeouts=Timeouts(run_s=0))
    with pytest.raises(PolicyError, match="run_s"):
        Sandbox(policy=bad, sandbox="none", audit=False)
    with pytest.raises(PolicyError, match="run_s"):
        AsyncSandbox(policy=bad, sandbox="none", audit=False)
    with pytest.raises(PolicyError, match="run_s"):
        Pool(policy=bad, size=1, sandbox="none", audit=False)


def test_async_and_pool_take_a_mapping() -> None:
    """AsyncSandbox and Pool take the same mapping as Sandbox."""

    async def one() -> float:
        async with AsyncSandbox(policy={"timeouts": {"run_s": 1200}}, sandbox="none", audit=False) as sb:
            assert (await sb.call("ping")).ok
            return float(sb._sync.policy.timeouts.run_s)  # the Sandbox it drives

    assert asyncio.run(one()) == 1200
    with Pool(policy={"timeouts": {"run_s": 1200}}, size=1, sandbox="none", audit=False) as pool:
        assert pool.policy.timeouts.run_s == 1200
