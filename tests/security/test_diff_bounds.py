"""changes() and the diff from the attacker's side: the host pays a bounded, linear price for any copy.

The sandbox chooses every byte of its workspace copy. What must hold (issue 34, points 1 and 4):

- a flood of newlines in one file costs the runner memory in proportion to nothing it holds as lines:
  the file comes back as a binary patch or as changed-not-shown, and the runner's peak RSS (measured in
  a child process, git's included) stays under ``RSS_BOUND``;
- a file rewritten to make a line diff quadratic (a filler after each of 16,000 lines) costs a few CPU
  seconds at most, and the diff still applies (or names the file as not shown);
- a sparse file (no blocks, a large size) is named as changed-not-shown, never read as its zeros;
- a symlink the copy made that points out of the workspace (absolute, or climbing out with ``..``) is
  never in the diff nor written by ``download_to``, and is named in ``skipped``; a link that stays
  inside is kept.

The measured cases run the sandbox in a child process (``python -c``) so its own peak RSS and CPU
(children included: git) are what is read. Run under runc and gVisor (TOOLCAGE_SANDBOX=gvisor).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.security.test_workspace_attacks import FakeWorker, hostile_tar
from toolcage import CallResult, Sandbox
from toolcage.files.changes import collect

pytestmark = pytest.mark.usefixtures("no_leaks")

ROOT = Path(__file__).resolve().parents[2]
LONG = {"call_s": 120, "run_s": 600, "idle_s": 600}
RSS_BOUND_MB = 400  # the runner's peak RSS for a changes() over a 16 MiB newline flood (before: 1.5 GB)
CPU_BOUND_S = 8.0  # runner + git CPU for the quadratic rewrite (before: ~80 s)

# The child: a copy-mode sandbox over ``ws``, ``command`` run in it, then changes() measured. It prints
# one JSON line: peak RSS (its own VmHWM; its children's ru_maxrss, git's, an upper bound: it counts the
# forking process's RSS too), CPU seconds spent in changes() (self and children).
CHILD = r"""
import json, resource, sys, time
from toolcage import Sandbox, wait_removed
ws, command, policy = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
with Sandbox(policy, workspace=ws, workspace_mode="copy") as sb:
    r = sb.call("run_shell", {"command": command})
    assert r.ok and r.result["exit_code"] == 0, r
    def cpu():
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
    c0, t0 = cpu(), time.monotonic()
    ch = sb.changes()
    c1, t1 = cpu(), time.monotonic()
wait_removed(60)
def hwm():  # this process's own peak (ru_maxrss would carry the forking parent's over exec)
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1])
out = {
    "rss_kb": hwm(),
    "child_rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    "cpu_s": c1 - c0, "wall_s": t1 - t0,
    "added": list(ch.added), "changed": list(ch.changed), "removed": list(ch.removed),
    "not_shown": [dict(x) for x in getattr(ch, "not_shown", ())], "skipped": list(ch.skipped),
}
sys.stdout.write("\n" + json.dumps(out) + "\n")
sys.stdout.write(ch.diff)
"""


def measured(ws: Path, command: str, timeout: float = 120) -> tuple[dict[str, Any], str]:
    """The child's figures and the diff it got, for ``command`` run in a copy of ``ws``."""
    policy = {"timeouts": LONG}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(ws), command, json.dumps(policy)],
        capture_output=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    _, line, diff = done.stdout.split(b"\n", 2)
    figures = json.loads(line)
    print(f"figures: {figures}")
    return figures, diff.decode("utf-8", "surrogateescape")


