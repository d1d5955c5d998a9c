"""The Docker adapter translates docker-py's errors by type and HTTP status, never by message text."""

from __future__ import annotations

from typing import Any

import docker.errors
import requests
import requests.exceptions

from toolcage.engine.docker_adapter import Engine, _translate
from toolcage.errors import DockerUnavailable, ImageMissing, SandboxError


def _response(status: int) -> requests.Response:
    r = requests.Response()
    r.status_code = status
    return r


def test_image_not_found_is_image_missing() -> None:
    """docker-py's ImageNotFound becomes ImageMissing (status image_missing), naming the image."""
    exc = _translate(docker.errors.ImageNotFound("x", response=_response(404), explanation="No such image"), "a:b")
    assert isinstance(exc, ImageMissing) and exc.status == "image_missing" and "a:b" in exc.message


def test_a_404_that_mentions_an_image_is_not_image_missing() -> None:
    """A plain NotFound is not taken for a missing image because its text says "image"."""
    exc = _translate(docker.errors.NotFound("x", response=_response(404), explanation="no such image volume"), "a:b")
    assert not isinstance(exc, ImageMissing)


def test_connection_errors_are_docker_unavailable() -> None:
    """requests' ConnectionError and a client-side DockerException mean the engine cannot be reached."""
    assert isinstance(_translate(requests.exceptions.ConnectionError("refused")), DockerUnavailable)
    assert isinstance(_translate(docker.errors.DockerException("Invalid bind address")), DockerUnavailable)


def test_api_error_keeps_its_http_status() -> None:
    """Any other API error is a SandboxError carrying the engine's HTTP status."""
    exc = _translate(docker.errors.APIError("x", response=_response(500), explanation="boom"))
    assert type(exc) is SandboxError and exc.details["http_status"] == 500


class _Api:
    def __init__(self, exc: Exception, times: int = 1_000) -> None:
        self.exc = exc
        self.times = times  # how many calls fail before one succeeds
        self.calls = 0

        self.inspects = 0
        self.present = 0  # how many inspections still find the container (another's removal under way)

    def remove_container(self, *a: Any, **k: Any) -> None:
        self.calls += 1
        if self.calls <= self.times:
            raise self.exc

    def inspect_container(self, cid: str) -> dict[str, Any]:
        self.inspects += 1
        if self.inspects <= self.present:
            return {"Id": cid}
        raise docker.errors.NotFound("gone", response=_response(404))


def test_remove_treats_409_as_done_and_other_errors_as_errors() -> None:
    """remove(): 404 and 409 (removal already in progress) reach the goal; a 500 is tried again for about
    2 s (Podman, a container whose process has just exited), then reported."""
    engine = Engine.__new__(Engine)
    for status in (404, 409):
        cls = docker.errors.NotFound if status == 404 else docker.errors.APIError
        engine.api = _Api(cls("x", response=_response(status), explanation="whatever the text"))
        engine.remove("c")
    engine.api = _Api(docker.errors.APIError("x", response=_response(500), explanation="removal already in progress"))
    try:
        engine.remove("c")
    except SandboxError as exc:
        assert exc.details["http_status"] == 500
    else:
        raise AssertionError("a 500 was swallowed")


def test_remove_tries_a_5xx_again_until_it_goes_through(monkeypatch: Any) -> None:
    """Podman's 'could not be stopped: sending SIGKILL' (500) for a container that just exited: the
    next try removes it."""
    monkeypatch.setattr("toolcage.engine.docker_adapter.time.sleep", lambda s: None)
    engine = Engine.__new__(Engine)
    engine.api = _Api(docker.errors.APIError("x", response=_response(500), explanation="sending SIGKILL"), times=2)
    engine.remove("c")
    assert engine.api.calls == 3


def test_remove_during_anothers_removal_returns_once_the_container_is_gone(monkeypatch: Any) -> None:
    """A 409 (another process's removal of it is under way, e.g. a reaper's) returns only when the container
    is gone, so the caller's next step, removing its volumes, does not find them in use (seen in CI)."""
    monkeypatch.setattr("toolcage.engine.docker_adapter.time.sleep", lambda s: None)
    engine = Engine.__new__(Engine)
    engine.api = _Api(docker.errors.APIError("x", response=_response(409), explanation="in progress"))
    engine.api.present = 3
    engine.remove("c")
    assert engine.api.inspects == 4  # three found it still there, the fourth found it gone
