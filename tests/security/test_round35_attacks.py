"""Round 35's attacks on what landed that day (issue 35), from the sandbox and from a hostile workspace.

- changes() asks git on the HOST (``git check-ignore`` in the host's repository) which changed paths its
  rules ignore. The workspace may be hostile (an unpacked tarball with its own ``.git``): its config must
  not make that git run anything. A partial clone's lazy fetch of a missing ``.gitignore`` blob runs the
  remote's ``uploadpack`` (a shell command) unless the runner's git is kept off every transport.
- A hostile image's labels are merged into its containers' labels: one under toolcage.'s prefix that a
  run sets only sometimes (``toolcage.keep``) must not decide what gc and ``toolcage rm`` do with it.
- ``toolcage rm X``: docker takes X as a container id's unique prefix; a run id must never name another run.
- ``--stream``, a connector's progress and did-you-mean: what the sandbox (or a caller) chose reaches the
  terminal escaped; a flood is bounded by the output cap.
- check-ignore fed hostile names (pathspec magic, newlines, 20,000 deep paths in a set's order).
- a bare repository made in two downloads (HEAD first, objects/ and refs/ with hooks next).
"""

from __future__ import annotations

import io
import os
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from toolcage.files import gitplumb
from toolcage.image.build import record_built


def git(cwd: Path, *args: str) -> str:
    """git in ``cwd`` with no user or system config (the test's own, never the runner's)."""
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    cfg = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    done = subprocess.run(["git", *cfg, *args], cwd=cwd, env=env, check=True, capture_output=True)
    return done.stdout.decode()


def promisor_trap(ws: Path, flag: Path) -> None:
    """Make ``ws`` a repository whose ignore rules need a blob it lacks, fetched by running a command."""
    ws.mkdir()
    git(ws, "init", "-q")
    (ws / "a.txt").write_text("hi\n")
    git(ws, "add", "a.txt")
    git(ws, "commit", "-q", "-m", "init")
    # a .gitignore only in the index (skip-worktree: git reads its rules from the blob), the blob missing
    git(ws, "update-index", "--add", "--cacheinfo", f"100644,{'1' * 40},.gitignore")
    git(ws, "update-index", "--skip-worktree", ".gitignore")
    git(ws, "config", "core.repositoryformatversion", "1")
    git(ws, "config", "extensions.partialClone", "origin")
    git(ws, "config", "remote.origin.promisor", "true")
    git(ws, "config", "remote.origin.url", str(ws))
    git(ws, "config", "remote.origin.uploadpack", f"touch {flag}; git-upload-pack")


def test_a_hostile_workspace_repo_runs_nothing_through_check_ignore(tmp_path: Path) -> None:
    """A partial clone's lazy fetch (its uploadpack a shell command) is never started by the ignore check."""
    flag = tmp_path / "PWNED"
    promisor_trap(tmp_path / "ws", flag)
    home = tmp_path / "home"
    home.mkdir()
    got = gitplumb.host_ignored(str(tmp_path / "ws"), ["x.pyc", "a.txt"], str(home), time.monotonic() + 30)
    assert got == set()
    assert not flag.exists(), "the workspace's git config ran a command on the host"


def test_a_gitfile_pointing_at_a_hostile_repo_runs_nothing(tmp_path: Path) -> None:
    """A workspace whose .git is a file (gitdir: elsewhere) leads git to the trap repository: nothing runs."""
    flag = tmp_path / "PWNED"
    promisor_trap(tmp_path / "trap", flag)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".git").write_text(f"gitdir: {tmp_path / 'trap' / '.git'}\n")
    home = tmp_path / "home"
    home.mkdir()
    gitplumb.host_ignored(str(ws), ["x.pyc"], str(home), time.monotonic() + 30)
    assert not flag.exists(), "the gitdir's config ran a command on the host"