def applied(diff: str, ws: Path, where: Path) -> Path:
    """``diff`` applied by ``git apply`` in a fresh copy of ``ws``: the copy."""
    shutil.copytree(ws, where, symlinks=True)
    done = subprocess.run(
        ["git", "apply", "-"], cwd=where, input=diff.encode("utf-8", "surrogateescape"), capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return where


def not_shown(fig: dict[str, Any]) -> dict[str, str]:
    return {x["path"]: x["reason"] for x in fig["not_shown"]}


def test_a_newline_flood_costs_the_runner_a_bounded_rss(tmp_path: Path) -> None:
    """16 MiB of newlines in the copy: the runner's peak RSS stays under RSS_BOUND_MB, the file comes back
    as a binary patch that applies or as changed-not-shown (before: 1.5 GB, difflib's lines)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "keep.txt").write_text("kept\n")
    fig, diff = measured(ws, "head -c 16777216 /dev/zero | tr '\\0' '\\n' > /workspace/flood")
    assert fig["added"] == ["flood"]
    assert max(fig["rss_kb"], fig["child_rss_kb"]) < RSS_BOUND_MB * 1024, fig
    if "flood" not in not_shown(fig):
        assert "GIT binary patch" in diff
        out = applied(diff, ws, tmp_path / "applied")
        assert (out / "flood").read_bytes() == b"\n" * (16 << 20)


# ``toolcage run`` in a child that reports its own peak RSS (and its children's: git) on stderr at exit.
CLI = r"""
import atexit, resource, runpy, sys
def peak():
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open("/proc/self/status") as f:  # VmHWM: this process's own peak (ru_maxrss carries the parent's)
        own = int(next(line for line in f if line.startswith("VmHWM:")).split()[1])
    sys.stderr.write("\nPEAK %d %d\n" % (own, c.ru_maxrss))
atexit.register(peak)
sys.argv = ["toolcage", *sys.argv[1:]]
runpy.run_module("toolcage.cli", run_name="__main__")
"""


def test_the_cli_diff_of_a_newline_flood_costs_a_bounded_rss(tmp_path: Path) -> None:
    """``toolcage run --workspace-mode copy --diff F`` after 16 MiB of newlines: the CLI's peak RSS stays under
    RSS_BOUND_MB and F applies (before: 1.5 GB for 16 MiB, 2.98 GB for 32 MiB)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "keep.txt").write_text("kept\n")
    diff = tmp_path / "c.diff"
    params = json.dumps({"command": "head -c 16777216 /dev/zero | tr '\\0' '\\n' > /workspace/flood"})
    args = ["run", "run_shell", "--workspace", str(ws), "--workspace-mode", "copy", "--params", params]
    done = subprocess.run(
        [sys.executable, "-c", CLI, *args, "--diff", str(diff)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["changes"]["added"] == ["flood"]
    rss, git_rss = (int(x) for x in done.stderr.rsplit("PEAK ", 1)[1].split())
    print(f"figures: cli peak RSS {rss} KiB, git {git_rss} KiB")
    assert max(rss, git_rss) < RSS_BOUND_MB * 1024
    out = applied(diff.read_text(), ws, tmp_path / "applied")
    assert (out / "flood").read_bytes() == b"\n" * (16 << 20)


def test_a_quadratic_rewrite_costs_a_few_cpu_seconds(tmp_path: Path) -> None:
    """A 16,000-line host file rewritten with a filler after each line: changes() takes under
    CPU_BOUND_S of CPU (runner and git) and its diff applies (before: ~80 s, difflib)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    lines = [f"pkg-{i} == {i}.{i % 7}.{i % 13}\n" for i in range(16_000)]
    (ws / "lock.txt").write_text("".join(lines))
    filler = "awk '{print; print \"filler\"}' /workspace/lock.txt > /scratch/x && cat /scratch/x > /workspace/lock.txt"
    fig, diff = measured(ws, filler, timeout=60)
    assert fig["changed"] == ["lock.txt"]
    assert fig["cpu_s"] < CPU_BOUND_S, fig
    if "lock.txt" not in not_shown(fig):
        out = applied(diff, ws, tmp_path / "applied")
        assert (out / "lock.txt").read_text() == "".join(line + "filler\n" for line in lines)


def test_a_sparse_file_is_changed_not_shown(tmp_path: Path) -> None:
    """A 256 MiB file with no blocks in the copy is named as changed-not-shown, the runner's RSS stays
    bounded and nothing in the diff stands for it (before: 1.6 GB RSS for 512 MiB)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "keep.txt").write_text("kept\n")
    fig, diff = measured(ws, "truncate -s 256M /workspace/holes && echo more >> /workspace/keep.txt")
    assert "holes" in fig["added"] + fig["changed"], fig
    assert "holes" in not_shown(fig), fig
    assert "holes" not in diff
    assert max(fig["rss_kb"], fig["child_rss_kb"]) < RSS_BOUND_MB * 1024, fig
    out = applied(diff, ws, tmp_path / "applied")
    assert (out / "keep.txt").read_text() == "kept\nmore\n"


def test_links_out_of_the_workspace_never_leave_through_the_diff(tmp_path: Path) -> None:
    """Symlinks the copy made to /etc, to /root/.ssh/authorized_keys and to ../../x, and a HEAD that would
    make a bare repository of a directory (git run there reads its config) are neither in the diff nor in
    download_to, each named in skipped; a link inside the workspace is kept (before: git apply made them
    all in the host's tree)."""
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "a.txt").write_text("a\n")
    out = tmp_path / "out"
    with Sandbox({"timeouts": LONG}, workspace=ws, workspace_mode="copy") as sb:
        r = sb.call(
            "run_shell",
            {
                "command": "cd /workspace && ln -s /etc etc && ln -s /root/.ssh/authorized_keys keys"
                " && ln -s ../../x sub/up && ln -s ../../x up && ln -s ../a.txt sub/ok && ln -s a.txt ok"
                " && mkdir -p bare/objects/info bare/refs/heads && echo x > bare/objects/info/x"
                " && echo x > bare/refs/heads/x && echo 'ref: refs/heads/x' > bare/HEAD"
                " && printf '[core]\\n\\tfsmonitor = touch /tmp/pwned\\n' > bare/config"
            },
        )
        assert r.ok and r.result["exit_code"] == 0, r
        ch = sb.changes(download_to=out)
    links = {"etc", "keys", "sub/up", "up"}
    bad = links | {"bare/HEAD"}
    skipped = {s["path"]: s["reason"] for s in ch.skipped}
    assert bad <= set(skipped), ch.skipped
    assert all("symlink" in skipped[p] for p in links) and "bare git repository" in skipped["bare/HEAD"]
    assert not bad & set(ch.added + ch.changed), ch
    assert {"ok", "sub/ok"} <= set(ch.added)
    host = applied(ch.diff, ws, tmp_path / "applied")
    for p in bad:
        assert not os.path.lexists(host / p), p
        assert not os.path.lexists(out / p), p
    assert os.readlink(host / "sub/ok") == "../a.txt" and os.readlink(out / "ok") == "a.txt"


