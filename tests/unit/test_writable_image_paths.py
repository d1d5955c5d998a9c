"""writable= (toolcage.files.imagepaths) without an engine: the paths and sizes checked before anything starts,
the hostile tar of an image's path rewritten into what the sandbox gets (names, setuid bits, owners, hard links,
device nodes, a tree past its cap), the worker placing paths under a writable path of the image, and the
container spec (a tmpfs per path, the worker told which)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from toolcage.engine import writable
from toolcage.errors import UsageError
from toolcage.files import imagepaths
from toolcage.options import RunOptions
from toolcage.policies.model import Limits

MIB = 1 << 20


def _limits(memory: int = 512 * MIB) -> Limits:
    return Limits(memory=memory)


@pytest.mark.parametrize(
    "path",
    ["/proc", "/proc/1", "/sys", "/dev/shm", "/opt/toolcage", "/opt/toolcage/rt", "/opt", "/workspace",
     "/scratch/x", "/", "relative", "/a b", "/a:b", "/x/../proc"],
)  # fmt: skip
def test_reserved_and_odd_paths_are_refused(path: str) -> None:
    with pytest.raises(UsageError, match="writable"):
        writable.check([path], None, _limits(), False, True)


def test_paths_normalised_deduplicated_and_nesting_refused() -> None:
    got = writable.check(["/testbed/", "/testbed", "/root"], "32m", _limits(), False, True)
    assert got == (("/testbed", 32 * MIB), ("/root", 32 * MIB))
    with pytest.raises(UsageError, match="nest"):
        writable.check(["/usr", "/usr/local"], "32m", _limits(), False, True)


def test_sizes_count_against_memory() -> None:
    # 2 x 256 MiB + 64 MiB scratch > 512 MiB: a tmpfs is memory, the error says so and names the fix
    with pytest.raises(UsageError, match="memory") as exc:
        writable.check(["/testbed", "/root"], None, _limits(), False, True)
    assert "--memory" in exc.value.message and "writable_size" in exc.value.message
    assert writable.check(["/testbed", "/root"], None, _limits(1024 * MIB), False, True)
    with pytest.raises(UsageError, match="workspace copy"):  # the copy's tmpfs counts too
        writable.check(["/testbed"], "256m", _limits(), True, True)


@pytest.mark.parametrize("path", ["/usr", "/usr/local", "/usr/lib/python3.11", "/etc", "/lib", "/bin"])
def test_a_worker_image_keeps_its_own_worker_read_only(path: str) -> None:
    with pytest.raises(UsageError, match="worker runs from"):
        writable.check_worker_image(((path, MIB),))
    writable.check_worker_image((("/tmp", MIB), ("/root", MIB), ("/testbed", MIB)))


def test_no_container_no_writable_and_bad_sizes() -> None:
    with pytest.raises(UsageError, match="sandbox none"):
        writable.check(["/testbed"], None, _limits(), False, False)
    for bad in ("lots", "0", "100k"):
        with pytest.raises(UsageError, match="writable_size"):
            writable.check(["/testbed"], bad, _limits(), False, True)


def test_run_options_carry_the_paths_and_refuse_a_size_alone() -> None:
    opts = RunOptions.resolve(tool="t", sandbox="container", writable="/testbed", writable_size="64m")
    assert opts.writable == (("/testbed", 64 * MIB),)
    with pytest.raises(UsageError, match="writable=PATH"):
        RunOptions.resolve(tool="t", sandbox="container", writable_size="64m")
    with pytest.raises(UsageError, match="/proc"):
        RunOptions.resolve(tool="t", sandbox="container", writable=("/proc/self",))


# -- the rewrite of the engine's tar --------------------------------------------------------------------------


def _add(tf: tarfile.TarFile, name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", **kw: object) -> None:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.size = len(data) if kind == tarfile.REGTYPE else 0
    ti.mode = int(kw.pop("mode", 0o644))  # type: ignore[call-overload]
    for key, value in kw.items():
        setattr(ti, key, value)
    tf.addfile(ti, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def _engine_tar(tmp: Path, build: object) -> str:
    raw = tmp / "raw.tar"
    with tarfile.open(raw, "w", format=tarfile.PAX_FORMAT) as tf:
        _add(tf, "testbed", tarfile.DIRTYPE, mode=0o755)
        build(tf)  # type: ignore[operator]
    return str(raw)


def _members(tar: str) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(tar) as tf:
        return {m.name: m for m in tf.getmembers()}


def test_hostile_entries_are_rewritten_or_left_out(tmp_path: Path) -> None:
    def build(tf: tarfile.TarFile) -> None:
        _add(tf, "testbed/src", tarfile.DIRTYPE, mode=0o700)
        _add(tf, "testbed/src/calc.py", data=b"x = 1\n", uid=0, gid=0, mode=0o600)
        _add(tf, "testbed/suid", data=b"\x7fELF", mode=0o4755)
        _add(tf, "testbed/sgid_sticky", data=b"", mode=0o3777)
        _add(tf, "testbed/hard", tarfile.LNKTYPE, linkname="testbed/src/calc.py")
        _add(tf, "testbed/hard_out", tarfile.LNKTYPE, linkname="etc/shadow")
        _add(tf, "testbed/proc1", tarfile.SYMTYPE, linkname="/proc/1")
        _add(tf, "testbed/rt", tarfile.SYMTYPE, linkname="/opt/toolcage/rt")
        _add(tf, "testbed/shadow", tarfile.SYMTYPE, linkname="../etc/shadow")
        _add(tf, "testbed/null", tarfile.CHRTYPE, devmajor=1, devminor=3)
        _add(tf, "testbed/sda", tarfile.BLKTYPE, devmajor=8, devminor=0)
        _add(tf, "testbed/fifo", tarfile.FIFOTYPE)
        _add(tf, "testbed/../../etc/passwd", data=b"root::0:0::/:/bin/sh\n")
        _add(tf, "other/x", data=b"not under the path")

    tree = imagepaths._rewrite(_engine_tar(tmp_path, build), str(tmp_path / "out.tar"), "/testbed", 64 * MIB)
    got = _members(tree.tar)
    assert set(got) == {"src", "src/calc.py", "suid", "sgid_sticky", "hard", "proc1", "rt", "shadow"}
    assert all(m.uid == m.gid == 65532 for m in got.values())
    assert got["suid"].mode == 0o755 and got["sgid_sticky"].mode == 0o777  # setuid, setgid, sticky dropped
    assert got["hard"].isreg() and got["hard"].size == 6  # a hard link made a file with its target's bytes
    assert (got["proc1"].linkname, got["rt"].linkname) == ("/proc/1", "/opt/toolcage/rt")  # names, not followed
    reasons = {s["path"]: s["reason"] for s in tree.skipped}
    assert "device node" in reasons["null"] and "device node" in reasons["sda"] and "FIFO" in reasons["fifo"]
    assert "outside" in reasons["hard_out"]
    assert any("passwd" in p for p in reasons) and "other/x" in reasons
    assert (tree.files, tree.symlinks, tree.dirs) == (4, 3, 1)


def test_a_tree_past_its_cap_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    def build(tf: tarfile.TarFile) -> None:
        for i in range(300):  # 300 one-byte files take 300 pages (1.2 MiB) in a tmpfs, past a 1 MiB cap
            _add(tf, f"testbed/f{i}", data=b"x")

    with pytest.raises(UsageError, match="4 KiB pages"):
        imagepaths._rewrite(_engine_tar(tmp_path, build), str(tmp_path / "out.tar"), "/testbed", MIB)


def test_too_many_entries_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imagepaths, "MAX_ENTRIES", 50)

    def build(tf: tarfile.TarFile) -> None:
        for i in range(60):
            _add(tf, f"testbed/d{i}", tarfile.DIRTYPE, mode=0o755)

    with pytest.raises(UsageError, match="more than 50 entries"):
        imagepaths._rewrite(_engine_tar(tmp_path, build), str(tmp_path / "out.tar"), "/testbed", 64 * MIB)


def test_the_old_side_is_extracted_without_following_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()

    def build(tf: tarfile.TarFile) -> None:
        _add(tf, "testbed/esc", tarfile.SYMTYPE, linkname=str(outside))
        _add(tf, "testbed/esc/planted", data=b"through the link")  # beneath the symlink: never written
        _add(tf, "testbed/ok", data=b"fine", mode=0o755)

    tree = imagepaths._rewrite(_engine_tar(tmp_path, build), str(tmp_path / "out.tar"), "/testbed", 64 * MIB)
    root = tmp_path / "orig"
    root.mkdir()
    imagepaths._extract(tree.tar, str(root))
    assert not list(outside.iterdir())
    assert os.readlink(root / "esc") == str(outside)
    assert (root / "ok").read_bytes() == b"fine" and os.access(root / "ok", os.X_OK)


# -- the container spec and the worker's roots --------------------------------------------------------------


def test_the_spec_mounts_a_tmpfs_per_path_and_tells_the_worker() -> None:
    from toolcage.engine.hostconfig import container_config
    from toolcage.engine.labels import RunSpec
    from toolcage.policies import Policy

    run = RunSpec(
        run_id="r1", tool="t", image="img", policy_name="default", started_at="now", deadline=0.0, owner="h:1",
        owner_started="0", writable=(("/testbed", 64 * MIB), ("/usr/local", 32 * MIB)),
    )  # fmt: skip
    config = container_config(Policy(), run)
    tmpfs = config["HostConfig"]["Tmpfs"]
    assert tmpfs["/testbed"] == f"rw,nosuid,nodev,exec,size={64 * MIB},uid=65532,gid=65532,mode=0755"
    assert tmpfs["/usr/local"].startswith("rw,nosuid,nodev,exec,size=33554432,")
    assert "TOOLCAGE_WRITABLE=/testbed:/usr/local" in config["Env"]
    assert config["HostConfig"]["ReadonlyRootfs"] is True


def test_gvisor_keeps_a_writable_tmp_the_run_asked_for() -> None:
    """runsc's own /tmp is covered by an empty read-only tmpfs (toolcage.engine.knobs), except where writable=
    put the run's capped one."""
    import dataclasses

    from toolcage.engine.hostconfig import container_config
    from toolcage.engine.knobs import GVISOR
    from toolcage.engine.labels import RunSpec
    from toolcage.policies import Policy

    base = RunSpec(
        run_id="r1", tool="t", image="img", policy_name="default", started_at="now", deadline=0.0, owner="h:1",
        owner_started="0", runtime=GVISOR,
    )  # fmt: skip
    assert container_config(Policy(), base)["HostConfig"]["Tmpfs"]["/tmp"].startswith("ro,")
    run = dataclasses.replace(base, writable=(("/tmp", 8 * MIB),))
    assert container_config(Policy(), run)["HostConfig"]["Tmpfs"]["/tmp"].startswith(
        "rw,nosuid,nodev,exec,size=8388608"
    )


def test_the_worker_places_paths_under_a_writable_image_path() -> None:
    from toolcage.worker.errors import PathEscape
    from toolcage.worker.settings import Settings
    from toolcage.worker.tools.paths import locate

    try:
        s = Settings(None, None, "/tmp", "r", image_roots=("/testbed",))
        assert s.writable_roots == ("/scratch", "/testbed")
        loc = locate("/testbed/src/../x.py", None, "/tmp")
        assert (loc.name, loc.real, loc.rel) == ("/testbed", "/testbed", "x.py")
        assert s.real_root("/testbed") == "/testbed"
        with pytest.raises(PathEscape):
            locate("/testbedx/a", None, "/tmp")
        with pytest.raises(PathEscape):
            locate("/etc/shadow", None, "/tmp")
    finally:
        Settings(None, None, "/tmp", "r")  # the module's roots back to none
    with pytest.raises(PathEscape):
        locate("/testbed/x", None, "/tmp")