def test_a_hostile_images_keep_label_does_not_keep_its_runs(engine: Any, no_leaks: None) -> None:
    """An image labelled toolcage.keep=1 (image labels are merged into its containers'): a run of it that
    was not started with --keep is not kept (gc and the reaper would otherwise never collect it)."""
    from toolcage import DEFAULT_IMAGE, Sandbox
    from toolcage.engine import sharedfiles
    from toolcage.lifecycle import reaper

    tag = f"toolcage-test-keeplabel-{secrets.token_hex(4)}:1"
    dockerfile = f"FROM {DEFAULT_IMAGE}\nLABEL toolcage.keep=1 toolcage.test={tag}\n".encode()
    list(engine.api.build(fileobj=io.BytesIO(dockerfile), tag=tag, rm=True, network_mode="none", decode=True))
    image_id = engine.image(tag)["Id"]
    record_built(image_id)  # as `toolcage image build` does: an image of this installation runs its own worker
    try:
        with Sandbox(image=tag) as sb:
            labels = engine.inspect(sb.name)["Config"]["Labels"]
        for _ in range(300):  # the container goes after close returned
            if engine.inspect(sb.name) is None:
                break
            time.sleep(0.1)
    finally:
        engine.api.remove_image(tag)
        mine = {v["Name"] for v in engine.volumes(f"{sharedfiles.LABEL}={image_id}")}  # its shared files, if any
        reaper.remove(engine, [o for o in reaper.shared_files_orphans(engine) if o.name in mine])
    assert not reaper.is_kept(labels), labels


def test_rm_of_a_run_id_never_takes_another_runs_container_by_id_prefix(engine: Any) -> None:
    """`toolcage rm X` where X (8 hex, a run id's shape) names no run but begins another run's container id:
    not that run (docker resolves an id's unique prefix), NotFound; its full id, 12-char id and name do."""
    from toolcage import DEFAULT_IMAGE
    from toolcage.engine import ownership
    from toolcage.errors import NotFound
    from toolcage.lifecycle.discard import find_run

    labels = {  # a kept run whose owner is gone: `toolcage rm` of it is allowed
        "toolcage.run_id": f"other{secrets.token_hex(2)}",
        "toolcage.owner": "vm:999999999",
        "toolcage.owner_ns": ownership.namespace_key(),
        "toolcage.keep": "1",
    }
    name = f"toolcage-test-rm-{secrets.token_hex(3)}"
    cid = engine.api.create_container(DEFAULT_IMAGE, name=name, labels=labels, entrypoint=["/nonexistent"])["Id"]
    try:
        assert engine.inspect(cid[:8]) is not None  # docker takes the prefix
        with pytest.raises(NotFound):
            find_run(engine, cid[:8])
        for ref in (cid, cid[:12], name):
            assert find_run(engine, ref).run_id == labels["toolcage.run_id"]
    finally:
        engine.api.remove_container(cid, force=True)


# what a sandbox prints, as it would reach an operator's terminal: clipboard (OSC 52), title, cursor moves,
# a carriage return overwriting the line, the one-byte CSI, a bidi override, a Unicode line separator
HOSTILE_OUTPUT = "ok\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;pwned\x07\x1b[2A\x1b[2K\rforged\x9b31m\u202egnp.exe\u2028\n"
RAW = ("\x1b", "\x07", "\r", "\x9b", "\u202e", "\u2028")


def test_streamed_output_reaches_the_terminal_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """--stream: escape sequences, \\r and bidi marks in the call's output are shown escaped, line breaks kept;
    the interrupted result's output keeps them as data (JSON escapes them on stdout)."""
    from toolcage.cli.output import CallOutput, emit

    shown = CallOutput(show=True, is_output=True, keep=1 << 20)
    shown({"progress": 1, "message": HOSTILE_OUTPUT})
    shown({"progress": 2, "message": "tail without newline\x1b[?1049h"})
    shown.end()
    emit({"status": "interrupted", "output": shown.text})
    got = capsys.readouterr()
    assert not any(c in got.err for c in RAW), got.err
    assert got.err.count("\n") == 2 and "\\x1b]52;c;" in got.err
    assert not any(c in got.out for c in RAW), got.out


def test_a_connectors_progress_report_reaches_the_terminal_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """A connector's ctx.progress message (not output: one line of its own) is escaped, line breaks too."""
    from toolcage.cli.output import CallOutput

    shown = CallOutput(show=True, is_output=False, keep=1 << 20)
    shown({"progress": 1, "total": 2, "message": HOSTILE_OUTPUT + "toolcage: forged line\n"})
    err = capsys.readouterr().err
    assert not any(c in err for c in RAW) and err.count("\n") == 1, err


