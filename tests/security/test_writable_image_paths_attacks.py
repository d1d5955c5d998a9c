"""Attacks on writable= (issue 36, point 3) from a hostile image and from the code in the sandbox, under runc and
(TOOLCAGE_SANDBOX=gvisor) gVisor. Each test names the defence it checks:

- a run fills its writable path past the cap: the writer gets ENOSPC and the sandbox lives on (the tmpfs's
  ``size=``, toolcage.engine.hostconfig);
- a write is invisible to a second run of the same image running at the same time and to a later one, and
  nothing of it is left after the run: no volume, nothing in the container's writable layer on the host disk
  (``docker ps --size``), the runner's temp directory gone (a tmpfs per run, toolcage.files.imagepaths);
- a hostile image's /testbed holding symlinks to /proc/1, /opt/toolcage/rt, /etc/shadow and out with ``..``,
  device nodes, a FIFO and a setuid-root binary: the fill keeps the links as names (never followed by the
  runner, and the file tools refuse to follow them out), leaves the device nodes and the FIFO out, drops the
  setuid bit and makes the sandbox user the owner (the setuid binary cannot read /etc/shadow); a writable path
  that is itself a symlink out (/linked -> /etc) is refused before a sandbox starts;
- in toolcage's worker image, whose worker runs from the image's own /usr (interpreter, stdlib) and reads its
  /etc/ld.so.preload, a writable /usr/local, /usr/lib or /etc would let the sandbox change the worker's code
  before the worker loads it: refused before a sandbox starts;
- a 100,000-file tree fills within a time bound; a huge sparse file (8 GiB of holes, which the engine's archive
  sends as zeros) is refused while it is read, within a time bound, with no sandbox started and the reading
  container removed.
The module's images are built FROM toolcage-base:bookworm with no network, named toolcage-test-wr-*.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolcage import Sandbox
from toolcage.errors import UsageError

BASE = "toolcage-base:bookworm"
GVISOR = os.environ.get("TOOLCAGE_SANDBOX") == "gvisor"

HOSTILE = f"""FROM {BASE}
RUN set -eu; mkdir -p /testbed/src; cd /testbed; echo 'x = 1' > src/a.py; \\
    ln -s /proc/1 proc1; ln -s /opt/toolcage/rt rt; ln -s /etc/shadow shadow; ln -s ../../../etc up; \\
    mknod null c 1 3; mknod sda b 8 0; mkfifo fifo; \\
    cp /bin/cat suid_cat; chmod 4755 suid_cat; ln -s /etc /linked
"""
SPARSE = f"""FROM {BASE}
RUN mkdir -p /testbed && truncate -s 512M /testbed/sparse
"""


def _present(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def _build(tag: str, dockerfile: str) -> str:
    """Built once per engine and kept (named toolcage-test-*): the runc and gVisor passes share them (the
    builder reads a sparse file's every byte at commit)."""
    if _present(tag):
        return tag
    if not _present(BASE):
        pytest.fail(f"{BASE} is not on this engine: run `toolcage image build` (it bootstraps it)", pytrace=False)
    with tempfile.TemporaryDirectory() as ctx:
        Path(ctx, "Dockerfile").write_text(dockerfile)
        subprocess.run(["docker", "build", "-q", "--network", "none", "-t", tag, ctx], check=True, capture_output=True)
    return tag


def _many(tag: str, count: int = 100_000) -> str:
    """An image of one layer, /testbed/many holding ``count`` empty files, by ``docker import`` of a tar made here
    (a build's RUN that makes them takes minutes on fuse-overlayfs); it has no shell: the tools are the worker's."""
    if _present(tag):
        return tag
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp, "many.tar")
        with tarfile.open(archive, "w") as tf:
            for name in ("testbed", "testbed/many"):
                d = tarfile.TarInfo(name)
                d.type, d.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(d)
            for i in range(count):
                tf.addfile(tarfile.TarInfo(f"testbed/many/f{i}"), io.BytesIO(b""))
        subprocess.run(["docker", "import", str(archive), tag], check=True, capture_output=True)
    return tag


@pytest.fixture(scope="module")
def images() -> Iterator[dict[str, str]]:
    made = {
        "hostile": _build("toolcage-test-wr-hostile:1", HOSTILE),
        "many": _many("toolcage-test-wr-many:1"),
        "sparse": _build("toolcage-test-wr-sparse:3", SPARSE),
    }
    yield made  # (kept for the next pass: test images, by their prefix)


def _sh(sb: Sandbox, command: str) -> dict[str, object]:
    res = sb.call("exec", {"argv": ["sh", "-c", command]})
    assert res.ok, res.error
    assert isinstance(res.result, dict)
    return res.result


