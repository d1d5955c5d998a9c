"""The one module that imports docker-py: every Engine call, with foreign errors translated once.

Swapping the Docker client touches this file only. Which engine answers (Docker or Podman's Docker-compatible
service) is told apart in ``api`` and what each takes differently is a value in ``knobs`` (``FlavorKnobs``).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import requests.exceptions

from toolcage.engine.api import detect_flavor, podman_ping
from toolcage.engine.knobs import FlavorKnobs
from toolcage.errors import DockerUnavailable, SandboxError, image_missing

if TYPE_CHECKING:
    from toolcage.engine.api import EngineAPI

API_VERSION = "1.41"  # Docker Engine 20.10+; fixed so no /version round trip on connect
_CONFLICT = 409
_UNREACHABLE = (
    "Cannot reach the Docker engine ({detail}). Start Docker (e.g. `sudo systemctl start docker` "
    "or `sudo dockerd &`), or set DOCKER_HOST to a reachable engine."
)


def _translate(exc: Exception, image: str | None = None) -> SandboxError:
    """docker-py's and requests' errors, by type and HTTP status (never by message text)."""
    if isinstance(exc, docker.errors.ImageNotFound):  # docker-py: a 404 about an image
        return image_missing(image)
    if isinstance(exc, requests.exceptions.ConnectionError | ConnectionError | FileNotFoundError):
        # FileNotFoundError: the engine's Unix socket does not exist
        return DockerUnavailable(_UNREACHABLE.format(detail=type(exc).__name__))
    if isinstance(exc, docker.errors.APIError):
        return SandboxError(f"Docker refused the request: {exc.explanation or exc}", http_status=exc.status_code)
    if isinstance(exc, docker.errors.DockerException):
        # client-side, before any request: a DOCKER_HOST or TLS setting docker-py cannot use
        return DockerUnavailable(_UNREACHABLE.format(detail=str(exc)))
    return SandboxError(f"Docker call failed: {type(exc).__name__}: {exc}")


_RAISE: Any = object()
_REMOVE_TRIES = 6  # sleeps 0.1 + 0.2 + ... + 0.5 s between them
_REMOVING_WAIT_S = 10.0  # how long remove() waits for another's removal of the same container to end


def _call(fn: Callable[..., Any], *args: Any, on_missing: Any = _RAISE, image: str | None = None, **kw: Any) -> Any:
    """Call docker-py; a NotFound becomes ``on_missing`` when given; everything else is translated."""
    try:
        return fn(*args, **kw)
    except docker.errors.NotFound as exc:
        if on_missing is not _RAISE:
            return on_missing
        raise _translate(exc, image) from exc
    except Exception as exc:
        raise _translate(exc, image) from exc


def _raw(sock: Any) -> tuple[socket.socket, Callable[[], None]]:
    """The socket under docker-py's hijacked response, and a function closing it with its wrappers."""
    raw = getattr(sock, "_sock", sock)
    assert isinstance(raw, socket.socket)

    def close() -> None:
        for obj in (raw, sock, getattr(sock, "_response", None)):
            try:
                if obj is not None:
                    obj.close()
            except Exception:  # noqa: S110 - closing is best effort
                pass

    return raw, close