def test_did_you_mean_echoes_a_hostile_tool_name_escaped() -> None:
    """A tool name with an OSC sequence and a newline: the CLI's did-you-mean line shows it escaped, one line."""
    from click.testing import CliRunner

    from toolcage.cli.main import cli

    out = CliRunner().invoke(cli, ["run", "run_shel\x1b]0;x\x07\n", "--params", "{}"])
    assert out.exit_code != 0
    assert "did you mean 'run_shell'" in out.stderr, out.stderr
    assert not any(c in out.stderr for c in RAW), out.stderr
    assert out.stderr.count("\n") == 1, out.stderr


def test_hostile_names_neither_hide_a_tracked_edit_nor_steer_check_ignore(tmp_path: Path, no_leaks: None) -> None:
    """The host ignores *.log but tracks keep.log: its edit is shown. Names with pathspec magic (:(top),
    :!, :(glob)), a newline, a leading dash, and one that only a prefix of a tracked name matches are
    judged as the names they are: the .log ones ignored, the rest added."""
    from toolcage import Sandbox

    ws = tmp_path / "repo"
    ws.mkdir()
    (ws / ".gitignore").write_text("*.log\n")
    (ws / "keep.log").write_text("tracked\n")
    (ws / "main.py").write_text("print(1)\n")
    git(ws, "init", "-q")
    git(ws, "add", ".gitignore", "main.py")
    git(ws, "add", "-f", "keep.log")
    git(ws, "commit", "-q", "-m", "init")
    attack = (
        "import os\n"
        "os.chdir('/workspace')\n"
        "open('keep.log', 'a').write('edited by the sandbox\\n')\n"
        "for n in [':(top)main.py', ':!main.py', ':(glob)*', '-v', '--no-index', 'a\\nb.log', 'x.log',"
        " 'keep.lo', ':(exclude)keep.log']:\n"
        "    open(n, 'w').write('x')\n"
    )
    with Sandbox(workspace=ws, workspace_mode="copy") as sb:
        r = sb.call("run_python", {"code": attack})
        assert r.ok and r.result["exit_code"] == 0, r
        got = sb.changes()
    assert got.changed == ("keep.log",)
    assert "edited by the sandbox" in got.diff
    assert set(got.ignored) == {"a\nb.log", "x.log", ":(exclude)keep.log"}, got.ignored
    assert set(got.added) >= {":(top)main.py", ":!main.py", ":(glob)*", "-v", "--no-index", "keep.lo"}, got.added


def test_a_streamed_flood_is_bounded_by_the_output_cap(no_leaks: None) -> None:
    """20 MB of escape bytes on stdout and on stderr: the progress the runner (and --stream) gets is at
    most the policy's output cap per stream, whatever the sandbox writes."""
    from toolcage import Sandbox, load_policy

    cap = load_policy("default").limits.output_cap
    got: list[int] = []
    flood = "head -c 20000000 /dev/zero | tr '\\0' '\\033'; head -c 20000000 /dev/zero | tr '\\0' '\\r' >&2"
    with Sandbox() as sb:
        r = sb.call("run_shell", {"command": flood}, on_progress=lambda p: got.append(len(p.get("message") or "")))
    assert r.status == "output_capped", r
    assert 0 < sum(got) <= 2 * cap, (sum(got), cap)


def test_deep_names_in_a_sets_order_do_not_run_check_ignore_past_its_deadline(tmp_path: Path) -> None:
    """20,000 changed names alternating between two chains 2,000 directories deep (4 KB each, what a
    sandbox may name): the host's check-ignore answers within its deadline, in a second or so (was: 96 s,
    past the 60 s deadline, and changes() failed for every file)."""
    import random

    ws = tmp_path / "ws"
    ws.mkdir()
    git(ws, "init", "-q")
    (ws / ".gitignore").write_text("*.log\n")
    names = [f"c{i % 2}/" + "x/" * 2000 + f"{i}.log" for i in range(20_000)]
    random.Random(35).shuffle(names)
    home = tmp_path / "home"
    home.mkdir()
    got = gitplumb.host_ignored(str(ws), names, str(home), time.monotonic() + 30)
    assert got == set(names)