class SkippingWorker(FakeWorker):
    """An attacker's worker whose download answers also name paths as skipped in the sandbox."""

    def __init__(self, hints: dict[str, Any], stream: bytes, skipped: list[dict[str, str]]) -> None:
        super().__init__(hints, stream)
        self.skipped = skipped

    def __call__(self, tool: str, params: dict[str, Any]) -> CallResult:
        res = super().__call__(tool, params)
        if tool == "download" and isinstance(res.result, dict):
            res.result["skipped"], self.skipped = self.skipped, []
        return res


def test_a_hostile_worker_cannot_turn_unsent_into_removed_nor_send_links_out(tmp_path: Path) -> None:
    """changes.collect fed by an attacker's worker: a host file named as changed and reported as a skipped
    sparse file is changed-not-shown (never a deletion in the diff); links out (absolute, climbing) sent
    in the stream are skipped, in neither the diff nor download_to; a link inside is kept."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big.bin").write_bytes(b"host's own\n")
    (ws / "a.txt").write_text("a\n")
    hints = {"changed": ["/workspace/big.bin", "/workspace/etc", "/workspace/up", "/workspace/ok"], "removed": []}
    stream = hostile_tar(("etc", "link", "/etc"), ("up", "link", "../../x"), ("ok", "link", "a.txt"))
    fake = SkippingWorker(hints, stream, [{"path": "big.bin", "reason": "sparse: 1073741824 bytes, 0 on disk"}])
    got = collect(fake, ws, gitignore=False, download_to=tmp_path / "files")
    assert got.changed == ("big.bin",) and got.added == ("ok",) and got.removed == ()
    assert [x["path"] for x in got.not_shown] == ["big.bin"] and "sparse" in got.not_shown[0]["reason"]
    assert {s["path"] for s in got.skipped} == {"etc", "up"}
    assert "big.bin" not in got.diff and "etc" not in got.diff and "b/ok" in got.diff
    done = applied(got.diff, ws, tmp_path / "applied")
    assert (done / "big.bin").read_bytes() == b"host's own\n" and os.readlink(done / "ok") == "a.txt"
    assert sorted(os.listdir(tmp_path / "files")) == ["ok"]


def test_a_host_file_the_copy_withheld_never_enters_the_diff(tmp_path: Path) -> None:
    """A host file the sandbox's user cannot read (0600 of another uid) is withheld from the copy; the
    sandbox writing a file of that name, or a hostile worker naming it as removed, never brings its host
    bytes into the diff (the diff goes to whoever asked: often a model): the path is named in ``skipped``."""
    ws = tmp_path / "ws"
    ws.mkdir()
    marker = "HOST-ONLY-" + os.urandom(8).hex()
    (ws / "secret.txt").write_text(marker + "\n")
    os.chmod(ws / "secret.txt", 0o600)
    (ws / "private").mkdir(mode=0o700)
    (ws / "private" / "inside.txt").write_text(marker + "\n")
    (ws / "open.txt").write_text("open\n")
    with Sandbox({"timeouts": LONG}, workspace=ws, workspace_mode="copy") as sb:
        r = sb.call(
            "run_shell",
            {
                "command": "cd /workspace && echo mine > secret.txt && mkdir -p private"
                " && echo mine > private/inside.txt && echo more >> open.txt"
            },
        )
        assert r.ok and r.result["exit_code"] == 0, r
        got = sb.changes()
    assert marker not in got.diff and got.changed == ("open.txt",), got
    assert {"secret.txt", "private/inside.txt"} <= {s["path"] for s in got.skipped}
    fake = FakeWorker({"changed": [], "removed": ["/workspace/secret.txt", "/workspace/private/inside.txt"]}, b"")
    got = collect(fake, ws, gitignore=False)
    assert marker not in got.diff and not got.removed, got
