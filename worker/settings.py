"""What the worker knows about its run: the policy (canonical JSON from the runner) and its paths.

The policy is validated with the shared pydantic model on first use, not at start-up,
so a run's first response does not wait for pydantic to import.

Paths: tools always speak of ``/workspace`` and ``/scratch``. In a container those are the
real directories; with ``--sandbox none`` they are names for the local directories the runner
passes in ``TOOLCAGE_WORKSPACE`` / ``TOOLCAGE_SCRATCH`` (``workspace`` and ``scratch`` here).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from toolcage.policies import contract

if TYPE_CHECKING:
    from toolcage.policies import Policy
    from toolcage.worker.image import Image

WORKSPACE = contract.WORKSPACE  # the name of the project directory (read-only, or the run's writable copy)
SCRATCH = contract.SCRATCH  # the name of the writable directory, the children's working directory


def _mounted(path: str) -> bool:
    """Whether something is mounted at ``path`` (the image ships an empty /workspace: that is not a
    workspace). mountinfo is exact where st_dev is not (a bind from the rootfs's own file system)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            return any(line.split()[4:5] == [path] for line in f)
    except OSError:
        return os.path.ismount(path)


def _workspace_from_env() -> str | None:
    """``TOOLCAGE_WORKSPACE``: a directory (``--sandbox none``), empty for none; unset in a container,
    where /workspace is a workspace only if one was mounted there (or an image put files in it)."""
    env = os.environ.get(contract.ENV_WORKSPACE)
    if env is not None:
        return env or None
    if _mounted(WORKSPACE):  # first: a mounted workspace the sandbox user cannot list is still one
        return WORKSPACE
    try:
        return WORKSPACE if os.listdir(WORKSPACE) else None
    except OSError:
        return None


class Settings:
    """Everything the worker reads from its environment, read once at start (``from_env``): the runner's
    side of each name is ``policies.contract``."""

    def __init__(
        self,
        policy_json: str | None,
        workspace: str | None,
        scratch: str,
        run_id: str,
        *,
        deadline: str | None = None,
        watch_runner: bool = False,
        proxy_socket: str | None = None,
        pooled: bool = False,
        workspace_copy: bool = False,
        image: Image | None = None,
        image_roots: tuple[str, ...] = (),
    ) -> None:
        self._policy_json = policy_json
        self._policy: Policy | None = None
        # the real directories behind /workspace (None: no workspace in this run) and /scratch
        self.workspace = os.path.realpath(workspace) if workspace else None
        self.scratch = os.path.realpath(scratch)
        self.run_id = run_id
        self.deadline = deadline  # epoch seconds, as the runner wrote it (a pooled sandbox: set at adoption)
        self.watch_runner = watch_runner  # exit when the runner's end of the stream closes
        self.proxy_socket = proxy_socket  # network.mode proxy: the egress proxy's Unix socket
        self.pooled = pooled  # a warm pool's slot: ready what adoption needs while idle
        # /workspace is the run's writable copy (workspace_mode copy): the file tools write there too
        self.workspace_copy = workspace_copy and self.workspace is not None
        # a user's own image (not toolcage's): its ENV and WORKDIR, for the programs the tools run in it
        self.image = image
        # writable paths of the image (writable=: /testbed, /usr/local): a tmpfs each, filled by the runner;
        # the file tools, upload and download place paths under them as under /scratch (worker.tools.paths)
        self.image_roots = tuple(os.path.normpath(r) for r in image_roots if os.path.isabs(r) and r.strip("/"))
        # (the path rules are imported with the first file tool, not at start: lean start-up)
        if self.image_roots or "toolcage.worker.tools.paths" in sys.modules:
            from toolcage.worker.tools import paths

            paths.set_image_roots(self.image_roots)

    @property
    def writable_roots(self) -> tuple[str, ...]:
        """The roots a tool may write under, by their names: /scratch, /workspace when it is a copy, and the
        writable paths of the image."""
        return ((SCRATCH, WORKSPACE) if self.workspace_copy else (SCRATCH,)) + self.image_roots

    def real_root(self, name: str) -> str:
        """Where the root named ``name`` (/workspace, /scratch or a writable path of the image) is on this machine."""
        if name in self.image_roots:
            return name
        if name == WORKSPACE:
            assert self.workspace is not None
            return self.workspace
        return self.scratch

    @property
    def policy(self) -> Policy:
        if self._policy is None:
            from toolcage.policies import Policy, policy_from_json

            self._policy = policy_from_json(self._policy_json) if self._policy_json else Policy()
        return self._policy

    def replace_policy(self, policy: Policy) -> None:
        """A live policy change (``sandbox.network``): every later decision is made with ``policy``."""
        self._policy, self._policy_json = policy, policy.canonical_json()

    def warm(self) -> None:
        """Parse the policy now, while idle, if nothing has yet (a bad one is reported where it is used)."""
        if self._policy is None and self._policy_json:
            try:
                self.policy  # noqa: B018 - parsed and cached
            except Exception:  # noqa: S110 - the call that needs it reports it
                pass

    def child_env(self) -> dict[str, str]:
        """Where the roots are, for code run by run_python/run_shell, when they are not at their
        names (``--sandbox none``: no mount namespace there, so /workspace cannot exist for a
        child). Nothing in a container: its children see no TOOLCAGE_* (doctor's
        clean_child_environment probe), and portable code reads
        ``os.environ.get("TOOLCAGE_WORKSPACE", "/workspace")``."""
        env = {}
        if self.scratch != SCRATCH:
            env[contract.ENV_SCRATCH] = self.scratch
        if self.workspace is not None and self.workspace != WORKSPACE:
            env[contract.ENV_WORKSPACE] = self.workspace
        return env

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            policy_json=os.environ.get(contract.ENV_POLICY),
            workspace=_workspace_from_env(),
            scratch=os.environ.get(contract.ENV_SCRATCH, SCRATCH),
            run_id=os.environ.get(contract.ENV_RUN_ID, "local"),
            deadline=os.environ.get(contract.ENV_DEADLINE),
            watch_runner=os.environ.get(contract.ENV_WATCH_RUNNER) == "1",
            proxy_socket=os.environ.get(contract.ENV_PROXY_SOCKET) or None,
            pooled=os.environ.get(contract.ENV_POOLED) == "1",  # ("bare": a slot with nothing to ready)
            workspace_copy=os.environ.get(contract.ENV_WORKSPACE_COPY) == "1",
            image=_image_from_env(),
            image_roots=tuple(p for p in os.environ.get(contract.ENV_WRITABLE, "").split(":") if p),
        )


def _image_from_env() -> Image | None:
    if not os.environ.get(contract.ENV_IMAGE_CONFIG):
        return None
    from toolcage.worker import image

    return image.from_env()
