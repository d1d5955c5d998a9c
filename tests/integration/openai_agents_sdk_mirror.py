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
import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from importlib import metadata
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from agents.sandbox.manifest import Manifest
from agents.sandbox.session.sandbox_session import SandboxSession

from toolcage.integrations.openai_agents import ToolcageSandboxClient, toolcage_session

OUTSIDE = "/scratch/mirror"  # where host directories beside the workspace are mirrored
_MUTATING = {"write", "mkdir", "rm", "mv", "hydrate_workspace", "apply_patch", "exec"}
_LIVE: list[Mirror] = []  # every mirror the running test made, closed after it


# the SDK's tests, from its sdist --------------------------------------------------------------------------


def sdk_tests(*files: str) -> dict[str, ModuleType]:
    """The SDK's test modules (``tests/sandbox/<file>``) from the released sdist of the installed version,
    fetched once with pip into a cache. A failure to fetch is an error that says why, never a skip."""
    version = metadata.version("openai-agents")
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cache = home / "toolcage-tests" / f"openai-agents-{version}"
    root = cache / "sdk"
    if not (root / "pyproject.toml").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        got = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps",
             f"openai-agents=={version}", "-d", str(cache)],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        sdists = sorted(cache.glob("openai_agents-*.tar.gz"))
        if got.returncode != 0 or not sdists:
            raise RuntimeError(
                f"could not fetch the openai-agents {version} sdist from PyPI (its tests run here): "
                f"{got.stderr.strip() or got.stdout.strip()}"
            )
        staging = Path(tempfile.mkdtemp(dir=cache))
        with tarfile.open(sdists[-1]) as tf:
            parts = [m.name.split("/") for m in tf]
            keep = [m for m, p in zip(tf, parts, strict=True) if p[1:2] == ["tests"] or p[1:] == ["pyproject.toml"]]
            tf.extractall(staging, members=keep, filter="data")
        (top,) = staging.iterdir()
        shutil.rmtree(root, ignore_errors=True)
        os.rename(top, root)
        shutil.rmtree(staging)
    # The SDK's own markers (its pyproject's), registered as its conftest would (this run has --strict-markers)
    config = getattr(pytest.mark, "_config", None)
    if config is not None:
        sdist_meta = tomllib.loads((root / "pyproject.toml").read_text())
        for line in sdist_meta["tool"]["pytest"]["ini_options"]["markers"]:
            config.addinivalue_line("markers", line)
    # The SDK's tests import their helpers as ``tests.*``, toolcage's own package name: lend them the name
    # while they load, then give it back (what they imported stays bound in their modules).
    ours = {k: v for k, v in sys.modules.items() if k == "tests" or k.startswith("tests.")}
    for k in ours:
        del sys.modules[k]
    sys.path.insert(0, str(root))
    out = {}
    try:
        for f in files:
            name = f"_openai_agents_sdk_{Path(f).stem}"
            spec = importlib.util.spec_from_file_location(name, root / "tests" / "sandbox" / f)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
            out[f] = mod
    finally:
        sys.path.remove(str(root))
        for k in [k for k in sys.modules if k == "tests" or k.startswith("tests.")]:
            del sys.modules[k]
        sys.modules.update(ours)
    return out


# the mirror ----------------------------------------------------------------------------------------------


class Mirror:
    """A toolcage session standing in for the SDK tests' host-backed session (module doc). It starts at
    its first call; every call is preceded by copying the host layout in (when it changed) and a call that
    may write is followed by copying ``/workspace`` back."""

    def __init__(self, workspace: Path, manifest: Manifest | None = None, *, base: Path | None = None) -> None:
        self._ws = workspace
        self._base = base if base is not None else workspace.parent
        root = "/workspace"
        self._manifest = (manifest or Manifest()).model_copy(update={"root": root})
        self._maps: dict[Path, str] = {workspace: root}
        self._session: SandboxSession | None = None
        self._seen: object = None
        self._fake_container = SimpleNamespace(archive_calls=[])  # the Docker tests look at it
        _LIVE.append(self)

    @property
    def state(self) -> Any:
        return self._session.state if self._session is not None else SimpleNamespace(manifest=self._manifest)

    async def _ensure(self) -> SandboxSession:
        if self._session is None:
            session = await ToolcageSandboxClient().create(manifest=self._manifest)
            await session.start()
            self._session = session
        return self._session

    def close(self) -> None:
        if self._session is not None:
            sb = toolcage_session(self._session)._sb
            if sb is not None:
                sb._sync.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_ws", "_base", "_manifest", "_maps", "_session", "_seen"):
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
                            out.append((at, "file", p.read_bytes()))
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
        files = {p: data for p, kind, data in layout if kind == "file"}
        if files:
            await sb.write_files(files)
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
        back = {v: k for k, v in self._maps.items()}
        for host, inside in self._maps.items():
            script = "cd \"$1\" && find . -mindepth 1 -printf '%y %p\\0%l\\0'"
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
                kind, rel = head.decode()[0], head.decode()[4:]
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
                    files.append((p, f"{inside}/{rel}"))
            if files:
                got = await sb.read_files([inside for _, inside in files])
                for p, inside_path in files:
                    p.write_bytes(got[inside_path])
        self._seen = self._layout()


class MirrorClient:
    """Stands in for ``UnixLocalSandboxClient()``: its sessions are mirrors of their host workspace root."""

    def __init__(self, **_: Any) -> None:
        pass

    async def create(self, *, manifest: Manifest | None = None, **_: Any) -> Mirror:
        root = Path((manifest or Manifest()).root)
        return Mirror(root, manifest)

    async def delete(self, session: Mirror) -> Mirror:
        session.close()
        return session


def host_backed_docker_session(*, host_root: Path, manifest: Manifest, **_: Any) -> Mirror:
    """Stands in for the Docker tests' ``_HostBackedDockerSession``: ``host_root/workspace`` is ``/workspace``."""
    return Mirror(host_root / "workspace", manifest, base=host_root)


def close_all() -> None:
    while _LIVE:
        _LIVE.pop().close()


__all__ = ["Mirror", "MirrorClient", "close_all", "host_backed_docker_session", "sdk_tests"]
