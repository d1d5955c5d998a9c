"""Snapshots, resume and downloads cost the host what the sandbox may hold, no more (issue 34, point 2).

- many entries with 4 KB paths: the runner's peak memory for ``snapshot()`` and for ``Sandbox(resume=)``
  stays under a fixed figure, and the snapshot written resumes;
- an unsigned hostile archive (many long names) is refused before a header of it is parsed: fast, in
  bounded memory;
- a sparse 1 GiB file in a 64 MiB scratch: ``download`` and ``snapshot`` put at most the scratch's size on
  the host's disk and name the file as skipped ("sparse: ...");
- a secret the connector may read, written in a cheap disguise (reversed, upper-cased, base32, rot13,
  gzipped, split across two files, in mtimes): ``snapshot()`` refuses.

Each was written first and failed on the code before the change; the figures (before and after) are in
docs/security.md, "Snapshots and resume". Memory is the peak RSS of a child process that does only that.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, secret_connector
from toolcage import Sandbox
from toolcage.files.snapshot import SnapshotError

KEY = b"k" * 32
LONG = {"call_s": 120, "run_s": 600, "idle_s": 600}
MiB = 1 << 20
# the runner's memory a snapshot or a resume may add over what the process held before it (docs/security.md)
MEMORY_BOUND = 64 * MiB

# 30,000 empty files whose paths are 3.6 KB (14 directories of 240 characters, then a 200-character name)
MANY = 30_000
MAKE = """
import os
d = "/scratch/" + "/".join(["d" * 240] * 14)
os.makedirs(d)
fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
for i in range({n}):
    os.close(os.open(f"{{i:07d}}" + "f" * 193, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
print(len(d))
"""

CHILD = """
import json, os, resource, sys, time
from toolcage import Sandbox

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

what, target, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
key = b"k" * 32
timeouts = {"call_s": 120, "run_s": 600, "idle_s": 600}
if what == "snapshot":
    with Sandbox({"timeouts": timeouts}, tool="snapbounds", snapshot_key=key) as sb:
        r = sb.call("run_python", {"code": sys.stdin.read()})
        assert r.ok and r.result["exit_code"] == 0, r
        base, t = peak(), time.monotonic()
        info = sb.snapshot(target)
        out = {"base": base, "peak": peak(), "s": time.monotonic() - t, "files": info.files}
else:
    base, t = peak(), time.monotonic()
    with Sandbox({"timeouts": timeouts}, tool="snapbounds", resume=target, snapshot_key=key) as sb:
        r = sb.call("run_shell", {"command": "find /scratch -type f | wc -l"})
        out = {"base": base, "peak": peak(), "s": time.monotonic() - t, "files": int(r.result["stdout"])}
print(json.dumps(out))
"""


def _child(*args: str, stdin: str = "", timeout: float = 300) -> dict[str, Any]:
    """One run of CHILD in a fresh interpreter: its figures (peak RSS before and after, seconds, files)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *args], input=stdin, capture_output=True, text=True, timeout=timeout, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.fixture
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The host's snapshot key in this test's directory, never the user's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.mark.runc_only(
    "the runner's memory for many entries: host-side; the worker's stream is checked under gVisor "
    "by the other snapshot bounds (54 s of the gVisor pass)"
)
def test_many_long_paths_cost_the_runner_a_bounded_memory_and_resume(
    engine: Any, no_leaks: None, state_home: Path, tmp_path: Path
) -> None:
    """30,000 empty files with 3.6 KB paths: snapshot() and Sandbox(resume=) each add less than
    MEMORY_BOUND to the runner's peak RSS, and the snapshot written resumes with every file."""
    target = tmp_path / "many.tar"
    made = _child("snapshot", str(target), str(MANY), stdin=MAKE.format(n=MANY))
    print("snapshot", made, target.stat().st_size)
    assert made["files"] == MANY
    assert made["peak"] - made["base"] < MEMORY_BOUND, made
    back = _child("resume", str(target), "0")
    print("resume", back)
    assert back["files"] == MANY
    assert back["peak"] - back["base"] < MEMORY_BOUND, back


# --- an unsigned hostile archive -----------------------------------------------------------------------

HOSTILE = 30_000  # entries, each with a 4,000-byte name (a 167 MB archive)

VERIFY = """
import json, resource, sys, time
from toolcage.files import snapshot
base, t = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, time.monotonic()
try:
    snapshot.verify(sys.argv[1], b"k" * 32)
    why = None
except snapshot.SnapshotInvalid as exc:
    why = str(exc)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"base": base, "peak": peak, "s": time.monotonic() - t, "why": why}))
"""


def _hostile(path: Path, n: int) -> None:
    """A tar of ``n`` empty files with 4,000-byte names, then a manifest.json that claims to be a
    snapshot: no key made it."""
    with open(path, "wb") as f:
        for i in range(n):
            info = tarfile.TarInfo(f"scratch/{i:07d}" + "n" * 3985)
            f.write(info.tobuf(tarfile.PAX_FORMAT))
        body = json.dumps({"format": "toolcage-snapshot", "version": 1, "entries": [], "mac": "0" * 64}).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(body)
        f.write(info.tobuf(tarfile.PAX_FORMAT) + body + bytes(-len(body) % 512) + bytes(1024))


