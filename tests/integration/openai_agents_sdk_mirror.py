"""Glue for ``test_openai_agents_sdk_suite.py``: the OpenAI Agents SDK's own sandbox tests, from its released
sdist, run against ``ToolcageSandboxClient``.

The SDK ships no client-conformance suite. Its tests of a sandbox session's file API are written against a
session whose files the test lays out on the host and checks there afterwards: the Docker client's tests use
``_HostBackedDockerSession(host_root=...)`` (``host_root/workspace`` standing for the container's
``/workspace``), the UnixLocal client's use a host workspace root. :class:`Mirror` stands in for both: a real
toolcage session (a container, through the public client) whose ``/workspace`` holds what the test laid out
in the host directory before each call, and whose result is copied back afterwards, symlinks as symlinks.
Host directories next to the workspace that a symlink points into (``host_root/outside``) are mirrored under
``/scratch/mirror/``, so a link out of ``/workspace`` leads somewhere real.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
import stat
import tarfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agents.sandbox.manifest import Manifest
from agents.sandbox.session.sandbox_session import SandboxSession

from toolcage.integrations.openai_agents import ToolcageSandboxClient, ToolcageSandboxClientOptions, toolcage_session

OUTSIDE = "/scratch/mirror"  # where host directories beside the workspace are mirrored
_MUTATING = {"write", "mkdir", "rm", "mv", "hydrate_workspace", "apply_patch", "exec"}
_LIVE: list[Mirror] = []  # every mirror the running test made, closed after it


# the mirror ----------------------------------------------------------------------------------------------


class Mirror:
    """A toolcage session standing in for the SDK tests' host-backed session (module doc). It starts at
    its first call (or ``start()``); every call is preceded by copying the host layout in (when it changed)
    and a call that may write is followed by copying ``/workspace`` back. A resumed session starts from its
    snapshot alone (a fresh container): nothing is copied in before its ``start()``."""

    _OWN = (
        "_ws", "_base", "_manifest", "_maps", "_session", "_seen", "_started", "_resumed", "_fake_container",
        "_host_paths", "_pending",
    )  # fmt: skip

    def __setattr__(self, name: str, value: Any) -> None:
        """The mirror's own state; anything else a test sets is the session's (given to it once it exists)."""
        if name in self._OWN:
            object.__setattr__(self, name, value)
        elif self._session is not None:
            setattr(toolcage_session(self._session), name, value)
        else:
            self._pending[name] = value

    def __init__(
        self,
        workspace: Path,
        manifest: Manifest | None = None,
        *,
        base: Path | None = None,
        session: SandboxSession | None = None,
        host_paths: bool = True,
    ) -> None:
        self._ws = workspace
        self._host_paths = host_paths  # archives show links by host paths (UnixLocal), or as in the sandbox
        self._pending: dict[str, Any] = {}
        self._base = base if base is not None else workspace.parent
        self._maps: dict[Path, str] = {workspace: "/workspace"}
        manifest = manifest or Manifest()
        grants = tuple(
            g.model_copy(update={"path": self._target(g.path)})
            for g in manifest.extra_path_grants
            if g.host_path is None
        )
        self._manifest = manifest.model_copy(update={"root": "/workspace", "extra_path_grants": grants})
        self._session = session
        self._started = False
        self._resumed = False
        self._seen: object = None
        self._fake_container = SimpleNamespace(archive_calls=[])  # the Docker tests look at it
        _LIVE.append(self)

    @property
    def state(self) -> Any:
        return self._session.state if self._session is not None else SimpleNamespace(manifest=self._manifest)

    def register_persist_workspace_skip_path(self, path: Path | str) -> Path:
        assert self._session is not None
        return self._session.register_persist_workspace_skip_path(path)

    async def _created(self) -> SandboxSession:
        if self._session is None:
            self._session = await ToolcageSandboxClient().create(manifest=self._manifest)
            for name, value in self._pending.items():
                setattr(toolcage_session(self._session), name, value)
        return self._session

    async def _ensure(self) -> SandboxSession:
        session = await self._created()
        if not self._started:
            await self.start()
        return session

    async def start(self) -> None:
        """The session's start; then a resumed one's files are copied out (its snapshot is the truth), a new
        one's in (the test's layout is)."""
        session = await self._created()
        await session.start()
        self._started = True
        if self._resumed:
            await self._pull()
        else:
            self._ws.mkdir(parents=True, exist_ok=True)
            await self._push()

    async def __aenter__(self) -> Mirror:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._session is not None
        await self._session.aclose()

    async def stop(self) -> None:
        await self._push()
        assert self._session is not None
        await self._session.stop()

    async def shutdown(self) -> None:
        if self._session is not None:
            await self._session.shutdown()

    async def running(self) -> bool:
        return self._session is not None and await self._session.running()

    def close(self) -> None:
        if self._session is not None:
            sb = toolcage_session(self._session)._sb
            if sb is not None:
                sb._sync.close()

    async def persist_workspace(self) -> Any:
        """The session's archive with absolute link targets shown as the host's paths (what the test laid
        out), as the mirrored client would have written them."""
        session = await self._ensure()
        await self._push()
        archive = await session.persist_workspace()
        return _relink(archive, {v: str(k) for k, v in self._maps.items()}) if self._host_paths else archive

    async def hydrate_workspace(self, data: Any) -> None:
        session = await self._ensure()
        await self._push()
        try:
            moves = {str(k): v for k, v in self._maps.items()}
            await session.hydrate_workspace(_relink(data, moves) if self._host_paths else data)
        finally:
            await self._pull()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in self._OWN:
            raise AttributeError(name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            session = await self._ensure()
            await self._push()
            try:
                return await getattr(session, name)(*args, **kwargs)
            finally:
                if name in _MUTATING:
                    await self._pull()

        return call

    # host -> sandbox
    def _target(self, link: str) -> str:
        """A host link target as the sandbox sees it: a host path under a mirrored directory is moved."""
        if not link.startswith("/"):
            return link
        norm = "/" + link.lstrip("/")
        for host, inside in self._maps.items():
            h = str(host)
            if norm == h or norm.startswith(h + "/"):
                return inside + norm[len(h) :]
        try:
            rel = Path(norm).relative_to(self._base)
        except ValueError:
            return link
        if rel.parts and (self._base / rel.parts[0]).is_dir() and self._base / rel.parts[0] != self._ws:
            top = self._base / rel.parts[0]
            self._maps[top] = f"{OUTSIDE}/{rel.parts[0]}"
            return self._target(link)
        return link

    def _layout(self) -> list[tuple[str, str, Any]]:
        """(sandbox path, kind, content or target) for every entry of the mirrored host directories."""
        out: list[tuple[str, str, Any]] = []
        done: set[Path] = set()
        while set(self._maps) - done:
            for host, inside in list(self._maps.items()):
                if host in done:
                    continue
                done.add(host)
                out.append((inside, "dir", None))
                for dirpath, dirnames, filenames in os.walk(host):
                    for n in sorted(dirnames + filenames):
                        p = Path(dirpath) / n
                        at = inside + "/" + p.relative_to(host).as_posix()
                        st = p.lstat()
                        if stat.S_ISLNK(st.st_mode):
                            out.append((at, "link", self._target(os.readlink(p))))
                        elif stat.S_ISDIR(st.st_mode):
                            out.append((at, "dir", None))
                        elif stat.S_ISFIFO(st.st_mode):
                            out.append((at, "fifo", None))
                        elif stat.S_ISREG(st.st_mode):
                            out.append((at, "file", (p.read_bytes(), stat.S_IMODE(st.st_mode))))
                    dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
        return out

    async def _push(self) -> None:
        layout = self._layout()
        if layout == self._seen:
            return
        sb = toolcage_session(await self._ensure()).sandbox
        dirs = [p for p, kind, _ in layout if kind == "dir"]
        script = 'for d in "$@"; do mkdir -p "$d" && find "$d" -mindepth 1 -delete; done'
        clear = ["/workspace", *(v for v in self._maps.values() if v != "/workspace")]
        await sb.call("exec", {"argv": ["sh", "-c", script, "sh", *clear]})
        files = {p: data for p, kind, (data, _) in ((p, k, d) for p, k, d in layout if k == "file")}
        if files:
            await sb.write_files(files)
        modes = [a for p, kind, d in layout if kind == "file" for a in (f"{d[1]:o}", p)]
        script = 'while [ $# -gt 0 ]; do chmod "$1" "$2"; shift 2; done'
        await sb.call("exec", {"argv": ["sh", "-c", script, "sh", *modes]})
        ln = [a for p, kind, t in layout if kind == "link" for a in (t, p)]
        fifos = [p for p, kind, _ in layout if kind == "fifo"]
        script = 'mkdir -p "$@"' if dirs else "true"
        await sb.call("exec", {"argv": ["sh", "-c", script, "sh", *dirs]})
        script = 'while [ $# -gt 0 ]; do ln -s -- "$1" "$2"; shift 2; done'
        await sb.call("exec", {"argv": ["sh", "-c", script, "sh", *ln]})
        if fifos:
            await sb.call("exec", {"argv": ["mkfifo", "--", *fifos]})
        self._seen = layout

    # sandbox -> host
    async def _pull(self) -> None:
        sb = toolcage_session(await self._ensure()).sandbox
        back = {v: k for k, v in self._maps.items()}  # a link's target shown as the host's path again
        for host, inside in ((self._ws, "/workspace"),):  # the other directories are only copied in
            script = "cd \"$1\" && find . -mindepth 1 -printf '%y %m %p\\0%l\\0'"
            res = await sb.call("exec", {"argv": ["sh", "-c", script, "sh", inside]})
            r = res.result if isinstance(res.result, dict) else {}
            raw = base64.b64decode(r["stdout_b64"]) if "stdout_b64" in r else str(r.get("stdout", "")).encode()
            for child in list(host.iterdir()) if host.is_dir() else []:
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            host.mkdir(parents=True, exist_ok=True)
            fields = raw.split(b"\0")
            files = []
            for head, link in zip(fields[::2], fields[1::2], strict=False):
                kind, mode, rel = head.decode().split(" ", 2)
                rel = rel.removeprefix("./")
                p = host / rel
                if kind == "d":
                    p.mkdir(parents=True, exist_ok=True)
                elif kind == "l":
                    target = link.decode()
                    for inside_dir, host_dir in back.items():
                        if target == inside_dir or target.startswith(inside_dir + "/"):
                            target = str(host_dir) + target[len(inside_dir) :]
                    os.symlink(target, p)
                elif kind == "f":
                    files.append((p, f"{inside}/{rel}", int(mode, 8)))
            if files:
                got = await sb.read_files([inside for _, inside, _ in files])
                for p, inside_path, mode in files:
                    p.write_bytes(got[inside_path])
                    p.chmod(mode)
        self._seen = self._layout()


def _relink(data: Any, moves: dict[str, str]) -> io.BytesIO:
    """A tar with each absolute link target under a key of ``moves`` moved to its value."""
    out = io.BytesIO()
    with (
        data,
        tarfile.open(fileobj=data, mode="r:*") as src,
        tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst,
    ):
        for m in src:
            if m.issym() and m.linkname.startswith("/"):
                norm = "/" + m.linkname.lstrip("/")
                for old, new in moves.items():
                    if norm == old or norm.startswith(old + "/"):
                        m.linkname = new + norm[len(old) :]
                        m.pax_headers.pop("linkpath", None)
            dst.addfile(m, src.extractfile(m) if m.isreg() else None)
    out.seek(0)
    return out


class MirrorClient:
    """Stands in for ``UnixLocalSandboxClient()``: its sessions are mirrors of their host workspace root (its
    options' ``exposed_ports`` become toolcage's);
    ``resume`` resumes the real session state through ``ToolcageSandboxClient`` (a fresh container)."""

    def __init__(self, **_: Any) -> None:
        self._client = ToolcageSandboxClient()
        self._roots: dict[object, Path] = {}

    async def create(
        self, *, manifest: Manifest | None = None, snapshot: Any = None, options: Any = None, **_: Any
    ) -> Mirror:
        root = Path((manifest or Manifest()).root)
        if options is not None and not isinstance(options, ToolcageSandboxClientOptions):  # UnixLocal's own
            options = ToolcageSandboxClientOptions(exposed_ports=tuple(getattr(options, "exposed_ports", ())))
        mirror = Mirror(root, manifest)
        mirror._session = await self._client.create(manifest=mirror._manifest, snapshot=snapshot, options=options)
        self._roots[mirror._session.state.session_id] = root
        return mirror

    async def resume(self, state: Any) -> Mirror:
        mirror = Mirror(self._roots[state.session_id], session=await self._client.resume(state))
        mirror._resumed = True
        return mirror

    async def delete(self, session: Mirror) -> Mirror:
        session.close()
        return session


def host_backed_docker_session(*, host_root: Path, manifest: Manifest, **_: Any) -> Mirror:
    """Stands in for the Docker tests' ``_HostBackedDockerSession``: ``host_root/workspace`` is ``/workspace``."""
    return Mirror(host_root / "workspace", manifest, base=host_root, host_paths=False)


def close_all() -> None:
    while _LIVE:
        _LIVE.pop().close()


__all__ = ["Mirror", "MirrorClient", "close_all", "host_backed_docker_session"]
