"""Debian packages for the images (toolcage.image.debs), without Docker and without the network: apt-get is
replaced by a stand-in that answers as the real one does."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from toolcage.errors import BuildError, RequirementsError
from toolcage.image import build, debs

URIS = (
    "'http://deb.debian.org/debian/pool/main/n/nodejs/nodejs_18.20.4%2bdfsg-1~deb12u3_amd64.deb' "
    "nodejs_18.20.4+dfsg-1~deb12u3_amd64.deb 322000 SHA256:ab\n"
    "'http://deb.debian.org/debian/pool/main/libu/libuv1/libuv1_1.44.2-1+deb12u1_amd64.deb' "
    "libuv1_1.44.2-1+deb12u1_amd64.deb 139000\n"
)


def test_names_are_package_names_only() -> None:
    """--apt takes Debian package names; a version, a path or an option is refused, saying what to give."""
    assert debs.check_names(("git", "curl", "git", "libc++1")) == ("curl", "git", "libc++1")
    for bad in ("git=1:2.39", "./x.deb", "-o", "Git", "", "a b"):
        with pytest.raises(RequirementsError, match="is not a Debian package name"):
            debs.check_names((bad,))


def test_parse_uris() -> None:
    assert debs.parse_uris(URIS + "W: something\n") == [
        ("http://deb.debian.org/debian/pool/main/libu/libuv1/libuv1_1.44.2-1+deb12u1_amd64.deb",
         "libuv1_1.44.2-1+deb12u1_amd64.deb", 139000),
        ("http://deb.debian.org/debian/pool/main/n/nodejs/nodejs_18.20.4%2bdfsg-1~deb12u3_amd64.deb",
         "nodejs_18.20.4+dfsg-1~deb12u3_amd64.deb", 322000),
    ]  # fmt: skip


def test_host_must_have_apt_and_be_bookworm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No apt-get, or another Debian: NoApt (a BuildError) saying what the build needs."""
    release = tmp_path / "os-release"
    release.write_text('NAME="Debian GNU/Linux"\nVERSION_CODENAME=trixie\n')
    assert debs.host_suite(str(release)) == "trixie"
    assert debs.host_suite(str(tmp_path / "none")) is None
    monkeypatch.setattr(debs.shutil, "which", lambda _n: None)
    with pytest.raises(debs.NoApt, match="needs apt-get on this host"):
        debs.check_host("--apt")
    monkeypatch.setattr(debs.shutil, "which", lambda _n: "/usr/bin/apt-get")
    monkeypatch.setattr(debs, "host_suite", lambda: "trixie")
    with pytest.raises(debs.NoApt, match=r"needs a Debian bookworm host.*this one is trixie"):
        debs.check_host("--apt")