def test_changes_in_a_hostile_workspace_repo_runs_nothing_on_the_host(tmp_path: Path, no_leaks: None) -> None:
    """End to end: a copy-mode run over the trap repository; the sandbox changes a file, changes() shows it
    and the repository's uploadpack never ran on the host."""
    from toolcage import Sandbox

    flag = tmp_path / "PWNED"
    ws = tmp_path / "ws"
    promisor_trap(ws, flag)
    with Sandbox(workspace=ws, workspace_mode="copy") as sb:
        r = sb.call("run_shell", {"command": "echo edited >> /workspace/a.txt && echo n > /workspace/new.txt"})
        assert r.ok and r.result["exit_code"] == 0, r
        got = sb.changes()
    assert got.changed == ("a.txt",) and got.added == ("new.txt",), got
    assert not flag.exists(), "the workspace's git config ran a command on the host"


@pytest.mark.parametrize("second", ["download", "download_again_with_head"])
def test_a_bare_repository_is_never_made_in_two_downloads(tmp_path: Path, second: str) -> None:
    """A first download makes proj/HEAD alone (no repository yet); a second makes objects/, refs/ and a
    config with core.fsmonitor and a hook beside it: the second is refused whole, git in proj/ runs nothing."""
    from tests.security.test_copy_and_download_doors import _git, _stream
    from toolcage.errors import DownloadError
    from toolcage.files import download as transfer

    ran = tmp_path / "ran"
    out = tmp_path / "out"
    config = f'[core]\n\trepositoryformatversion = 0\n\tbare = true\n\tfsmonitor = "echo x >> {ran}; false"\n'
    transfer.download(_stream([("proj/", None), ("proj/HEAD", b"ref: refs/heads/main\n")]), "/w", out)
    stream = [("proj/", None), ("proj/objects/", None), ("proj/refs/", None), ("proj/refs/heads/", None)]
    stream += [("proj/config", config.encode())]
    stream += [("proj/hooks/reference-transaction", f"#!/bin/sh\necho hook >> {ran}\n".encode())]
    if second == "download_again_with_head":
        stream += [("proj/HEAD", b"ref: refs/heads/main\n")]
    with pytest.raises(DownloadError, match="bare git repository"):
        transfer.download(_stream(stream), "/w", out)
    assert not (out / "proj" / "objects").exists() and not (out / "proj" / "config").exists()
    for args in (["status"], ["log"], ["symbolic-ref", "HEAD", "refs/heads/other"]):
        _git(out / "proj", *args)
    assert not ran.exists(), "git ran the downloaded repository's hook or fsmonitor"


def test_the_door_rule_refuses_objects_and_refs_beside_a_host_head(tmp_path: Path) -> None:
    """door_problem (the diff's and download_to's rule): objects/ or refs/ beside the host's HEAD, with the
    other one there or made too, is a bare repository's; beside no HEAD, or with only one of them, it is not."""
    from toolcage.files.outbound import door_problem

    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "HEAD").write_text("ref: refs/heads/main\n")
    made = {"proj/objects": "dir", "proj/refs": "dir", "proj/refs/x": "file", "proj/objects/y": "file"}
    assert "bare git repository" in (door_problem("proj/refs/x", None, tmp_path, made) or "")
    assert "bare git repository" in (door_problem("proj/objects/y", None, tmp_path, made) or "")
    assert door_problem("proj/refs/x", None, tmp_path, {"proj/refs": "dir", "proj/refs/x": "file"}) is None
    assert door_problem("other/refs/x", None, tmp_path, {"other/objects": "dir", "other/refs": "dir"}) is None


def test_toolcage_run_stream_end_to_end_shows_escapes_escaped(no_leaks: None) -> None:
    """`toolcage run run_shell --stream`: the sandbox's OSC 52, title, CSI and \\r reach stderr escaped; stdout
    is the one JSON result."""
    import json
    import shutil
    import sys

    exe = shutil.which("toolcage") or os.path.join(os.path.dirname(sys.executable), "toolcage")
    command = r"printf 'a\033]52;c;cm0gLXJm\007\033]0;pwned\007\033[2A\rforged\233x\n'; printf 'e\033[31m\r\n' >&2"
    done = subprocess.run(
        [exe, "run", "run_shell", "--params", json.dumps({"command": command}), "--stream"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "\\x1b]52;c;" in done.stderr and not any(c in done.stderr for c in RAW), done.stderr
    assert json.loads(done.stdout)["status"] == "ok"
