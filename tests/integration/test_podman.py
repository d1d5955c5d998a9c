"""Podman's Docker-compatible service as the engine (issue 12): the same sandbox, its knobs translated;
files in and out through it (issue 24: upload and download byte-exact, modes kept).

Needs a Podman service (`podman system service`, rootful here) at $TOOLCAGE_TEST_PODMAN_SOCKET
(default /run/podman/podman.sock) with the worker image loaded into its storage; `.ci/start-podman`
does both. Without it these tests skip, saying so, unless TOOLCAGE_REQUIRE_PODMAN=1 (set by CI).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolcage import DEFAULT_IMAGE, Sandbox, wait_removed
from toolcage.ops.views import inspect_findings

pytestmark = pytest.mark.runc_only("the Podman engine: its service has no runsc")

SOCKET = os.environ.get("TOOLCAGE_TEST_PODMAN_SOCKET", "/run/podman/podman.sock")
TAG = os.environ.get("TOOLCAGE_IMAGE", DEFAULT_IMAGE)  # the image .ci/start-podman loads
IMAGE = f"localhost/{TAG}"


@pytest.fixture(scope="module")
def podman() -> Iterator[Any]:
    from toolcage.engine.docker_adapter import Engine
    from toolcage.errors import ToolcageError

    reason = None
    eng = None
    if not os.path.exists(SOCKET):
        reason = f"no Podman service at {SOCKET} (.ci/start-podman starts one)"
    else:
        try:
            eng = Engine(base_url=f"unix://{SOCKET}")
            if eng.image(IMAGE) is None:
                reason = f"{IMAGE} is not in Podman's storage (docker save {TAG} | podman load)"
        except ToolcageError as exc:
            reason = f"the Podman service does not answer: {exc.message}"
    if reason is not None:
        if os.environ.get("TOOLCAGE_REQUIRE_PODMAN") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    yield eng


PROBE = (
    "import errno, json, os, socket\n"
    "s = {l.split(':')[0]: l.split(':', 1)[1].strip() for l in open('/proc/self/status') if ':' in l}\n"
    "r = {'uid': os.getuid(), 'seccomp': s['Seccomp'], 'nnp': s['NoNewPrivs'], 'caps': s['CapEff'],\n"
    "     'ifaces': sorted(n for _, n in socket.if_nameindex())}\n"
    "try:\n    open('/x', 'w')\nexcept OSError as e:\n    r['root'] = errno.errorcode[e.errno]\n"
    "open('/scratch/ok', 'w').write('ok')\n"
    "print(json.dumps(r))"
)


def test_a_sandbox_through_podman_has_the_same_walls(podman: Any) -> None:
    """Through Podman: non-root, toolcage's seccomp filter, no_new_privs, no capabilities, only `lo`,
    a read-only root and a writable scratch; doctor finds the live container as locked down as its
    policy (the profile given by path, as Podman takes it); nothing is left behind."""
    assert podman.flavor().name == "podman"
    with Sandbox(image=IMAGE, engine=podman, tool="podman-check", audit=False) as sb:
        r = sb.call("run_python", {"code": PROBE})
        assert r.ok and r.result["exit_code"] == 0, r.result
        seen = json.loads(r.result["stdout"])
        assert seen == {
            "uid": 65532, "seccomp": "2", "nnp": "1", "caps": "0000000000000000", "ifaces": ["lo"], "root": "EROFS",
        }  # fmt: skip
        assert sb.call("run_shell", {"command": "cat /scratch/ok"}).result["stdout"] == "ok"
        assert sb.container_id is not None
        info = podman.inspect(sb.container_id)
        assert inspect_findings(info) == [], inspect_findings(info)
    wait_removed(60)
    assert [c for c in podman.containers("toolcage.run_id") if c["Labels"].get("toolcage.tool") == "podman-check"] == []


def _tree(root: Path) -> dict[str, tuple[int, str]]:
    """A local tree of text, binary and a symlink with chosen modes: {relative path: (mode, sha256)}."""
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.txt").write_text("hello\nvia podman\n")
    (root / "sub" / "b.bin").write_bytes(os.urandom(70000) + bytes(range(256)))
    (root / "sub" / "deeper" / "c").write_bytes(b"\x00\xff\r\n")
    (root / "a.txt").chmod(0o755)
    (root / "sub" / "b.bin").chmod(0o600)
    (root / "sub" / "deeper" / "c").chmod(0o444)
    (root / "sub").chmod(0o750)
    (root / "link").symlink_to("a.txt")
    return _seen(root)


def _seen(root: Path) -> dict[str, tuple[int, str]]:
    """Every file and directory under root (symlinks not followed): its mode and its content's sha256."""
    out: dict[str, tuple[int, str]] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            out[str(p.relative_to(root))] = (-1, os.readlink(p))
        elif stat.S_ISDIR(st.st_mode):
            out[str(p.relative_to(root))] = (stat.S_IMODE(st.st_mode), "dir")
        else:
            out[str(p.relative_to(root))] = (stat.S_IMODE(st.st_mode), hashlib.sha256(p.read_bytes()).hexdigest())
    return out