def test_an_unsigned_archive_with_many_long_names_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    """verify() of a 167 MB unsigned archive (30,000 names of 4 KB) refuses it in under 2 s and under
    16 MiB of the runner's memory: the signature is read first, at the archive's end."""
    bad = tmp_path / "hostile.tar"
    _hostile(bad, HOSTILE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", VERIFY, str(bad)], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    print("verify", got, bad.stat().st_size)
    assert got["why"] is not None and "signature" in got["why"], got
    assert got["s"] < 2, got
    assert got["peak"] - got["base"] < 16 * MiB, got


# --- sparse files ---------------------------------------------------------------------------------------


def _on_disk(root: Path) -> int:
    """Bytes the tree under ``root`` takes on the host's disk (allocated blocks, not sizes)."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total


def test_a_sparse_file_leaves_the_sandbox_as_skipped(
    engine: Any, no_leaks: None, state_home: Path, tmp_path: Path
) -> None:
    """A 1 GiB file with no blocks in a 64 MiB scratch: download() and snapshot() write at most 64 MiB to
    the host's disk, and name the file as skipped, "sparse"."""
    with Sandbox({"timeouts": LONG}, tool="snapbounds", snapshot_key=KEY) as sb:
        r = sb.call("run_shell", {"command": "truncate -s 1G /scratch/hole.bin && echo kept > /scratch/kept.txt"})
        assert r.ok and r.result["exit_code"] == 0, r
        t = time.monotonic()
        got = sb.download("/scratch", tmp_path / "dl")
        print("download", _on_disk(tmp_path / "dl"), time.monotonic() - t, got.skipped)
        assert (tmp_path / "dl" / "kept.txt").read_text() == "kept\n"
        assert _on_disk(tmp_path / "dl") <= 64 * MiB
        assert [s for s in got.skipped if s["path"].endswith("hole.bin") and "sparse" in s["reason"]], got.skipped
        t = time.monotonic()
        info = sb.snapshot(tmp_path / "s.tar")
        print("snapshot", (tmp_path / "s.tar").stat().st_size, time.monotonic() - t, info.skipped)
        assert (tmp_path / "s.tar").stat().st_size <= 64 * MiB
        assert [s for s in info.skipped if s["path"].endswith("hole.bin") and "sparse" in s["reason"]], info.skipped


# --- the secret scan ------------------------------------------------------------------------------------

BOUND = "api.example.test"  # the secret's origin: allowed, never reached (the network is internal)
TOKEN = "tcsecret_" + secrets.token_hex(16)
STASH = '''
import base64, codecs, gzip, os, zlib
from typing import Any

from toolcage.sdk import Context, tool


@tool
def stash(ctx: Context, form: str) -> dict[str, Any]:
    """Writes the run's secret into /scratch/f, in the disguise asked for."""
    v = ctx.secret("TOKEN").encode()
    half = len(v) // 2
    os.makedirs("/scratch/f")
    if form == "mtimes":  # four bytes of it in each file's mtime, the files in the order a walk sends them
        for i in range(0, len(v), 4):
            p = f"/scratch/f/m{i:03d}"
            open(p, "w").close()
            t = int.from_bytes(v[i : i + 4].ljust(4, b"_"), "big")
            os.utime(p, (t, t))
        return {}
    files = {
        "reversed": {"a": v[::-1]},
        "upper": {"a": v.upper()},
        "base32": {"a": base64.b32encode(b"key=" + v)},
        "base32-lower": {"a": base64.b32encode(b"k:" + v).lower()},
        "rot13": {"a": codecs.encode(v.decode(), "rot13").encode()},
        "gzip": {"a.gz": gzip.compress(b"token: " + v + b"\\n")},
        "zlib": {"a.z": zlib.compress(b"token: " + v + b"\\n")},
        "split": {"a": v[:half], "b": v[half:]},
    }[form]
    for name, data in files.items():
        with open(f"/scratch/f/{name}", "wb") as f:  # a compressed file as the tool makes it, the rest in text
            f.write(data if form in ("gzip", "zlib") else b"a line before it\\n" + data + b"\\n")
    return {}
'''
FORMS = ("reversed", "upper", "base32", "base32-lower", "rot13", "gzip", "zlib", "split", "mtimes")


def test_a_secret_in_a_cheap_disguise_is_refused(
    engine: Any, no_leaks: None, internal_net: str, state_home: Path, tmp_path: Path
) -> None:
    """A connector that may read the secret writes it reversed, upper-cased, in base32 (either case), rot13,
    gzipped or zlib-compressed, split across two files or in mtimes: snapshot() refuses each and writes
    nothing; with the files gone, the same run snapshots."""
    conn, pol = secret_connector(tmp_path, "snap-forms", STASH, BOUND)
    out = tmp_path / "out"
    out.mkdir()
    passed: list[str] = []
    with Sandbox(
        pol, tool="snap-forms", tools=[conn], secrets={"TOKEN": TOKEN}, egress_network=internal_net, snapshot_key=KEY
    ) as sb:
        for form in FORMS:
            r = sb.call("stash", {"form": form})
            assert r.ok, r
            try:
                sb.snapshot(out / "s.tar")
                passed.append(form)
            except SnapshotError as exc:
                assert "secret" in str(exc) and TOKEN not in str(exc), (form, str(exc))
            assert not (out / "s.tar").exists() or form in passed, form
            (out / "s.tar").unlink(missing_ok=True)
            r = sb.call("run_shell", {"command": "rm -rf /scratch/f"})
            assert r.ok and r.result["exit_code"] == 0, r
        info = sb.snapshot(out / "s.tar")  # the control: with the files gone, the same run snapshots
    assert passed == [], f"passed the scan: {passed}"
    assert TOKEN.encode() not in (out / "s.tar").read_bytes() and info.files == 0