class FakeApt:
    """apt-get: --print-uris answers URIS; --download-only writes the files into Dir::Cache::archives."""

    def __init__(self, stderr: str = "") -> None:
        self.calls: list[list[str]] = []
        self.stderr = stderr

    def __call__(self, cmd: list[str], **_kw: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(cmd)
        if self.stderr:
            return subprocess.CompletedProcess(cmd, 100, "", self.stderr)
        if "--print-uris" in cmd:
            return subprocess.CompletedProcess(cmd, 0, URIS, "")
        archives = Path(next(o.split("=", 1)[1] for o in cmd if o.startswith("Dir::Cache::archives=")))
        for _, name, _ in debs.parse_uris(URIS):
            (archives / name).write_bytes(b"deb")
        return subprocess.CompletedProcess(cmd, 0, "", "")


@pytest.fixture
def apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeApt:
    fake = FakeApt()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(debs, "check_host", lambda _what: "/usr/bin/apt-get")
    monkeypatch.setattr(debs.subprocess, "run", fake)
    return fake


def test_download_resolves_against_an_empty_database_and_caches(apt: FakeApt) -> None:
    """The closure is resolved as if nothing were installed (an empty status file), without recommends;
    the files land in a cache keyed by what apt chose, and a second build downloads nothing."""
    steps: list[str] = []
    dest, names = debs.download_debs(steps.append, ("nodejs",))
    assert names == ["libuv1_1.44.2-1+deb12u1_amd64.deb", "nodejs_18.20.4+dfsg-1~deb12u3_amd64.deb"]
    assert all((dest / n).read_bytes() == b"deb" for n in names)
    resolve = apt.calls[0]
    status = next(o for o in resolve if o.startswith("Dir::State::status="))
    assert "APT::Install-Recommends=false" in resolve and status != "Dir::State::status=/var/lib/dpkg/status"
    assert len(apt.calls) == 2 and "--download-only" in apt.calls[1]
    assert debs.download_debs(steps.append, ("nodejs",)) == (dest, names)
    assert len(apt.calls) == 3 and steps[-1].startswith("Debian packages cached in")


def test_an_unknown_package_is_a_requirements_error(apt: FakeApt) -> None:
    apt.stderr = "E: Unable to locate package nosuchpkg\n"
    with pytest.raises(RequirementsError, match="--apt nosuchpkg: apt on this host knows no such package"):
        debs.download_debs(lambda _m: None, ("nosuchpkg",))
    apt.stderr = "E: Failed to fetch http://x 404 Not Found\n"
    with pytest.raises(BuildError, match="could not resolve nosuchpkg: E: Failed to fetch"):
        debs.download_debs(lambda _m: None, ("nosuchpkg",))


def test_worker_build_goes_on_without_node_where_apt_cannot_fetch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host without apt (macOS, another distribution) still builds the worker image, saying run_node will not work."""

    def no_apt(*_a: Any, **_k: Any) -> Any:
        raise debs.NoApt("Node.js in the worker image needs apt-get on this host")

    monkeypatch.setattr(build, "download_debs", no_apt)
    steps: list[str] = []
    assert build.worker_debs(steps.append) is None
    assert steps == ["note: Node.js in the worker image needs apt-get on this host; building without Node.js "
                     "(run_node will not work)"]  # fmt: skip


def test_context_has_the_debs_and_their_installer(tmp_path: Path) -> None:
    """The worker's build context holds install-debs.sh and debs/ (empty when there are none), and the
    Dockerfile installs them; the installer is part of the image's source hash."""
    cache = tmp_path / "debs"
    cache.mkdir()
    (cache / "nodejs_1_amd64.deb").write_bytes(b"deb")
    for given, expected in ((None, []), ((cache, ["nodejs_1_amd64.deb"]), ["nodejs_1_amd64.deb"])):
        ctx = tmp_path / f"ctx{len(expected)}"
        ctx.mkdir()
        build.assemble_context(tmp_path / "nowheels", ctx, given)
        assert sorted(p.name for p in (ctx / "debs").iterdir()) == expected
        assert (ctx / "install-debs.sh").read_text().startswith("#!/bin/sh")
    dockerfile = (ctx / "Dockerfile").read_text()
    assert "COPY install-debs.sh debs/ /tmp/debs/" in dockerfile


# install-debs.sh, with dpkg's tools replaced by stand-ins: which files it hands to `dpkg -i`

FAKES = {
    "dpkg-deb": '[ "$1" = -f ] && sed -n "s/^$3=//p" "$2"',
    "dpkg-query": 'f="$STATE/$(eval echo \\${$#})"; [ -f "$f" ] && cat "$f" || exit 1',
    "dpkg": (
        'if [ "$1" = --compare-versions ]; then [ "$3" = lt ] || exit 2; [ "$2" != "$4" ] && '
        '[ "$(printf "%s\\n%s\\n" "$2" "$4" | sort -V | head -n 1)" = "$2" ]; exit; fi\n'
        'echo "$@" > "$STATE/installed-with"'
    ),
}


def test_installer_takes_what_is_missing_or_older(tmp_path: Path) -> None:
    """A package the image lacks, or has at an older version, is installed; one it has at that version or newer
    is left as it is; with nothing to install, dpkg is not run."""
    bin_, state, debs_dir = tmp_path / "bin", tmp_path / "state", tmp_path / "debs"
    for d in (bin_, state, debs_dir):
        d.mkdir()
    for name, body in FAKES.items():
        (bin_ / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / name).chmod(0o755)
    for pkg, version, have in (
        ("nodejs", "18.20.4", None),
        ("libssl3", "3.0.22", "3.0.20"),
        ("libc6", "2.36-9", "2.36-9"),
        ("zlib1g", "1.2.13", "1.3"),
    ):
        (debs_dir / f"{pkg}_{version}.deb").write_text(f"Package={pkg}\nVersion={version}\n")
        if have:
            (state / pkg).write_text(f"installed {have}\n")
    script = Path(build.__file__).with_name(build.INSTALL_DEBS)
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "STATE": str(state)}
    subprocess.run(["sh", str(script), str(debs_dir)], env=env, check=True)
    args = (state / "installed-with").read_text().split()
    assert args[0] == "-i" and "--path-exclude=/usr/share/doc/*" in args
    assert sorted(Path(a).name for a in args if a.endswith(".deb")) == ["libssl3_3.0.22.deb", "nodejs_18.20.4.deb"]
    (state / "installed-with").unlink()
    for deb in debs_dir.iterdir():
        deb.unlink()
    subprocess.run(["sh", str(script), str(debs_dir)], env=env, check=True)
    assert not (state / "installed-with").exists()
