"""Wheels for an image, downloaded on the host: the image builds have no network.

CPython 3.11 wheels for manylinux on this machine's arch; a package with no such wheel is
built here from its sdist when that gives a pure-Python wheel, and refused otherwise.
Cached by the hash of the requirements file. Shared by the worker build and the derived build.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from toolcage.errors import BuildError, RequirementsError

Report = Callable[[str], None]

# pip's retry warnings are the only sign that the index did not answer: with none, a failed
# download ends in the same "No matching distribution" as a name that does not exist
_UNREACHABLE = re.compile(r"after connection broken by '?(.{0,300})|Could not fetch URL (.{0,300})")
_NO_MATCH = re.compile(r"No matching distribution found for (\S+)")
MAX_SDISTS = 20  # a requirements file that needs more sdists built than this is refused


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "toolcage"


def cache_key(requirements: bytes, arch: str) -> str:
    """The wheel cache's key: the requirements file's bytes and the machine's arch."""
    return hashlib.sha256(requirements + arch.encode()).hexdigest()[:16]


def _target(arch: str) -> list[str]:
    """pip's options for the image's interpreter: CPython 3.11 on manylinux for ``arch``."""
    platforms = [f"manylinux2014_{arch}", f"manylinux_2_17_{arch}", f"manylinux_2_28_{arch}", "any"]
    return [
        "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
        *(arg for p in platforms for arg in ("--platform", p)),
    ]  # fmt: skip


def _pip(args: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def _said(stderr: str) -> str:
    """pip's error lines, as one short line."""
    errors = [ln.removeprefix("ERROR: ").strip() for ln in stderr.splitlines() if ln.startswith("ERROR: ")]
    text = " ".join(errors) or " ".join(stderr.split()[-40:])
    return text[-600:]


def _check(proc: subprocess.CompletedProcess[str], what: str) -> str | None:
    """None when pip succeeded; the requirement it found nothing for; else raise, in one paragraph."""
    if proc.returncode == 0:
        return None
    down = _UNREACHABLE.search(proc.stderr)
    if down:
        text = next(g for g in down.groups() if g)
        cause = re.search(r"\[Errno -?\d+\] [^'\")]+", text) or re.search(r"\b[A-Za-z]+Error\b", text)
        detail = cause.group(0) if cause else text[:120]
        raise BuildError(
            f"could not {what}: the package index did not answer ({detail}). The wheels are downloaded "
            "on this host before the build, which itself has no network: check the connection, or point pip "
            "at a reachable index (PIP_INDEX_URL, PIP_PROXY), then run the command again."
        )
    missing = _NO_MATCH.search(proc.stderr)
    if missing:
        return missing.group(1)
    raise BuildError(f"could not {what}: pip said: {_said(proc.stderr)}")


def _wheel_from_sdist(spec: str, dest: Path, arch: str, report: Report) -> None:
    """``spec`` has no wheel for the image: build its sdist into a wheel here, if that gives a
    pure-Python one (the build has neither network nor compiler), and add it to ``dest``."""
    no_wheel = f"{spec} has no wheel for CPython 3.11 on manylinux {arch}"
    with tempfile.TemporaryDirectory(prefix="toolcage-sdist-") as tmp:
        sdists, built = Path(tmp) / "sdist", Path(tmp) / "wheel"
        get = ["download", "--quiet", "--no-deps", "--no-binary=:all:", *_target(arch), "--dest", str(sdists), spec]
        if _check(_pip(get), f"download the sdist of {spec}") is not None:
            raise RequirementsError(
                f"{no_wheel} and no source distribution either: check the name and version, "
                "or pin a version that ships such a wheel."
            )
        sdist = next(iter(sorted(sdists.iterdir())))
        report(f"building a wheel from the sdist {sdist.name}")
        proc = _pip(["wheel", "--quiet", "--no-deps", "--wheel-dir", str(built), str(sdist)])
        if proc.returncode != 0:
            raise RequirementsError(
                f"{no_wheel}, and its sdist {sdist.name} did not build into a wheel on this host "
                f"(pip said: {_said(proc.stderr)}): pin a version that ships manylinux wheels."
            )
        for whl in sorted(built.glob("*.whl")):
            if not whl.name.endswith("-none-any.whl"):
                raise RequirementsError(
                    f"{no_wheel}, and its sdist is not pure Python ({whl.name}): the image build can "
                    "compile nothing (no network, no compiler), so pin a version that ships manylinux wheels."
                )
            shutil.move(str(whl), dest / whl.name)


def download_wheels(report: Report, requirements: Path) -> Path:
    """The wheels for ``requirements`` and for pip itself, in a cache directory keyed by its hash."""
    arch = platform.machine()
    dest = cache_dir() / "wheels" / cache_key(requirements.read_bytes(), arch)
    if (dest / ".complete").exists():
        report(f"wheels cached in {dest}")
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    report(f"downloading wheels (cp311, manylinux {arch})")
    fetch = ["download", "--quiet", "--dest", str(dest), "--find-links", str(dest), "--only-binary=:all:"]
    tried: set[str] = set()
    # Some packages ship only an sdist (jsonrpcserver 5): each one pip finds no wheel for is
    # built here and found on the next round through --find-links.
    while (spec := _check(_pip([*fetch, *_target(arch), "-r", str(requirements)]), "download the wheels")) is not None:
        if spec in tried or len(tried) >= MAX_SDISTS:
            raise RequirementsError(
                f"{spec}: no wheel pip can use for CPython 3.11 on manylinux {arch}, not even one built "
                "from its sdist: pin a version that ships manylinux wheels."
            )
        tried.add(spec)
        _wheel_from_sdist(spec, dest, arch, report)
    if _check(_pip([*fetch, *_target(arch), "pip"]), "download pip") is not None:
        raise BuildError(f"no pip wheel for CPython 3.11 on manylinux {arch} on the package index")
    (dest / ".complete").touch()
    return dest


def copy_wheels(wheels: Path, into: Path) -> None:
    """The cached wheels, into a build context's directory ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    for whl in sorted(wheels.glob("*.whl")):
        shutil.copy(whl, into / whl.name)


__all__ = ["cache_dir", "cache_key", "copy_wheels", "download_wheels"]
