"""Debian packages for an image, downloaded on the host: the image builds have no network.

The host's own apt resolves the packages and their dependency closure from the mirror it already
uses, against an empty package database (so the closure is whole, whatever the host has
installed), and downloads the .deb files into a cache directory keyed by what it chose. The build
then installs, with ``dpkg -i`` and no network, each file whose package the image lacks or has at
an older version (``image/Dockerfile``, ``image/Dockerfile.deps``). The host must be a Debian of the
image's suite (bookworm), so that the versions fit the image's base.

Shared by the worker build (Node.js, ``WORKER_PACKAGES``) and the derived build (``--apt PKG``).
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from toolcage.errors import BuildError, NoApt, RequirementsError
from toolcage.image.wheels import Report, cache_dir

SUITE = "bookworm"  # the images' Debian (worker.image.build.SUITE)
WORKER_PACKAGES = ("nodejs",)  # the worker image's Debian packages: run_node's node
_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+")  # a Debian package name (policy §5.6.1)
_URI = re.compile(r"^'(?P<uri>[^']+)' (?P<file>\S+\.deb) (?P<size>\d+)(?: (?P<hash>\S+))?$")
_MISSING = re.compile(
    r"(?m)^E: (?:Unable to locate package |Package '?)([^'\s]+)'?(?: has no installation candidate)?$"
)


def check_names(packages: tuple[str, ...]) -> tuple[str, ...]:
    """``--apt PKG`` values: Debian package names, nothing else (no versions, paths or options)."""
    for pkg in packages:
        if not _NAME.fullmatch(pkg):
            raise RequirementsError(
                f"--apt {pkg!r} is not a Debian package name: give one name per --apt, e.g. --apt git "
                "(lowercase letters, digits and + - .; the version is the one apt on this host would install)"
            )
    return tuple(sorted(set(packages)))


def host_suite(os_release: str = "/etc/os-release") -> str | None:
    """The host's Debian codename (VERSION_CODENAME), or None."""
    try:
        text = Path(os_release).read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r"(?m)^VERSION_CODENAME=\"?([^\"\n]*)\"?$", text)
    return m.group(1) if m else None


def check_host(what: str) -> str:
    """apt-get's path, or NoApt saying why this host cannot fetch ``what``."""
    apt = shutil.which("apt-get")
    if apt is None:
        raise NoApt(
            f"{what} needs apt-get on this host (the Debian packages are downloaded here, the image build has no "
            f"network): build on a Debian {SUITE} host"
        )
    suite = host_suite()
    if suite != SUITE:
        raise NoApt(
            f"{what} needs a Debian {SUITE} host (its apt picks versions that fit the image's base), "
            f"and this one is {suite or 'not Debian'}"
        )
    return apt


def parse_uris(text: str) -> list[tuple[str, str, int]]:
    """``apt-get --print-uris`` lines as (uri, file name, size), sorted by file name."""
    out = []
    for line in text.splitlines():
        m = _URI.match(line.strip())
        if m:
            out.append((m["uri"], m["file"], int(m["size"])))
    return sorted(out, key=lambda t: t[1])


def _apt_options(state: Path, archives: Path) -> list[str]:
    opts = [
        "-o", f"Dir::State::status={state}",  # an empty database: the closure is whole
        "-o", f"Dir::Cache::archives={archives}",
        "-o", "Debug::NoLocking=1",  # our own directories, no lock on the host's
        "-o", "APT::Install-Recommends=false",
        "-o", "APT::Install-Suggests=false",
    ]  # fmt: skip
    if os.geteuid() == 0:
        opts += ["-o", "APT::Sandbox::User=root"]  # _apt cannot write to the caller's cache
    return opts


def _said(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.startswith("E: ")]
    return " / ".join(lines[-3:]) or " ".join(stderr.split()[-30:])


def _resolve(apt: str, packages: tuple[str, ...], state: Path, archives: Path) -> str:
    cmd = [apt, "-qq", "-y", "--print-uris", *_apt_options(state, archives), "install", *packages]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    if proc.returncode == 0:
        return proc.stdout
    missing = _MISSING.search(proc.stderr)
    if missing:
        raise RequirementsError(
            f"--apt {missing.group(1)}: apt on this host knows no such package in {SUITE} "
            "(check the name; `apt-cache search WORD` finds one; `sudo apt-get update` refreshes apt's lists)"
        )
    raise BuildError(f"apt-get could not resolve {' '.join(packages)}: {_said(proc.stderr)}")


def download_debs(report: Report, packages: tuple[str, ...], what: str = "--apt") -> tuple[Path, list[str]]:
    """The .deb files of ``packages`` and their dependencies, in a cache directory keyed by the files apt
    chose; and those files' names. Raises NoApt where this host cannot fetch them."""
    apt = check_host(what)
    with tempfile.TemporaryDirectory(prefix="toolcage-apt-") as tmp:
        state, empty = Path(tmp) / "status", Path(tmp) / "archives"
        state.touch()
        (empty / "partial").mkdir(parents=True)
        listing = parse_uris(_resolve(apt, packages, state, empty))
        if not listing:
            raise BuildError(f"apt-get chose no files for {' '.join(packages)}")
        key = hashlib.sha256("".join(f"{f} {n}\n" for _, f, n in listing).encode() + platform.machine().encode())
        dest = cache_dir() / "debs" / key.hexdigest()[:16]
        names = [f for _, f, _ in listing]
        if (dest / ".complete").exists() and all((dest / f).is_file() for f in names):
            report(f"Debian packages cached in {dest}")
            return dest, names
        (dest / "partial").mkdir(parents=True, exist_ok=True)
        total = sum(n for _, _, n in listing) / 1e6
        report(f"downloading {len(listing)} Debian packages ({total:.1f} MB) for {' '.join(packages)}")
        cmd = [apt, "-qq", "-y", "--download-only", *_apt_options(state, dest), "install", *packages]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    absent = [f for f in names if not (dest / f).is_file()]
    if proc.returncode != 0 or absent:
        raise BuildError(
            f"could not download the Debian packages for {' '.join(packages)}: {_said(proc.stderr)} "
            "(they are downloaded on this host before the build, which has no network: check the mirror apt uses, "
            "and `sudo apt-get update` if its lists are stale)"
        )
    shutil.rmtree(dest / "partial", ignore_errors=True)
    (dest / ".complete").touch()
    return dest, names


def copy_debs(debs: Path, names: list[str], into: Path) -> None:
    """The chosen .deb files, into a build context's directory ``into`` (made even when there are none)."""
    into.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(debs / name, into / name)


__all__ = ["SUITE", "WORKER_PACKAGES", "NoApt", "check_names", "copy_debs", "download_debs", "host_suite"]
