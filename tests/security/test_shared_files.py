"""An image's program files shared between its sandboxes (toolcage.engine.sharedfiles), on the real engine.

Threat: a sandbox changing what a later sandbox of the same image runs, or reaching one that runs beside
it, now that /usr and /opt/toolcage/lib are the same files for every sandbox of the image. What is
observed: from inside, both are read-only mounts (the sandbox cannot write, create, rename or chmod
there, nor remount), their bytes are the image's, and a file a sandbox tried to plant is in no later
sandbox. Two sandboxes side by side share no lock and no inotify event on those files: the first
version mounted the shared volumes themselves, and a sandbox with no network passed a workspace file
to one under a proxy policy through fcntl locks on them, saw which files other sandboxes opened, and
slowed their starts by piling locks on libc (each run now mounts overlays of its own: the tests below
failed on that version). Also: ``toolcage gc`` removes the volumes of an image the engine no longer
has, and leaves those of images it has."""

from __future__ import annotations

import hashlib
import io
import json
import secrets
import tarfile
from typing import Any

import pytest

from tests.helpers import run_cli
from toolcage import DEFAULT_IMAGE, Sandbox, wait_removed
from toolcage.engine import sharedfiles
from toolcage.image.build import record_built

ATTACK = r"""
import errno, json, os, ctypes
out = {}
def trial(name, fn):
    try:
        fn()
        out[name] = "done"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
trial("create", lambda: open("/usr/lib/python3.11/planted.py", "w").write("x"))
trial("overwrite", lambda: open("/usr/lib/python3.11/json/__init__.py", "a").write("x"))
trial("create_opt", lambda: open("/opt/toolcage/lib/toolcage/planted.py", "w").write("x"))
trial("rename", lambda: os.rename("/usr/lib/python3.11/json/decoder.py", "/usr/lib/python3.11/json/d2.py"))
trial("chmod", lambda: os.chmod("/usr/bin/python3.11", 0o777))
libc = ctypes.CDLL(None, use_errno=True)
MS_REMOUNT, MS_BIND = 32, 4096
rc = libc.mount(b"none", b"/usr", None, MS_REMOUNT | MS_BIND, None)
out["remount"] = "done" if rc == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
mounts, fstype = {}, {}
for line in open("/proc/self/mountinfo"):
    f = line.split()
    if f[4] in ("/usr", "/opt/toolcage/lib"):
        mounts[f[4]] = f[5].split(",")[0]
        fstype[f[4]] = f[f.index("-") + 1]
out["mounts"], out["fstype"] = mounts, fstype
print(json.dumps(out))
"""

DIGEST = r"""
import hashlib, os, json
print(json.dumps({
    "json": hashlib.sha256(open("/usr/lib/python3.11/json/__init__.py", "rb").read()).hexdigest(),
    "planted": any(os.path.exists(p) for p in (
        "/usr/lib/python3.11/planted.py", "/opt/toolcage/lib/toolcage/planted.py")),
}))
"""


def _shared_here(engine: Any) -> bool:
    """Whether this engine shares an image's files through volumes (not with overlay2, nor Podman)."""
    image_id = (engine.image(DEFAULT_IMAGE) or {})["Id"]
    return sharedfiles.layers(engine, image_id) is not None


def test_a_sandbox_cannot_change_the_files_later_sandboxes_run(engine: Any, no_leaks: None) -> None:
    with Sandbox("default") as sb:
        r = sb.call("run_python", {"code": ATTACK})
        assert r.ok, r.error
        seen = json.loads(r.result["stdout"])
        kind = sb.kind
    for trial in ("create", "overwrite", "create_opt", "rename", "chmod", "remount"):
        assert seen[trial] != "done", f"{trial} went through in the sandbox: {seen}"
    if _shared_here(engine):
        # the engine copies files (this machine's fuse-overlayfs): both are their own read-only mounts
        assert seen["mounts"] == {"/usr": "ro", "/opt/toolcage/lib": "ro"}, seen
        if kind != "gvisor":  # (gVisor's gofer serves every mount as 9p)
            assert seen["fstype"] == {"/usr": "overlay", "/opt/toolcage/lib": "overlay"}, seen  # the run's own
    else:
        # overlay2 (or Podman): the read-only root holds them, as before
        assert seen["mounts"] == {} and seen["fstype"] == {}, seen
    want = hashlib.sha256(_file_from_image(engine, DEFAULT_IMAGE, "/usr/lib/python3.11/json/__init__.py")).hexdigest()
    with Sandbox("default") as later:
        r = later.call("run_python", {"code": DIGEST})
        assert r.ok, r.error
        assert json.loads(r.result["stdout"]) == {"json": want, "planted": False}


