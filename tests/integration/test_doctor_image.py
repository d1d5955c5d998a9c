"""`toolcage doctor --image REF` on the real engine (issue 36): what a user's image offers and whether it runs,
from its config and one short hardened run; a missing image or another platform refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOKWORM = "toolcage-base:bookworm"  # Debian with CPython 3.11, no worker label: a foreign image
ARM64 = "toolcage-test-doctor-arm64:1"

pytestmark = [
    pytest.mark.usefixtures("no_leaks"),
    pytest.mark.runc_only(
        "doctor's report of an image, host-side (its probe is a plain run; under gVisor: test_foreign_image_attacks)"
    ),
]


def _doctor(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "toolcage.cli", "doctor", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=180)


def _report(ref: str) -> dict[str, Any]:
    done = _doctor("--image", ref, "--json")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_debian_image_with_python_311() -> None:
    """A Debian image with CPython 3.11: the worker answers, /bin/sh and python3 3.11 (new enough) are found,
    Node is reported missing with the tool's own words; exit 0."""
    r = _report(BOOKWORM)
    assert (r["kind"], r["platform"], r["runnable"], r["reason"]) == ("foreign", "linux/amd64", True, None)
    p = r["probe"]
    assert p["answered"] and p["first_answer_ms"] > 0
    assert p["shell"] == {"present": True, "path": "/bin/sh"}
    assert p["python"]["path"] == "/usr/bin/python3"
    assert p["python"]["version"].startswith("3.11.") and p["python"]["supported"] is True
    assert p["node"]["present"] is False and "has no Node.js" in p["node"]["error"]
    assert any("Node.js" in n for n in r["notes"])


@pytest.mark.parametrize("foreign_image", ["busybox"], indirect=True)
def test_busybox_image(foreign_image: str) -> None:
    """A busybox image (no libc, no Python): runnable, a shell, no Python (the note says run_python answers an
    error), its PATH and WORKDIR from its config; the people's table ends with the verdict."""
    r = _report(foreign_image)
    assert r["runnable"] and r["path"] == "/bin" and r["workdir"] == "/tmp" and r["layers"] >= 1
    p = r["probe"]
    assert p["shell"]["present"] and not p["python"]["present"] and not p["git"]["present"]
    assert "/scratch" in p["writable"]  # the run's tmpfs, whatever the image; found by writing a file there
    assert not p["pip"]["present"]
    assert any("no Python" in n for n in r["notes"])
    text = _doctor("--image", foreign_image)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"image       {foreign_image}")
    assert "python      not found on its PATH" in lines
    assert lines[-1] == "verdict     runs"


def test_missing_image_is_one_line_and_nothing_pulled() -> None:
    """An image the engine does not have: exit 1, one stderr line saying nothing is pulled, no output."""
    ref = "toolcage-test-doctor-absent:never"
    done = _doctor("--image", ref)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "pulls nothing" in done.stderr and ref in done.stderr
    inspect = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, timeout=30)
    assert inspect.returncode != 0  # still not there: nothing was pulled


@pytest.fixture
def arm64_image() -> Iterator[str]:
    """A tiny linux/arm64 image (FROM scratch, one file), built here with the classic builder's --platform."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "f").write_text("hi\n")
        Path(tmp, "Dockerfile").write_text("FROM scratch\nCOPY f /f\n")
        env = {**os.environ, "DOCKER_BUILDKIT": "0"}
        cmd = ["docker", "build", "-q", "--network", "none", "--platform", "linux/arm64", "-t", ARM64, tmp]
        built = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        assert built.returncode == 0, built.stderr
    try:
        yield ARM64
    finally:
        subprocess.run(["docker", "rmi", "-f", ARM64], capture_output=True, timeout=60)


def test_other_platform_refused_before_any_start(arm64_image: str) -> None:
    """A linux/arm64 image is refused from its config, in one line naming the platform; no sandbox starts."""
    done = _doctor("--image", arm64_image, "--json")
    assert done.returncode == 1
    assert json.loads(done.stdout)["error"]["reason"] == "not_found"
    assert done.stderr.count("\n") == 1 and "linux/arm64" in done.stderr and "linux/amd64" in done.stderr
    ps = ["docker", "ps", "-aq", "--filter", f"ancestor={arm64_image}"]
    assert subprocess.run(ps, capture_output=True, text=True, timeout=30).stdout == ""  # nothing made of it


def test_config_a_run_refuses_is_said_before_any_start() -> None:
    """An image whose ENV sets LD_SHOW_AUXV (the loader acts on it whatever its value): exit 1, the reason
    names it on one stderr line, nothing of the image started."""
    ref = "toolcage-test-doctor-auxv:1"
    made = subprocess.run(
        ["docker", "import", "--change", "ENV LD_SHOW_AUXV=1", "-", ref],
        input=_one_file_tar(),
        capture_output=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    try:
        done = _doctor("--image", ref)
        assert done.returncode == 1
        assert done.stderr.count("\n") == 1 and "LD_SHOW_AUXV" in done.stderr
        assert "worker      not started: a run refuses this image's config" in done.stdout
        ps = ["docker", "ps", "-aq", "--filter", f"ancestor={ref}"]
        assert subprocess.run(ps, capture_output=True, text=True, timeout=30).stdout == ""
    finally:
        subprocess.run(["docker", "rmi", "-f", ref], capture_output=True, timeout=60)


def _one_file_tar() -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("f")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"hi\n"))
    return buf.getvalue()


def test_worker_label_not_built_here_is_foreign() -> None:
    """An image built FROM the worker image by plain docker build carries the worker label but was not built by
    this installation: doctor reports it foreign (it runs with toolcage's runtime, never its own worker)."""
    from toolcage.options import worker_image

    ref = "toolcage-test-doctor-labelled:1"
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    dockerfile = f"FROM {worker_image()}\nLABEL toolcage.test.doctor=1\n"
    cmd = ["docker", "build", "-q", "--network", "none", "-t", ref, "-"]
    built = subprocess.run(cmd, input=dockerfile, capture_output=True, text=True, env=env, timeout=300)
    assert built.returncode == 0, built.stderr
    try:
        r = _report(ref)
        assert r["kind"] == "foreign" and r["runnable"]
        assert any("not built by this installation" in n for n in r["notes"])
        mine = _report(worker_image())
        assert mine["kind"] == "worker" and not any("not built" in n for n in mine["notes"])
    finally:
        subprocess.run(["docker", "rmi", "-f", ref], capture_output=True, timeout=60)