class Engine:
    """A thin, translated view of the Docker Engine API; satisfies ``toolcage.engine.api.EngineAPI``."""

    _default: Engine | None = None

    def __init__(self, base_url: str | None = None, timeout: float = 60) -> None:
        self._flavor: FlavorKnobs | None = None
        try:
            if base_url:
                self.api = docker.APIClient(base_url=base_url, version=API_VERSION, timeout=timeout)
            else:
                self.api = docker.from_env(version=API_VERSION, timeout=timeout).api
        except docker.errors.DockerException as exc:
            raise _translate(exc) from exc

    @classmethod
    def default(cls) -> Engine:
        """One shared client per process (from DOCKER_HOST or the local socket): reuses its connections."""
        if cls._default is None:
            cls._default = cls()
        return cls._default

    def flavor(self) -> FlavorKnobs:
        """Which engine this is, as the knobs its API needs (Podman's Docker-compatible service, or
        Docker), asked once per engine. SandboxError (with the fix) for an engine that cannot enforce
        a sandbox's limits."""
        if self._flavor is None:
            self._flavor = detect_flavor(podman_ping(self._ping_headers()), self.info)
        return self._flavor

    def _ping_headers(self) -> Any:
        """The headers of ``GET /_ping`` (DockerUnavailable when nothing answers)."""

        def ping() -> Any:
            response = self.api._get(self.api._url("/_ping"))
            self.api._raise_for_status(response)
            return response.headers

        return _call(ping)

    def ping(self) -> dict[str, Any]:
        """The engine's version info, or DockerUnavailable."""
        return dict(_call(self.api.version))

    def info(self) -> dict[str, Any]:
        return dict(_call(self.api.info))

    # images -------------------------------------------------------------------------
    def image(self, ref: str) -> dict[str, Any] | None:
        found = _call(self.api.inspect_image, ref, on_missing=None)
        return dict(found) if found is not None else None

    def pull(self, ref: str) -> bool:
        """Try to pull; False when no registry answers (this is not an error here)."""
        repo, _, tag = ref.rpartition(":") if ":" in ref.split("/")[-1] else (ref, "", "latest")
        try:
            _call(self.api.pull, repo, tag=tag)
        except SandboxError as exc:
            if isinstance(exc, DockerUnavailable):
                raise
            return False
        return True

    def import_tarball(self, path: str, repository: str, tag: str) -> None:
        _call(self.api.import_image_from_file, path, repository=repository, tag=tag)

    def save_image(self, ref: str) -> Iterator[bytes]:
        """The image as ``docker save`` writes it (a tar stream, in chunks), for an engine with no registry."""
        chunks = _call(self.api.get_image, ref, chunk_size=1 << 20, image=ref)
        return iter(chunks)

    def archive(self, cid: str, path: str) -> tuple[Iterator[bytes], dict[str, Any]] | None:
        """``GET /containers/{cid}/archive?path=PATH``: the tree at ``path`` as a tar stream (in chunks), read
        by the engine from the container's layers as root, and its stat (name, size, mode, linkTarget); None
        when there is nothing at ``path`` (toolcage.files.imagepaths)."""
        got = _call(self.api.get_archive, cid, path, chunk_size=1 << 20, on_missing=None)
        if got is None:
            return None
        stream, st = got
        return iter(stream), dict(st or {})

    def load_image(self, data: bytes | Iterator[bytes]) -> None:
        """``docker load`` of a ``save_image`` stream; the image keeps its id and tags."""
        out = _call(self.api.load_image, data, quiet=True)
        for msg in out or ():
            if isinstance(msg, dict) and msg.get("error"):
                raise SandboxError(f"the engine could not load the image: {msg['error']}")

    def build(
        self, context: str, tag: str, buildargs: dict[str, str], labels: dict[str, str]
    ) -> Iterator[dict[str, Any]]:
        """Build with no network and no pull; yields the engine's progress messages."""
        try:
            yield from self.api.build(
                path=context,
                tag=tag,
                buildargs=buildargs,
                labels=labels,
                network_mode="none",
                pull=False,
                rm=True,
                forcerm=True,
                decode=True,
            )
        except Exception as exc:
            raise _translate(exc) from exc

    # containers ---------------------------------------------------------------------
    def create(self, config: dict[str, Any], name: str) -> str:
        image = config.get("Image")
        made = _call(self.api.create_container_from_config, config, name=name, image=image)
        # Docker creates the container and only warns when the kernel or a rootless set-up cannot apply
        # a limit ("... Limitation discarded."): a sandbox without its limits is not made at all
        dropped = [w for w in made.get("Warnings") or [] if "discarded" in str(w).lower()]
        if dropped:
            _call(self.api.remove_container, made["Id"], force=True, on_missing=None)
            raise SandboxError(f"the engine cannot enforce this sandbox's limits: {'; '.join(map(str, dropped))}")
        return str(made["Id"])

    def attach(self, cid: str) -> tuple[socket.socket, Callable[[], None]]:
        """A raw, bidirectional socket on the container's stdin/stdout/stderr (multiplexed),
        and a function that closes it together with docker-py's wrappers around it."""
        sock = _call(self.api.attach_socket, cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        return _raw(sock)

    def exec_socket(self, cid: str, cmd: list[str], user: str) -> tuple[socket.socket, Callable[[], None]]:
        """Run ``cmd`` in the running container ``cid`` as ``user`` (no tty, not privileged, the container's
        own env) and return a raw socket on its stdin (written as is; ``shutdown(SHUT_WR)`` closes it) and its
        stdout/stderr (multiplexed in 8-byte frames), with a function closing it. The process lives until it
        exits or the container ends: the engine cannot kill an exec."""
        made = _call(
            self.api.exec_create, cid, cmd, stdout=True, stderr=True, stdin=True, tty=False, privileged=False,
            user=user,
        )  # fmt: skip
        sock = _call(self.api.exec_start, made["Id"], detach=False, tty=False, socket=True)
        return _raw(sock)

    def start(self, cid: str) -> None:
        _call(self.api.start, cid)

    def kill(self, cid: str, signal: str = "SIGKILL") -> None:
        try:
            _call(self.api.kill, cid, signal=signal, on_missing=None)
        except SandboxError as exc:
            if isinstance(exc, DockerUnavailable):
                raise  # anything else: already stopped or gone, the goal is reached

    def inspect(self, cid: str) -> dict[str, Any] | None:
        found = _call(self.api.inspect_container, cid, on_missing=None)
        return dict(found) if found is not None else None

    def wait(self, cid: str, timeout: float) -> int | None:
        try:
            return int(self.api.wait(cid, timeout=timeout)["StatusCode"])
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError, docker.errors.NotFound):
            return None
        except Exception as exc:
            raise _translate(exc) from exc

    def remove(self, cid: str) -> None:
        # Podman's service sometimes answers 500 ("could not be stopped: sending SIGKILL") for a
        # container whose process has just exited; a moment later the removal goes through (seen in
        # CI: tests/integration/test_podman.py). A 5xx is tried again, for about 2 s in all.
        for attempt in range(_REMOVE_TRIES):
            try:
                self.api.remove_container(cid, force=True, v=True)
                return
            except docker.errors.NotFound:
                return  # already gone: the goal is reached
            except docker.errors.APIError as exc:
                if exc.status_code == _CONFLICT:
                    # with force=True, 409 means another removal of it is already under way (the reaper of
                    # another process, gc, a user's docker rm). Returning at once would let the caller's next
                    # step, its volumes, find them still in use (seen in CI): wait for that removal to end.
                    self._wait_gone(cid)
                    return
                if exc.is_server_error() and attempt + 1 < _REMOVE_TRIES:
                    time.sleep(0.1 * (attempt + 1))
                    continue
                raise _translate(exc) from exc
            except Exception as exc:
                raise _translate(exc) from exc

    def _wait_gone(self, cid: str) -> None:
        """Until the container is gone, for at most ``_REMOVING_WAIT_S``; then the caller goes on (what it
        removes next reports its own error)."""
        deadline = time.monotonic() + _REMOVING_WAIT_S
        while time.monotonic() < deadline:
            try:
                self.api.inspect_container(cid)
            except docker.errors.NotFound:
                return
            except Exception as exc:
                raise _translate(exc) from exc
            time.sleep(0.05)

    def containers(self, label: str, all: bool = True) -> list[dict[str, Any]]:
        return list(_call(self.api.containers, all=all, filters={"label": label}))

    def logs(self, cid: str, tail: int | None = None) -> str:
        raw = _call(
            self.api.logs, cid, stdout=True, stderr=True, tail=tail if tail is not None else "all", on_missing=b""
        )
        return bytes(raw).decode("utf-8", errors="replace")

    def stats(self, cid: str) -> dict[str, Any]:
        """One sample of a running container's stats (memory, CPU); {} when unavailable."""
        try:
            return dict(_call(self.api.stats, cid, stream=False, one_shot=True, on_missing={}))
        except SandboxError as exc:
            if isinstance(exc, DockerUnavailable):
                raise
            return {}

    def kill_requested(self, cid: str, since: float) -> bool | None:
        return self._had_event(cid, since, "kill")

    def oom_reported(self, cid: str, since: float) -> bool | None:
        return self._had_event(cid, since, "oom")

    def _had_event(self, cid: str, since: float, event: str) -> bool | None:
        # events up to now only: with ``until`` still to come the stream would wait for it. Seconds and
        # nanoseconds, as the engine parses a timestamp ("1796025196.532000000")
        try:
            events = self.api.events(
                since=f"{since:.9f}",
                until=f"{time.time():.9f}",
                filters={"container": cid, "event": event},
                decode=True,
            )
            return any(True for _ in events)
        except Exception:  # an engine that cannot say (an old Podman, a broken stream): unknown
            return None

    # networks -----------------------------------------------------------------------
    def create_network(self, name: str, internal: bool, labels: dict[str, str]) -> str:
        net = _call(
            self.api.create_network, name, driver="bridge", internal=internal, labels=labels, check_duplicate=True
        )
        return str(net["Id"])

    def network(self, name: str) -> dict[str, Any] | None:
        found = _call(self.api.inspect_network, name, on_missing=None)
        return dict(found) if found is not None else None

    def remove_network(self, name: str) -> None:
        _call(self.api.remove_network, name, on_missing=None)

    def networks(self, label: str) -> list[dict[str, Any]]:
        return list(_call(self.api.networks, filters={"label": label}))

    # volumes ------------------------------------------------------------------------
    def create_tmpfs_volume(self, name: str, labels: dict[str, str], options: str) -> str:
        return self.create_volume(name, labels, {"type": "tmpfs", "device": "tmpfs", "o": options})

    def create_volume(self, name: str, labels: dict[str, str], options: dict[str, str] | None = None) -> str:
        """A volume of the local driver (``options``: its mount, e.g. an overlay; none: a directory on the
        engine's disk); one of that name already there is kept as it is."""
        made = _call(self.api.create_volume, name, driver="local", driver_opts=options or None, labels=labels)
        return str(made["Name"])

    def remove_volume(self, name: str) -> None:
        _call(self.api.remove_volume, name, force=True, on_missing=None)

    def volumes(self, label: str) -> list[dict[str, Any]]:
        return list((_call(self.api.volumes, filters={"label": label}) or {}).get("Volumes") or [])


if TYPE_CHECKING:

    def _satisfies(engine: Engine) -> EngineAPI:
        return engine  # mypy fails here if Engine drifts from the protocol
