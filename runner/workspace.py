"""Validate a workspace before it is bind-mounted (read-only) into a sandbox or copied into one.

Threats: a careless or hostile caller mounting the host's secrets (``/``, ``/etc``,
``~/.ssh``, the Docker socket, which is root on the host) into code it does not trust; and
host services reached through the mount: connect() to a Unix socket (and writing a FIFO)
works through a read-only bind mount, so a sandbox with no network at all could talk to an
ssh-agent, a database or a dev server whose socket lies in the workspace. And toolcage's own
state (its snapshot key: a sandbox that read it could forge a snapshot the host resumes) and the
credential stores of any user's home, wherever they lie in the tree: the same refusals hold for the
read-only mount and the writable copy (which reads the tree with the runner's own rights).
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path, PurePosixPath
from typing import NoReturn

from toolcage.errors import WorkspaceError

# Never mount these, nor anything inside them, nor any directory that contains them (/var holds /var/lib/docker).
_FORBIDDEN_TREES = (
    "/proc",
    "/sys",
    "/dev",
    "/etc",
    "/boot",
    "/root",
    "/run",
    "/var/run",
    "/var/lib/docker",
    "/var/lib/containerd",
    "/var/lib/containers",
    "/var/lib/kubelet",
)
# Never mount these themselves: shared with every user and service on the host (sockets, other
# users' files), while their children may be projects (pytest's tmp_path, /var/lib/jenkins/workspace/job).
_FORBIDDEN_EXACT = (
    "/",
    "/home",
    "/usr",
    "/var",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/opt",
    "/srv",
    "/mnt",
    "/media",
    "/tmp",
    "/var/tmp",
    "/var/lib",
)
# Secrets in a home directory: refuse them and any directory that contains them.
_HOME_SECRETS = (".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".config/gcloud", ".netrc", ".pgpass")
# Held in a directory of that name only when it holds the tool's credentials: projects have .docker/ and .kube/ too.
_STORE_FILES = {
    ".docker": ("config.json",),
    ".kube": ("config",),
    ".azure": ("accessTokens.json", "msal_token_cache.json", "msal_token_cache.bin", "azureProfile.json"),
}
_STATE = (".local", "state", "toolcage")  # toolcage's default state directory in any home
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


def _store_named(parts: tuple[str, ...]) -> str | None:
    """The credential store (or toolcage state directory) a path's own components are, or are inside, by name."""
    for secret in (*_HOME_SECRETS, "/".join(_STATE)):
        names = tuple(secret.split("/"))
        if any(parts[i : i + len(names)] == names for i in range(len(parts))):
            return secret
    if parts[-1:] == _STATE[:1] or parts[-2:] == _STATE[:2]:
        return "/".join(_STATE)  # .local or .local/state: they hold toolcage's state
    return None


def state_dir() -> Path:
    """toolcage's state directory (``$XDG_STATE_HOME/toolcage``, else ``~/.local/state/toolcage``): the snapshot
    key and the default audit log live there, so no workspace may hold it."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "toolcage"


def _state_dirs() -> list[Path]:
    """toolcage's state directories: where the snapshot key is now ($XDG_STATE_HOME/toolcage) and the default."""
    dirs = [state_dir(), Path.home().joinpath(*_STATE)]
    return [Path(os.path.realpath(d)) for d in dirs]


def _homes() -> dict[Path, str]:
    """Every user's home directory (the password database), with its user: "/" is nobody's home here."""
    homes: dict[Path, str] = {}
    for entry in pwd.getpwall():
        if entry.pw_dir.startswith("/") and entry.pw_dir.rstrip("/"):
            homes.setdefault(Path(os.path.realpath(entry.pw_dir)), entry.pw_name)
    return homes


