"""The foreign images of issue 36 build here with no registry and have the shape the tests rely on.

Each image is checked with plain ``docker run --rm --entrypoint ...`` (no toolcage involved) against
``describe(kind)``: the tests of issue 36 that run toolcage's worker inside these images can then
trust what the image is. Cold build times on the project machine (s): busybox 1.4, musl 1.8,
distroless 0.2, debian-nopy 12.8, py313 53.7 (debootstrap; 2.9 from its cached tar), hostile 12.2;
with the tags present the whole module runs in about 8 s.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.harness import foreign_images as fi

pytestmark = pytest.mark.runc_only(
    "builds the test images and checks them with plain docker run: no sandbox, nothing of gVisor's"
)


def _docker(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=timeout, check=False)


def _run(image: str, entrypoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    return _docker("run", "--rm", "--network", "none", "--entrypoint", entrypoint, image, *args)


def _sh(image: str, script: str) -> subprocess.CompletedProcess[str]:
    return _run(image, "/bin/sh", "-c", script)


@pytest.mark.parametrize("foreign_image", fi.KINDS, indirect=True)
def test_config_is_as_described(foreign_image: str) -> None:
    kind = foreign_image.removeprefix("toolcage-test-img-").removesuffix(":1")
    want = fi.describe(kind)
    out = _docker("image", "inspect", "--format", "{{json .Config}}", foreign_image)
    assert out.returncode == 0, out.stderr
    config = json.loads(out.stdout)
    assert (config.get("User") or "") == want["user"]
    assert (config.get("WorkingDir") or "") == want["workdir"]
    assert config.get("Entrypoint") == want["entrypoint"]
    env = dict(e.split("=", 1) for e in config.get("Env") or [])
    assert {k: env.get(k) for k in want["env"]} == want["env"]


@pytest.mark.parametrize("foreign_image", ["busybox"], indirect=True)
def test_busybox(foreign_image: str) -> None:
    assert _run(foreign_image, "echo", "hello", "busybox").stdout == "hello busybox\n"
    r = _sh(
        foreign_image, "pwd; id -u; command -v python3 || echo no-python; ls /lib /usr/lib 2>/dev/null || echo no-libc"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["/tmp", "0", "no-python", "no-libc"]


@pytest.mark.parametrize("foreign_image", ["musl"], indirect=True)
def test_musl(foreign_image: str) -> None:
    hello = _run(foreign_image, "/usr/local/bin/hello-musl", "a", "b")
    assert hello.returncode == 0 and hello.stdout == "hello from musl a b\n", hello.stderr
    loader = _run(foreign_image, "/lib/ld-musl-x86_64.so.1")
    assert "musl libc (x86_64)" in loader.stderr
    r = _sh(foreign_image, 'id -un; id -u; pwd; echo "$HOME"; command -v python3 || echo no-python; ls /lib')
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [
        "app",
        "1000",
        "/home/app",
        "/home/app",
        "no-python",
        "ld-musl-x86_64.so.1",
        "x86_64-linux-musl",
    ]
    # its own ENTRYPOINT runs when not replaced (and writes its marker)
    assert _docker("run", "--rm", "--network", "none", foreign_image).returncode == 0


@pytest.mark.parametrize("foreign_image", ["distroless"], indirect=True)
def test_distroless(foreign_image: str) -> None:
    r = _docker("run", "--rm", "--network", "none", foreign_image, "x", "y")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "hello from distroless",
        "argv[0]=/app",
        "argv[1]=x",
        "argv[2]=y",
        "PATH=/usr/local/bin:/usr/bin:/bin",
    ]
    no_shell = _run(foreign_image, "/bin/sh", "-c", "true")
    assert no_shell.returncode != 0 and "/bin/sh" in no_shell.stderr


@pytest.mark.parametrize("foreign_image", ["debian-nopy"], indirect=True)
def test_debian_nopy(foreign_image: str) -> None:
    r = _run(
        foreign_image,
        "/bin/bash",
        "-c",
        'whoami; pwd; echo "$HOME" "$MYVAR"; command -v python3 python3.11 python || echo no-python; '
        "ls /usr/lib | grep -c '^python3' || true",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["root", "/testbed", "/root", "from-image", "no-python", "0"]
    repo = fi.describe("debian-nopy")["repo"]
    failing = _run(foreign_image, "/bin/bash", repo["test"])
    assert failing.returncode == 1 and "FAIL" in failing.stdout
    src = _run(foreign_image, "/bin/cat", repo["buggy_file"])
    assert repo["bug"] in src.stdout
    fixed = _sh(foreign_image, f"sed -i 's/return a - b/return a + b/' {repo['buggy_file']} && {repo['test']}")
    assert fixed.returncode == 0 and "PASS" in fixed.stdout, fixed.stdout + fixed.stderr


@pytest.mark.parametrize("foreign_image", ["py313"], indirect=True)
def test_py313(foreign_image: str) -> None:
    r = _run(foreign_image, "python3", "--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Python 3.13."), r.stdout
    where = _sh(foreign_image, "pwd; id -u; python3 -c 'import sys; print(sys.executable)'")
    assert where.stdout.split() == ["/app", "0", "/usr/bin/python3"]


@pytest.mark.parametrize("foreign_image", ["hostile"], indirect=True)
def test_hostile_plants_each_attack(foreign_image: str) -> None:
    """The image's attacks do fire for a process of the image: each leaves its marker."""
    cat = _run(foreign_image, "/bin/cat", "/etc/ld.so.preload")
    assert cat.stdout == "/evil/evil.so\n"
    assert any(m.startswith("PWNED lib:/evil/evil.so") and "exe=/usr/bin/cat" in m for m in fi.markers_in(cat.stderr))

    py = _run(foreign_image, "python3", "-c", "import sys, pwd; print(sys.version_info[:2], pwd.getpwuid(0).pw_name)")
    assert py.returncode == 0, py.stderr
    assert py.stdout.strip() == "(3, 11) root"
    fired = " ".join(fi.markers_in(py.stderr))
    for what in (
        "path:python3",
        "lib:/evil/evil.so",
        "sitecustomize",
        "usercustomize",
        "nss:/lib/x86_64-linux-gnu/libnss_evil.so.2",
    ):
        assert f"PWNED {what}" in fired, (what, py.stderr)

    maps = _run(foreign_image, "/bin/cat", "/proc/self/maps")
    assert fi.evil_mappings(maps.stdout), "evil.so should be mapped in a process of the image"
    assert not fi.evil_mappings("7f00-7f01 r-xp 0 08:01 1 /opt/toolcage/rt/lib/libc.so.6\n")

    suid = _sh(foreign_image, "stat -c %a:%U /evil/bin/suid-cat; readlink -f /evil/lib/libffi.so.8; echo $PATH")
    lines = suid.stdout.split()
    assert lines[0] == "4755:root" and lines[1] == "/evil/lib/libffi.so.8"
    assert lines[2].startswith("/evil/bin:")

    entry = _docker("run", "--rm", "--network", "none", foreign_image)
    assert entry.returncode == 0 and "PWNED path:sh" in entry.stderr


def test_every_kind_builds(foreign_images_all: dict[str, str]) -> None:
    assert sorted(foreign_images_all) == sorted(fi.KINDS)
    assert all(tag == f"toolcage-test-img-{kind}:1" for kind, tag in foreign_images_all.items())


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown foreign image kind"):
        fi.ensure("alpine")
