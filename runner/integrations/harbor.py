"""A Harbor environment (``harbor`` 0.25, Python 3.12+) backed by toolcage: each trial's environment is one
:class:`~toolcage.aio.AsyncSandbox` of the task's own image, with toolcage's hardening.

    harbor run -p tasks/ -a oracle --env toolcage.integrations.harbor:ToolcageEnvironment

- the image: ``[environment] docker_image`` of the task, as the engine has it (nothing is built or pulled),
  run unchanged; Harbor's paths (/logs, /tests, /solution, /tmp), the task's ``workdir`` (else the image's
  WORKDIR) and ``--ek writable=/a,/b`` are writable (a tmpfs each, filled with the image's content there:
  the image must have these directories);
- ``exec``: toolcage's ``exec`` tool, ``bash -c`` (``sh -c`` where the image has no bash) with cwd, env and
  timeout; a timeout raises ``RuntimeError`` as Harbor's Docker environment does;
- files: one tar per call through toolcage's upload and download streams (modes, symlinks, empty
  directories kept; what comes out is checked as hostile);
- users: see :mod:`toolcage.integrations.harbor_rules` (root runs as the sandbox user, other users are refused);
- network: no-network, or an allowlist of hostnames (``*.`` wildcards, public IPv4 addresses) through the
  egress proxy; ``public`` is refused unless ``--ek public=no-network``; a live change between the agent and
  the verifier phase through ``AsyncSandbox.update_network`` where this toolcage has it;
- ``stop``: the sandbox is removed, whatever ``delete`` says (a toolcage sandbox is never kept).

``--ek`` options: ``writable`` (extra paths, comma-separated), ``run_s`` (the sandbox's deadline),
``policy`` (a bundled policy name or file to extend, default ``default``), ``sandbox`` (``gvisor``),
``public`` (``refuse`` or ``no-network``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from inspect import signature
from pathlib import Path, PurePosixPath
from typing import Any

try:
    from harbor.environments.base import BaseEnvironment, ExecResult
    from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
    from harbor.models.task.config import NetworkPolicy
except ImportError as exc:
    from toolcage.integrations import raise_missing_extra

    raise_missing_extra(exc, "harbor", __name__)
    raise

from toolcage.aio import AsyncSandbox
from toolcage.errors import UsageError
from toolcage.integrations import harbor_rules as rules

ENV_TYPE = "toolcage"
DYNAMIC = hasattr(AsyncSandbox, "update_network")  # live network policy (the lead's contract, issue 39)
_PROBE = "command -v bash >/dev/null 2>&1 && echo bash || echo sh; pwd"


class ToolcageEnvironment(BaseEnvironment):  # type: ignore[misc,unused-ignore]
    """Harbor's ``BaseEnvironment`` over a toolcage sandbox (module docstring)."""

    def __init__(
        self,
        *args: Any,
        writable: str | list[str] | tuple[str, ...] = (),
        run_s: float | str = rules.DEFAULT_RUN_S,
        policy: str = "default",
        sandbox: str | None = None,
        public: str = "refuse",
        **kwargs: Any,
    ) -> None:
        # read by the base's validators inside super().__init__: set first
        self._public = public
        self._extra_writable = tuple(p for p in (writable.split(",") if isinstance(writable, str) else writable) if p)
        self._run_s = float(run_s)
        self._extends = policy
        self._kind = sandbox
        self._sandbox: AsyncSandbox | None = None
        self._shell = "bash"
        # (what, seconds): each start, exec call, transfer, and each command's own time inside ("process")
        self.timings: list[tuple[str, float]] = []
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return ENV_TYPE

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(**rules.CAPABILITIES, dynamic_network_policy=DYNAMIC)

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(**rules.RESOURCE_CAPABILITIES)

    def _validate_definition(self) -> None:
        if not self.task_env_config.docker_image:
            raise ValueError(
                "the toolcage environment runs the task's own image as the engine has it: set [environment] "
                "docker_image in task.toml (build it first: docker build -t NAME environment/); nothing is built"
            )
        if (self.environment_dir / "docker-compose.yaml").exists():
            raise ValueError("the toolcage environment runs one container: docker-compose.yaml is not supported")

    def validate_network_policy_support(self, network_policy: NetworkPolicy | None = None) -> None:
        super().validate_network_policy_support(network_policy)
        chosen = network_policy or self._network_policy
        rules.network(chosen.network_mode.value, chosen.allowed_hosts, changeable=False, public=self._public)

    # -- the sandbox ----------------------------------------------------------------------------------------
    def _changeable(self) -> bool:
        """Whether a phase asks for another policy than the start's: then the sandbox runs behind the proxy."""
        return DYNAMIC and any(p != self._network_policy for p in self._phase_network_policies)

    def _net(self, chosen: NetworkPolicy, changeable: bool) -> dict[str, Any]:
        return rules.network(
            chosen.network_mode.value, chosen.allowed_hosts, changeable=changeable, public=self._public
        )

    def _new_sandbox(self, workdir: str | None) -> AsyncSandbox:
        paths = rules.writable_paths(workdir, self._extra_writable)
        # the task's limits as Harbor resolves them (--override-cpus, an enforcement policy of "ignore")
        memory, size = rules.sizes(self._effective_memory_mb, self._effective_storage_mb, len(paths))
        net = self._net(self._network_policy, self._changeable())
        pol = rules.policy(net, memory=memory, cpus=self._effective_cpus, run_s=self._run_s, extends=self._extends)
        return AsyncSandbox(
            pol, image=self.task_env_config.docker_image, writable=paths, writable_size=size, tool="harbor",
            sandbox=self._kind,
        )  # fmt: skip

    async def _started(self, workdir: str | None) -> AsyncSandbox:
        sb = self._new_sandbox(workdir)
        try:
            await sb.start()
        except UsageError as exc:
            raise RuntimeError(f"toolcage could not start {self.task_env_config.docker_image}: {exc}") from exc
        return sb

    async def start(self, force_build: bool) -> None:
        began = time.monotonic()
        workdir = self.task_env_config.workdir
        sb = self._sandbox = await self._started(workdir)  # stop() closes it whatever fails from here
        probe = await sb.call("exec", {"argv": ["/bin/sh", "-c", _PROBE]})
        shell, _, cwd = (probe.result or {}).get("stdout", "").strip().partition("\n")
        self._shell = shell.strip() or "sh"
        cwd = cwd.strip()
        covered = any(cwd == p or cwd.startswith(p + "/") for p in rules.writable_paths(None, self._extra_writable))
        if not workdir and cwd not in ("", "/") and not covered:
            # the image's WORKDIR, which the task did not name: start again with it writable (about a second)
            self._sandbox = None
            await sb.close()
            sb = self._sandbox = await self._started(cwd)
        self.logger.info(
            f"toolcage sandbox run_id={sb.run_id} container={sb.name} image={self.task_env_config.docker_image}"
        )
        await self.ensure_dirs(self._mount_targets(writable_only=True))  # /logs/agent, /logs/verifier, ...
        self.timings.append(("start", time.monotonic() - began))
        await self._upload_environment_dir_after_start()

    async def stop(self, delete: bool) -> None:
        sb, self._sandbox = self._sandbox, None
        if sb is not None:
            await sb.close()  # removed whatever delete says: a toolcage sandbox is never kept
            spent: dict[str, list[float]] = {}
            for what, seconds in self.timings:
                spent.setdefault(what, []).append(seconds)
            times = " ".join(f"{k}={len(v)}/{sum(v):.3f}s" for k, v in spent.items())
            self.logger.info(f"toolcage sandbox run_id={sb.run_id} removed; calls/seconds: {times}")

    def _sb(self) -> AsyncSandbox:
        if self._sandbox is None:
            raise RuntimeError("the toolcage environment is not started")
        return self._sandbox

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        if self._sandbox is None:
            return  # start() takes self._network_policy, which the base sets after this
        update = self._sandbox.update_network  # type: ignore[attr-defined,unused-ignore]
        who = {"requested_by": f"harbor {self.session_id}"} if "requested_by" in signature(update).parameters else {}
        began = time.monotonic()
        change = await update(self._net(network_policy, True), **who)
        self.timings.append(("network", time.monotonic() - began))
        self.logger.info(f"toolcage network policy changed live: {network_policy.network_mode.value} ({change})")

    # -- exec -----------------------------------------------------------------------------------------------
    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        rules.check_user(self._resolve_user(user))
        params: dict[str, Any] = {"argv": [self._shell, "-c", command]}
        if cwd or self.task_env_config.workdir:
            params["cwd"] = cwd or self.task_env_config.workdir
        merged = self._merge_env(env)
        if merged:
            params["env"] = merged
        if timeout_sec:
            params["timeout_s"] = float(timeout_sec)
        began = time.monotonic()
        r = await self._sb().call("exec", params)
        self.timings.append(("exec", time.monotonic() - began))
        res = r.result
        if not isinstance(res, dict) or "exit_code" not in res:
            # the tool refused (a cwd that is not a directory, a TOOLCAGE_* variable): as a shell would
            message = (r.error or {}).get("message", str(r.status))
            return ExecResult(stdout="", stderr=f"toolcage exec: {message}\n", return_code=126)
        self.timings.append(("process", float(res.get("wall_ms") or 0) / 1000))  # the command's own time
        if res.get("timed_out"):
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        return ExecResult(stdout=res.get("stdout"), stderr=res.get("stderr"), return_code=rules.exit_code(res))

    # -- files: one tar per call ----------------------------------------------------------------------------
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        target = PurePosixPath(target_path)
        with tempfile.TemporaryDirectory(prefix="toolcage-harbor-") as tmp:
            staged = Path(tmp) / target.name  # the upload keeps a file's name: stage it under the target's
            try:
                os.link(source_path, staged)
            except OSError:
                shutil.copy2(source_path, staged)
            await self._timed("upload", self._sb().upload(staged, str(target.parent)))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self._timed("upload", self._sb().upload(source_dir, target_dir))

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".toolcage-harbor-", dir=target.parent) as tmp:
            await self._timed("download", self._sb().download(source_path, tmp))
            os.replace(Path(tmp) / PurePosixPath(source_path).name, target)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        Path(target_dir).mkdir(parents=True, exist_ok=True)
        await self._timed("download", self._sb().download(source_dir, target_dir))

    async def _timed(self, what: str, work: Any) -> None:
        began = time.monotonic()
        try:
            await work
        finally:
            self.timings.append((what, time.monotonic() - began))


__all__ = ["DYNAMIC", "ENV_TYPE", "ToolcageEnvironment"]