def _refuse_state_and_homes(path: Path) -> None:
    """Threat: the snapshot key (a forged snapshot resumed by the host) and any user's secrets in the mount or copy."""
    for state in _state_dirs():
        if _within(path, state) or _within(state, path):
            raise WorkspaceError(
                f"refusing to mount {str(path)!r}: it is or contains toolcage's state directory {str(state)!r} "
                "(its snapshot key signs the snapshots this host resumes)"
            )
    store = _store_named(path.parts)
    if store is not None:
        raise WorkspaceError(f"refusing to mount {str(path)!r}: it is or is inside a {store} directory")
    if path.parent == Path("/home"):
        raise WorkspaceError(f"refusing to mount {str(path)!r}: it is a home directory; mount a project directory")
    for home, user in _homes().items():
        if path == home:
            raise WorkspaceError(f"refusing to mount {str(path)!r}: it is the home directory of {user!r}")
        if path in home.parents:
            raise WorkspaceError(f"refusing to mount {str(path)!r}: it contains the home directory of {user!r}")


def validate_workspace(raw: str | os.PathLike[str], what: str = "workspace", file_ok: bool = False) -> Path:
    """Return the resolved workspace (or another path to mount read-only: ``what`` names it in
    errors, ``file_ok`` allows a single file), or raise WorkspaceError saying why it cannot be mounted."""
    if not os.fspath(raw):  # Path("") is ".": an unset variable ("--workspace $WS") would mount the current directory
        raise WorkspaceError(f'{what} is an empty path; name a directory ("." for the current one)')
    given = Path(raw).expanduser()
    try:
        path = given.resolve(strict=True)
    except FileNotFoundError:
        raise WorkspaceError(f"{what} {str(given)!r} does not exist") from None
    except (OSError, RuntimeError) as exc:
        raise WorkspaceError(f"{what} {str(given)!r} cannot be resolved: {exc}") from None
    if not (path.is_dir() or (file_ok and path.is_file())):
        raise WorkspaceError(f"{what} {str(path)!r} is not a {'file or ' if file_ok else ''}directory")
    home = Path.home().resolve()
    for tree in _FORBIDDEN_TREES:
        # root's home is /root: a root user's projects under it are allowed like anyone's under
        # their home (the home itself and its secrets are refused below)
        if Path(tree) == home and path != home:
            continue
        if _within(path, Path(tree)):
            raise WorkspaceError(f"refusing to mount {str(path)!r}: it is inside {tree}, which holds host secrets")
        if Path(tree) != home and path in Path(tree).parents:
            raise WorkspaceError(f"refusing to mount {str(path)!r}: it contains {tree}, which holds host secrets")
    if str(path) in _FORBIDDEN_EXACT:
        raise WorkspaceError(
            f"refusing to mount {str(path)!r}: too broad, shared with the whole host; mount a project directory instead"
        )
    if path == home:
        raise WorkspaceError(f"refusing to mount your home directory {str(path)!r}; mount a project directory")
    for secret in _HOME_SECRETS:
        target = home / secret
        if _within(path, target) or _within(target, path):
            raise WorkspaceError(f"refusing to mount {str(path)!r}: it is or contains {str(target)!r}")
    _refuse_state_and_homes(path)
    for sock in _engine_sockets():
        if _within(sock, path):
            raise WorkspaceError(f"refusing to mount {str(path)!r}: it contains the container engine socket {sock}")
    special = find_special_file(path) if path.is_dir() else None
    if special is not None:
        found, kind = special
        if kind not in _SPECIAL_KINDS:
            raise WorkspaceError(
                f"refusing to mount {str(path)!r}: it holds {kind}, {str(found)!r}: a user's secrets; "
                "mount a directory without it"
            )
        raise WorkspaceError(
            f"refusing to mount {str(path)!r}: it contains a {kind}, {str(found)!r}, which the sandbox could use to "
            "reach a host process or device through the read-only mount; move it out of the workspace"
        )
    return path


