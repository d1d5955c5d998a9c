"""Validate a workspace before it is bind-mounted (read-only) into a sandbox.

Threat: a careless or hostile caller mounting the host's secrets (``/``, ``/etc``,
``~/.ssh``, the Docker socket, which is root on the host) into code it does not trust.
"""

from __future__ import annotations

import os
from pathlib import Path

from runner.errors import WorkspaceError

# Never mount these, nor anything inside them.
_FORBIDDEN_TREES = ("/proc", "/sys", "/dev", "/etc", "/boot", "/root", "/run", "/var/run", "/var/lib/docker")
# Never mount these themselves (their children may be fine: /home/me/project).
_FORBIDDEN_EXACT = ("/", "/home", "/usr", "/var", "/bin", "/sbin", "/lib", "/lib64", "/opt", "/srv", "/mnt", "/media")
# Secrets in a home directory: refuse them and any directory that contains them.
_HOME_SECRETS = (".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".config/gcloud", ".netrc", ".pgpass")
_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock")


def _engine_sockets() -> list[Path]:
    """The well-known engine sockets, and the one DOCKER_HOST names (rootless and custom set-ups
    put it under a home or a project directory, where the tree checks above do not reach)."""
    socks = [Path(s) for s in _SOCKETS]
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        socks.append(Path(host[len("unix://") :]).expanduser().resolve())
    return socks


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def validate_workspace(raw: str | os.PathLike[str]) -> Path:
    """Return the resolved workspace, or raise WorkspaceError saying why it cannot be mounted."""
    given = Path(raw).expanduser()
    try:
        path = given.resolve(strict=True)
    except FileNotFoundError:
        raise WorkspaceError(f"workspace {str(given)!r} does not exist") from None
    except (OSError, RuntimeError) as exc:
        raise WorkspaceError(f"workspace {str(given)!r} cannot be resolved: {exc}") from None
    if not path.is_dir():
        raise WorkspaceError(f"workspace {str(path)!r} is not a directory")
    home = Path.home().resolve()
    for tree in _FORBIDDEN_TREES:
        # root's home is /root: a root user's projects under it are allowed like anyone's under
        # their home (the home itself and its secrets are refused below)
        if Path(tree) == home and path != home:
            continue
        if _within(path, Path(tree)):
            raise WorkspaceError(f"refusing to mount {str(path)!r}: it is inside {tree}, which holds host secrets")
    if str(path) in _FORBIDDEN_EXACT:
        raise WorkspaceError(f"refusing to mount {str(path)!r}: too broad; mount a project directory instead")
    if path == home:
        raise WorkspaceError(f"refusing to mount your home directory {str(path)!r}; mount a project directory")
    for secret in _HOME_SECRETS:
        target = home / secret
        if _within(path, target) or _within(target, path):
            raise WorkspaceError(f"refusing to mount {str(path)!r}: it is or contains {str(target)!r}")
    for sock in _engine_sockets():
        if _within(sock, path):
            raise WorkspaceError(f"refusing to mount {str(path)!r}: it contains the container engine socket {sock}")
    return path


def readable_by_sandbox(path: Path) -> bool:
    """Whether uid 65532 (neither owner nor group here) can list the directory: o+rx."""
    mode = path.stat().st_mode
    return bool(mode & 0o005 == 0o005)