def _mine(kind: str, run_id: str) -> list[str]:
    out = subprocess.run(
        ["docker", kind, "ls", *(["-a"] if kind == "container" else []), "-q", "--filter",
         f"label=toolcage.run_id={run_id}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.split()


def test_fill_past_the_cap_gets_enospc_and_the_sandbox_lives_on(images: dict[str, str], no_leaks: None) -> None:
    with Sandbox(image=images["hostile"], writable=("/testbed",), writable_size="8m") as sb:
        out = _sh(sb, "yes aaaaaaaaaaaaaaaaaaaaaaaa > /testbed/flood; echo rc=$?; ls -la /testbed/flood | wc -l")
        assert "No space left on device" in str(out["stderr"]), out
        assert "rc=1" in str(out["stdout"])
        # the run goes on: other calls, and the space comes back when the file goes
        assert _sh(sb, "rm /testbed/flood && echo 1 > /testbed/ok && cat /testbed/ok")["stdout"] == "1\n"
        assert sb.call("write_file", {"path": "/scratch/still.txt", "content": "alive"}).ok
        assert sb.dead is None


def test_a_write_is_invisible_to_other_runs_and_nothing_is_left(images: dict[str, str], no_leaks: None) -> None:
    image = images["hostile"]
    a = Sandbox(image=image, writable=("/testbed",), writable_size="64m", memory="256m")
    b = Sandbox(image=image, writable=("/testbed",), writable_size="64m", memory="256m")
    starter = threading.Thread(target=b.start)
    starter.start()
    a.start()
    starter.join()
    try:
        assert a._originals is not None
        temp = a._originals.dir
        _sh(a, "echo from-a > /testbed/src/a.py; dd if=/dev/urandom of=/testbed/blob bs=1M count=40 2>/dev/null")
        seen = _sh(b, "cat /testbed/src/a.py; ls /testbed/blob 2>&1 | grep -c 'No such'")
        assert seen["stdout"] == "x = 1\n1\n"  # b's tree is the image's, at the same time
        # a's 40 MiB went to its tmpfs (memory), not the container's writable layer on the host's disk
        size = subprocess.run(
            ["docker", "ps", "-a", "--size", "--filter", f"id={a.container_id}", "--format", "{{.Size}}"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "MB" not in size.split("(")[0] and "GB" not in size.split("(")[0], size
        run_a = a.run_id
    finally:
        a.close()
        b.close()
    from toolcage import wait_removed

    wait_removed(60)
    assert not os.path.exists(temp)  # the image's tree kept for the diff: gone with the run
    assert _mine("container", run_a) == [] and _mine("volume", run_a) == []
    with Sandbox(image=image, writable=("/testbed",), writable_size="8m") as c:
        assert _sh(c, "cat /testbed/src/a.py; ls /testbed")["stdout"].startswith("x = 1\n")  # type: ignore[union-attr]
        assert "blob" not in str(_sh(c, "ls /testbed")["stdout"])


def test_hostile_links_devices_and_setuid_in_the_image(images: dict[str, str], no_leaks: None) -> None:
    with Sandbox(image=images["hostile"], writable=("/testbed",), writable_size="16m") as sb:
        out = _sh(
            sb,
            "cd /testbed; for l in proc1 rt shadow up; do readlink $l; done; ls; stat -c '%a %u %F' suid_cat; "
            "./suid_cat /etc/shadow >/dev/null 2>&1 && echo READ-SHADOW || echo no-shadow",
        )
        lines = str(out["stdout"]).splitlines()
        assert lines[:4] == ["/proc/1", "/opt/toolcage/rt", "/etc/shadow", "../../../etc"]  # names, as the image has
        listing = set(lines[4:-2])
        assert {"null", "sda", "fifo"}.isdisjoint(listing) and {"src", "suid_cat", "proc1"} <= listing
        assert lines[-2] == "755 65532 regular file" and lines[-1] == "no-shadow"  # setuid dropped, not root's
        # the file tools do not follow a link out of the writable path
        for link in ("shadow", "proc1/environ", "rt/bin/python3", "up/passwd"):
            res = sb.call("read_file", {"path": f"/testbed/{link}"})
            assert not res.ok, (link, res.result)
            assert "root:" not in json.dumps(res.error)
        # a link the sandbox plants, then changes(): the diff names it, never the host file's content
        _sh(sb, "ln -sf /etc/passwd /testbed/planted; echo y > /testbed/src/a.py")
        ch = sb.changes(path="/testbed")
        assert "src/a.py" in ch.changed and "root:x:0:0" not in ch.diff
    # a writable path that is itself a link out of the image's tree: refused before a sandbox starts
    sb2 = Sandbox(image=images["hostile"], writable=("/linked",), writable_size="8m")
    with pytest.raises(UsageError, match="not a directory"):
        sb2.start()
    assert sb2.container_id is None
    sb2.close()


@pytest.mark.parametrize("path", ["/usr/local", "/usr/lib", "/etc"])
def test_the_worker_image_never_makes_its_worker_writable(path: str, no_leaks: None) -> None:
    sb = Sandbox(writable=(path,), writable_size="8m")
    with pytest.raises(UsageError, match="worker runs from"):
        sb.start()
    assert sb.container_id is None
    sb.close()


@pytest.mark.runc_only(
    "the fill's pace is the runner's and the protocol's (a minute under gVisor); gVisor's tmpfs and a fill "
    "under it: test_writable_image_paths and the other tests here"
)
def test_a_100k_file_tree_fills_within_a_bound(images: dict[str, str], no_leaks: None) -> None:
    started = time.monotonic()
    with Sandbox(image=images["many"], writable=("/testbed",), writable_size="64m") as sb:
        took = time.monotonic() - started
        assert sb._originals is not None and sb._originals.trees["/testbed"].files == 100_000
        listed = sb.call("list_files", {"path": "/testbed/many/f99999"})
        assert sb.call("read_file", {"path": "/testbed/many/f99999"}).ok, listed
    assert took < (240 if GVISOR else 120), took
    print(f"100,000 files filled in {took:.1f} s")


def test_a_huge_sparse_file_is_refused_in_bounded_time(images: dict[str, str], no_leaks: None) -> None:
    sb = Sandbox(image=images["sparse"], writable=("/testbed",), writable_size="32m")
    started = time.monotonic()
    with pytest.raises(UsageError, match="writable_size"):
        sb.start()
    assert time.monotonic() - started < 60
    assert sb.container_id is None
    sb.close()
    assert _mine("container", sb.run_id) == []  # the reading container (labelled with the run) is removed