def _file_from_image(engine: Any, image: str, path: str) -> bytes:
    """A file's bytes as the image holds them (a created, never started container's copy)."""
    api = engine.api
    cid = api.create_container(image, name=f"toolcage-test-peek-{secrets.token_hex(3)}", entrypoint=["/nonexistent"])
    try:
        stream, _ = api.get_archive(cid["Id"], path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            assert member is not None
            f = tar.extractfile(member)
            assert f is not None
            return f.read()
    finally:
        api.remove_container(cid["Id"], force=True)


def test_gc_removes_the_shared_files_of_an_image_that_is_gone(engine: Any, no_leaks: None) -> None:
    """An image of its own (the worker image with one more label: a new id), run once, then removed:
    `toolcage gc` removes its volumes and keeps the worker image's."""
    if not _shared_here(engine):
        pytest.fail("this engine shares image files itself (overlay2): nothing of sharedfiles to collect here")
    tag = f"toolcage-test-shared:{secrets.token_hex(3)}"
    dockerfile = f"FROM {DEFAULT_IMAGE}\nLABEL toolcage.test.shared={tag.split(':')[1]}\n".encode()
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    ctx.seek(0)
    list(engine.api.build(fileobj=ctx, custom_context=True, tag=tag, rm=True, network_mode="none", decode=True))
    image_id = engine.image(tag)["Id"]
    record_built(image_id)  # as `toolcage image build` does: an image of this installation runs its own worker
    try:
        with Sandbox("default", image=tag) as sb:
            r = sb.call("run_python", {"code": "import json; print(json.dumps(1))"})
            assert r.ok and r.result["stdout"] == "1\n", r.error
        theirs = {v["Name"] for v in engine.volumes(f"{sharedfiles.LABEL}={image_id}")}
        assert len(theirs) == 3, theirs  # the marker and its two volumes
    finally:
        wait_removed(60)  # its sandbox's container, removed in the background, holds the image
        engine.api.remove_image(tag, force=True)
    assert engine.image(image_id) is None
    worker_id = engine.image(DEFAULT_IMAGE)["Id"]
    ours = {v["Name"] for v in engine.volumes(f"{sharedfiles.LABEL}={worker_id}")}
    out = run_cli("gc", "--json")
    assert out.returncode == 0, out.stderr
    removed = {o["name"] for o in json.loads(out.stdout)["removed"]}
    # gc is machine-wide: another test process's gc may have removed some of theirs first (so not theirs <= removed)
    assert not theirs & {v["Name"] for v in engine.volumes(sharedfiles.LABEL)}, theirs
    assert not ours & removed
    assert {v["Name"] for v in engine.volumes(sharedfiles.LABEL)} >= ours
    assert not {v["Name"] for v in engine.volumes(f"{sharedfiles.LABEL}={image_id}")}


# -- two sandboxes side by side ----------------------------------------------------------------------
# the holder: locks on shared files, then waits; the other sandbox probes them meanwhile
HOLD = r"""
import fcntl, os, struct, time
fd = os.open("/usr/lib/python3.11/this.py", os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_SH)
fd2 = os.open("/usr/lib/python3.11/wave.py", os.O_RDONLY)
fcntl.fcntl(fd2, fcntl.F_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 10_007, 1, 0))  # one bit
time.sleep(10)
"""
PROBE = r"""
import fcntl, os, struct, json
out = {}
fd = os.open("/usr/lib/python3.11/this.py", os.O_RDONLY)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    out["flock"] = "free"
except OSError:
    out["flock"] = "held by another sandbox"
fd2 = os.open("/usr/lib/python3.11/wave.py", os.O_RDONLY)
got = fcntl.fcntl(fd2, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 10_007, 1, 0))
out["getlk"] = "free" if struct.unpack("hhqqi", got)[0] == fcntl.F_UNLCK else "held by another sandbox"
print(json.dumps(out))
"""
WATCH = r"""
import ctypes, os, select, time
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
PY = "/usr/lib/python3.11"
for d in (PY + "/email", PY + "/email/__pycache__", "/usr/bin", "/opt/toolcage/lib/toolcage"):
    assert libc.inotify_add_watch(fd, d.encode(), 0x20 | 0x01) >= 0, d  # IN_OPEN | IN_ACCESS
got, end = 0, time.time() + 10
while time.time() < end:
    if select.select([fd], [], [], 0.2)[0]:
        got += len(os.read(fd, 65536))
print(got)
"""


def _side_by_side(first: tuple[str, str], second: tuple[str, str]) -> tuple[Any, Any]:
    """``first`` (policy, code) runs in one sandbox; 3 s later (it holds or watches for 10 s), ``second``
    runs in another, both sandboxes started before either call."""
    import threading
    import time

    out: dict[str, Any] = {}
    with Sandbox(first[0]) as a, Sandbox(second[0]) as b:

        def run_first() -> None:
            out["a"] = a.call("run_python", {"code": first[1]})

        t = threading.Thread(target=run_first)
        t.start()
        time.sleep(3.0)
        out["b"] = b.call("run_python", {"code": second[1]})
        t.join()
    return out["a"], out["b"]


def test_no_lock_on_the_shared_files_reaches_another_sandbox(engine: Any, no_leaks: None) -> None:
    """The channel the first version had: a sandbox with no network held a lock on a shared file and a
    sandbox under a proxy policy saw it (bits of a workspace file, sent that way, came out whole)."""
    held, probed = _side_by_side(("default", HOLD), ("connector-http", PROBE))
    assert held.ok, held.error
    assert probed.ok, probed.error
    assert json.loads(probed.result["stdout"]) == {"flock": "free", "getlk": "free"}


def test_inotify_sees_nothing_another_sandbox_opens(engine: Any, no_leaks: None) -> None:
    """The first version let a watch on the shared directories see every file other sandboxes (and
    their egress proxies) opened: 539 of them for one `python3 -c 'import sqlite3, smtplib'` and two
    commands. The other sandbox here imports email, runs tar and starts under a proxy policy."""
    victim = "import email.parser, subprocess; subprocess.run(['/usr/bin/tar', '--version'], capture_output=True)"
    watched, victim_ran = _side_by_side(("default", WATCH), ("connector-http", victim))
    assert victim_ran.ok, victim_ran.error
    assert watched.ok, watched.error
    assert watched.result["stdout"].strip() == "0", "a sandbox saw another sandbox open the image's files"