LOOK_IN = (
    "cd in && stat -c '%a %n' a.txt sub sub/b.bin sub/deeper/c"
    " && sha256sum a.txt sub/b.bin sub/deeper/c && readlink link"
)
MAKE_OUT = (
    "mkdir -p out/d && printf 'made inside\\n' > out/t.txt && head -c 50000 /dev/urandom > out/d/r.bin"
    " && chmod 640 out/t.txt && chmod 700 out/d/r.bin && chmod 711 out/d && sha256sum out/t.txt out/d/r.bin"
)


def test_files_in_and_out_through_podman(podman: Any, tmp_path: Path) -> None:
    """Through Podman: a local tree (text, binary, modes, a symlink) uploaded arrives byte-exact with its
    modes (seen from inside), downloads back equal to what was sent, and a tree made inside comes out
    byte-exact with its modes; nothing is left behind."""
    sent = _tree(tmp_path / "src")
    with Sandbox(image=IMAGE, engine=podman, tool="podman-files", audit=False) as sb:
        got = sb.upload(tmp_path / "src", "/scratch/in")
        assert (got.remote_dir, got.files, got.dirs, got.symlinks) == ("/scratch/in", 3, 2, 1)
        assert got.bytes == sum((tmp_path / "src" / f).stat().st_size for f in ("a.txt", "sub/b.bin", "sub/deeper/c"))
        r = sb.call("run_shell", {"command": LOOK_IN})
        assert r.ok and r.result["exit_code"] == 0, r.result
        inside = r.result["stdout"].split()
        assert inside[:8] == ["755", "a.txt", "750", "sub", "600", "sub/b.bin", "444", "sub/deeper/c"]
        assert inside[8:14] == [sent["a.txt"][1], "a.txt", sent["sub/b.bin"][1], "sub/b.bin",
                                sent["sub/deeper/c"][1], "sub/deeper/c"]  # fmt: skip
        assert inside[14:] == ["a.txt"]
        back = sb.download("/scratch/in", tmp_path / "back")
        assert (back.files, back.dirs, back.symlinks, back.skipped) == (3, 2, 1, [])

        made = sb.call("run_shell", {"command": MAKE_OUT})
        assert made.ok and made.result["exit_code"] == 0, made.result
        t_sum, r_sum = made.result["stdout"].split()[::2]
        out = sb.download("/scratch/out", tmp_path / "out")
        one = sb.download("/scratch/out/d/r.bin", tmp_path / "one")
    assert _seen(tmp_path / "back") == sent
    assert (out.files, out.dirs, out.skipped, one.files) == (2, 1, [], 1)
    assert _seen(tmp_path / "out") == {"t.txt": (0o640, t_sum), "d": (0o711, "dir"), "d/r.bin": (0o700, r_sum)}
    assert (tmp_path / "out/t.txt").read_text() == "made inside\n"
    assert _seen(tmp_path / "one") == {"r.bin": (0o700, r_sum)}
    wait_removed(60)
    assert [c for c in podman.containers("toolcage.run_id") if c["Labels"].get("toolcage.tool") == "podman-files"] == []


def test_workspace_copy_changes_and_snapshot_through_podman(podman: Any, tmp_path: Path) -> None:
    """Through Podman: a writable workspace copy (its tmpfs owned by the sandbox user), its diff, and a
    snapshot resumed in a fresh container; the host's directory is untouched."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("one\n")
    (repo / "b.bin").write_bytes(bytes(range(256)))
    opts: dict[str, Any] = {"image": IMAGE, "engine": podman, "tool": "podman-files", "audit": False}
    with Sandbox(workspace=repo, workspace_mode="copy", **opts) as sb:
        r = sb.call("run_shell", {"command": "cd /workspace && echo two >> a.txt && rm b.bin && echo n > n.txt"})
        assert r.ok and r.result["exit_code"] == 0, r.result
        ch = sb.changes()
        sb.snapshot(tmp_path / "s.tar")
        first = sb.container_id
    assert (ch.added, ch.changed, ch.removed) == (("n.txt",), ("a.txt",), ("b.bin",))
    assert "+two" in ch.diff and "GIT binary patch" in ch.diff
    assert (repo / "a.txt").read_text() == "one\n" and (repo / "b.bin").exists()
    with Sandbox(workspace=repo, resume=tmp_path / "s.tar", **opts) as again:
        assert again.container_id != first
        assert again.read_files(["/workspace/a.txt", "/workspace/n.txt"]) == {
            "/workspace/a.txt": b"one\ntwo\n",
            "/workspace/n.txt": b"n\n",
        }
        assert again.changes().paths == ("a.txt", "b.bin", "n.txt")
    wait_removed(60)
    assert [c for c in podman.containers("toolcage.run_id") if c["Labels"].get("toolcage.tool") == "podman-files"] == []
