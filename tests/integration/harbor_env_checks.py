"""Checks of ``ToolcageEnvironment`` against Harbor's own classes, run inside the Harbor runner image (Python 3.13,
Harbor installed) by tests/integration/test_harbor.py: ``python3 harbor_env_checks.py`` prints one ``ok NAME``
line per check and exits non-zero at the first failure. Not collected by pytest: Harbor is not importable
in the test venv (Python 3.11).
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from toolcage.integrations.harbor import DYNAMIC, ToolcageEnvironment
from toolcage.integrations.harbor_rules import UserRefused

IMAGE = sys.argv[1] if len(sys.argv) > 1 else "toolcage-harbor-task:1"
CHECKS: list[tuple[str, Callable[[Path], Coroutine[Any, Any, None]]]] = []


def check(fn: Callable[[Path], Coroutine[Any, Any, None]]) -> Callable[[Path], Coroutine[Any, Any, None]]:
    CHECKS.append((fn.__name__, fn))
    return fn


def make(tmp: Path, **config: Any) -> BaseEnvironment:
    """The environment as Harbor makes it from an import path (EnvironmentFactory); ``public``: an ``--ek``."""
    (tmp / "env").mkdir(exist_ok=True)
    policy = config.pop("network_policy", None)
    kwargs = {"public": config.pop("public")} if "public" in config else {}
    config.setdefault("workdir", "/app")
    task_env = EnvironmentConfig(docker_image=IMAGE, **config)
    return EnvironmentFactory.create_environment_from_import_path(
        "toolcage.integrations.harbor:ToolcageEnvironment",
        environment_dir=tmp / "env",
        environment_name="checks",
        session_id="checks__env",
        trial_paths=TrialPaths(trial_dir=tmp / "trial"),
        task_env_config=task_env,
        network_policy=policy or task_env.resolve_baseline(),  # as a trial passes it
        **kwargs,
    )


@check
async def capabilities_are_harbors_model(tmp: Path) -> None:
    env = make(tmp, network_mode="no-network")
    caps = env.capabilities
    assert isinstance(caps, EnvironmentCapabilities) and isinstance(env, ToolcageEnvironment)
    assert caps.disable_internet and caps.network_allowlist and caps.network_allowlist_wildcard_hostnames
    assert not caps.network_allowlist_ipv4_cidrs and not caps.mounted and not caps.gpus
    assert caps.dynamic_network_policy is DYNAMIC


@check
async def harbor_refuses_what_is_not_claimed(tmp: Path) -> None:
    try:
        make(tmp, network_mode="allowlist", allowed_hosts=["192.0.2.0/24"])
    except ValueError as exc:
        assert "IPv4 CIDR ranges" in str(exc), exc
    else:
        raise AssertionError("a CIDR allowlist was accepted")


@check
async def public_is_refused_at_construction(tmp: Path) -> None:
    try:
        make(tmp, network_policy=NetworkPolicy(network_mode=NetworkMode.PUBLIC))
    except ValueError as exc:
        assert "unrestricted network" in str(exc), exc
    else:
        raise AssertionError("public was accepted")


@check
async def exec_users_files_and_timeout(tmp: Path) -> None:
    env = make(tmp, network_mode="no-network")
    await env.start(force_build=False)
    try:
        who = await env.exec("id -u; pwd; echo $GREETING", env={"GREETING": "hi"}, user="root")
        assert who.return_code == 0 and who.stdout.split() == ["65532", "/app", "hi"], who
        try:
            await env.exec("true", user="agent")
        except UserRefused as exc:
            assert "'agent'" in str(exc)
        else:
            raise AssertionError("user agent was accepted")
        bad = await env.exec("exit 3")
        assert bad.return_code == 3, bad
        killed = await env.exec("kill -9 $$")
        assert killed.return_code == 137, killed
        try:
            await env.exec("sleep 5", timeout_sec=1)
        except RuntimeError as exc:
            assert "timed out" in str(exc)
        else:
            raise AssertionError("no timeout")
        # a file under another name, a tree with a mode, a symlink and an empty directory, in and out
        src = tmp / "tree"
        (src / "empty").mkdir(parents=True)
        (src / "run.sh").write_text("#!/bin/sh\necho run\n")
        (src / "run.sh").chmod(0o751)
        (src / "link").symlink_to("run.sh")
        await env.upload_dir(src, "/tests/tree")
        (tmp / "one.txt").write_text("one\n")
        await env.upload_file(tmp / "one.txt", "/solution/renamed.txt")
        seen = await env.exec("stat -c '%a %F %N' /tests/tree/* | sort; cat /solution/renamed.txt")
        assert seen.stdout.splitlines() == [
            "751 regular file '/tests/tree/run.sh'",
            "755 directory '/tests/tree/empty'",
            "777 symbolic link '/tests/tree/link' -> 'run.sh'",
            "one",
        ], seen
        back = tmp / "back"
        await env.download_dir("/tests/tree", back)
        assert stat.S_IMODE((back / "run.sh").lstat().st_mode) == 0o751
        assert os.readlink(back / "link") == "run.sh" and list((back / "empty").iterdir()) == []
        await env.download_file("/solution/renamed.txt", tmp / "got" / "again.txt")
        assert (tmp / "got" / "again.txt").read_text() == "one\n"
        denied = await env.exec("touch /etc/x")
        assert denied.return_code != 0 and "Read-only" in (denied.stderr or ""), denied
    finally:
        await env.stop(delete=True)


@check
async def the_images_workdir_is_writable_and_public_can_be_none(tmp: Path) -> None:
    env = make(tmp, workdir=None, network_policy=NetworkPolicy(network_mode=NetworkMode.PUBLIC), public="no-network")
    await env.start(force_build=False)
    try:  # no workdir in the task: the image's WORKDIR (/app), found at start, is made writable
        got = await env.exec("pwd && touch here && ls here")
        assert got.return_code == 0 and got.stdout.splitlines()[:2] == ["/app", "here"], got
        net = await env.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '")
        assert net.stdout.split() == ["lo"], net  # public run as no-network: no interface but lo
    finally:
        await env.stop(delete=True)


async def main() -> int:
    for name, fn in CHECKS:
        with tempfile.TemporaryDirectory() as tmp:
            await fn(Path(tmp))
        print("ok", name, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
