"""``workspace_cache`` end to end under the suite's runtime: runc lays the copy over the engine's cached tree
(its second run uses the first run's tree); gVisor makes the copy at start as without the cache. Either way the
run sees the host's tree, changes it in its own copy, and ``changes()`` names exactly what it changed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from toolcage import Sandbox, wait_removed
from toolcage.engine import copycache
from toolcage.engine.docker_adapter import Engine
from toolcage.errors import UsageError
from toolcage.policies import contract


def _lower(sb: Sandbox) -> str | None:
    info = Engine.default().inspect(sb.container_id or "") or {}
    return next((m.get("Name") for m in info.get("Mounts") or [] if m.get("Destination") == contract.COPY_LOWER), None)


def test_cached_copy_end_to_end(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "a.py").write_text("print('a')\n")
    (ws / "README").write_text("hello\n")
    os.symlink("src/a.py", ws / "link")
    for p in [tmp_path, ws, *ws.rglob("*")]:
        if not p.is_symlink():
            p.chmod(0o755 if p.is_dir() else 0o644)
    gvisor = os.environ.get(contract.ENV_SANDBOX) == "gvisor"
    lowers = []
    try:
        for _ in range(3):
            with Sandbox(workspace=ws, workspace_mode="copy", workspace_cache=True) as sb:
                lowers.append(_lower(sb))
                out = sb.call(
                    "run_shell",
                    {
                        "command": "cat /workspace/README && readlink /workspace/link && "
                        "echo more >> /workspace/src/a.py && rm /workspace/README"
                    },
                )
                assert out.result["stdout"] == "hello\nsrc/a.py\n", out.result
                ch = sb.changes()
                assert ch.changed == ("src/a.py",) and ch.removed == ("README",) and ch.added == ()
        if gvisor:
            assert lowers == [None, None, None]
        else:  # the first start of a tree only notes it; the second keeps it; the third lays the kept one
            assert lowers[0] is None and lowers[1] is not None and lowers[1] == lowers[2]
    finally:
        wait_removed()  # (a run's container goes in the background: its volumes after it)
        engine = Engine.default()
        for v in engine.volumes(f"{copycache.LABEL_PATH}={copycache.path_label(ws)}"):
            engine.remove_volume(str(v["Name"]))


def test_workspace_cache_needs_a_copy(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="workspace_mode='copy'"):
        Sandbox(workspace=tmp_path, workspace_cache=True)
    with pytest.raises(UsageError, match="workspace_mode='copy'"):
        Sandbox(workspace_mode="copy", workspace_cache=True)


def test_the_framework_clients_take_workspace_cache(tmp_path: Path) -> None:
    """The OpenAI Agents SDK client's options and the Deep Agents backend pass workspace_cache to the sandbox (a
    pool's slots never: they take their copy after adoption); without a workspace it is refused."""
    from toolcage.integrations.openai_agents import ToolcageSandboxClientOptions

    opts = ToolcageSandboxClientOptions(workspace=str(tmp_path), workspace_cache=True)
    assert opts.sandbox_kwargs()["workspace_cache"] is True and "workspace_cache" not in opts.pool_kwargs()
    assert ToolcageSandboxClientOptions.from_persisted(opts.persisted(), None).workspace_cache is True
    assert "workspace_cache" not in ToolcageSandboxClientOptions(workspace=str(tmp_path)).sandbox_kwargs()
    with pytest.raises(Exception, match="workspace_cache apply to a workspace"):
        ToolcageSandboxClientOptions(workspace_cache=True)
    import inspect

    from toolcage.integrations.deepagents import ToolcageSandbox

    assert "workspace_cache" in inspect.signature(ToolcageSandbox.__init__).parameters


def test_a_policy_with_secrets_keeps_its_tree(tmp_path: Path) -> None:
    """The run that fills the cache runs no code and has no network, so none of the policy's secrets either (a
    policy's secrets must go where its network may: a helper session's attack found the start refused). The run
    itself keeps its policy, proxy and secrets."""
    from toolcage.files.treekey import key

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    for p in (tmp_path, ws, ws / "a.txt"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    gvisor = os.environ.get(contract.ENV_SANDBOX) == "gvisor"
    engine = Engine.default()
    copycache.mark_seen(engine, key(ws, False), copycache.path_label(ws))
    policy = Path(__file__).resolve().parents[2] / "examples" / "connectors" / "github.yaml"
    try:
        with Sandbox(
            policy,
            workspace=ws,
            workspace_mode="copy",
            workspace_cache=True,
            secrets={"GITHUB_TOKEN": "t0ken-for-the-test"},
        ) as sb:
            assert (_lower(sb) is None) == gvisor
            assert sb.policy.network.mode == "proxy" and "GITHUB_TOKEN" in sb.policy.secrets
            assert sb.call("run_shell", {"command": "cat /workspace/a.txt"}).result["stdout"] == "a\n"
    finally:
        wait_removed()
        for v in engine.volumes(f"{copycache.LABEL_PATH}={copycache.path_label(ws)}"):
            engine.remove_volume(str(v["Name"]))