def check_host_path(host: str, local: str, what: str = "workspace") -> None:
    """The refusals above, again on the path the engine's host will mount (a runner in a container
    checked its own view, where the host's /etc can be /data/hostetc). The runner cannot look at
    the host, so only the name is checked: the refused trees and exact directories, a home
    directory itself (/root, /home/NAME), a home's secrets anywhere in it, the engine sockets."""
    path = PurePosixPath(os.path.normpath(host))

    def refuse(why: str) -> NoReturn:
        raise WorkspaceError(f"refusing to mount {what} {local!r} (on the engine's host: {str(path)!r}): {why}")

    for tree in (PurePosixPath(t) for t in _FORBIDDEN_TREES):
        # /root/<project> is a root user's project, as on the host; /root itself is a home (below)
        if tree == PurePosixPath("/root") and path != tree:
            continue
        if path == tree or tree in path.parents:
            refuse(f"it is inside {tree}, which holds host secrets")
        if path in tree.parents:
            refuse(f"it contains {tree}, which holds host secrets")
    if str(path) in _FORBIDDEN_EXACT:
        refuse("too broad, shared with the whole host; mount a project directory instead")
    if path.parent == PurePosixPath("/home"):
        refuse("it is a home directory; mount a project directory")
    store = _store_named(path.parts)
    if store is not None:
        refuse(f"it is, holds or is inside a {store} directory")
    for sock in _SOCKETS:
        if path == PurePosixPath(sock) or path in PurePosixPath(sock).parents:
            refuse(f"it contains the container engine socket {sock}")


_SPECIAL = (
    (stat.S_ISSOCK, "Unix socket"),
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISCHR, "device node"),
    (stat.S_ISBLK, "device node"),
)
_SPECIAL_KINDS = {kind for _, kind in _SPECIAL}


def _store_in(d: str, entry: os.DirEntry[str], is_dir: bool) -> str | None:
    """What credential store (or toolcage state) the entry ``entry`` of directory ``d`` is, any user's: None if none."""
    name = entry.name
    if is_dir:
        if name in (".ssh", ".gnupg", ".aws") or (name == "gcloud" and os.path.basename(d) == ".config"):
            return f"a credential store ({name})"
        if name in _STORE_FILES and any(os.path.lexists(os.path.join(entry.path, f)) for f in _STORE_FILES[name]):
            return f"a credential store ({name})"
        if name == _STATE[2] and Path(d).parts[-2:] == _STATE[:2]:
            return "a toolcage state directory"
    elif name in (".netrc", ".pgpass"):
        return f"a credential store ({name})"
    elif name == "snapshot.key" and os.path.basename(d) == _STATE[2]:
        return "a toolcage state directory (a snapshot key)"
    return None


def find_special_file(top: Path) -> tuple[Path, str] | None:
    """The first socket, FIFO or device node under ``top`` (symlinks not followed), or credential store of
    any user's (.ssh, .gnupg, .aws, a .docker/.kube/.azure holding credentials, .config/gcloud, .netrc,
    .pgpass) or toolcage state directory (the kind says which), else None.

    os.scandir gives each entry's type from getdents (d_type): only entries that are neither
    directories, regular files nor symlinks cost an lstat. A directory the runner cannot list
    is skipped when others cannot search it either (the sandbox, uid 65532, is "other"), and
    refused when they can, since it could hide a socket the sandbox can reach.
    """
    stack = [top]
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except PermissionError:
            if os.lstat(d).st_mode & 0o001:
                raise WorkspaceError(
                    f"refusing to mount {str(top)!r}: {str(d)!r} cannot be checked for sockets (permission denied) "
                    "but the sandbox could enter it"
                ) from None
            continue
        except FileNotFoundError:
            continue
        with it:
            for entry in it:
                is_dir = entry.is_dir(follow_symlinks=False)
                if is_dir or entry.is_file(follow_symlinks=False):
                    store = _store_in(str(d), entry, is_dir)
                    if store is not None:
                        return Path(entry.path), store
                if is_dir:
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False) or entry.is_symlink():
                    continue
                else:
                    try:
                        mode = entry.stat(follow_symlinks=False).st_mode
                    except FileNotFoundError:
                        continue
                    for test, kind in _SPECIAL:
                        if test(mode):
                            return Path(entry.path), kind
    return None


def readable_by_sandbox(path: Path) -> bool:
    """Whether uid 65532 (neither owner nor group here) can list the directory: o+rx."""
    mode = path.stat().st_mode
    return bool(mode & 0o005 == 0o005)
