"""doctor --image without an engine: the inspect facts, the probe's parsing, the notes and the people's table."""

from __future__ import annotations

from typing import Any

import pytest

from toolcage.cli.doctor import image_text
from toolcage.errors import NotFound
from toolcage.image.build import SOURCE_LABEL
from toolcage.ops import imagecheck

INSPECT: dict[str, Any] = {
    "Id": "sha256:" + "ab" * 32,
    "Os": "linux",
    "Architecture": "amd64",
    "Size": 3 * 2**20,
    "RootFS": {"Layers": ["sha256:1", "sha256:2"]},
    "Config": {
        "User": "app",
        "WorkingDir": "/testbed",
        "Entrypoint": ["/entry.sh"],
        "Cmd": ["serve"],
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/home/app", "BROKEN"],
    },
}


def _probe(**over: Any) -> dict[str, Any]:
    p: dict[str, Any] = {
        "answered": True,
        "first_answer_ms": 612.4,
        "sandbox": "container",
        "shell": {"present": True, "path": "/bin/sh"},
        "writable": ["/tmp", "/scratch"],
        "python": {"present": True, "path": "/usr/bin/python3", "version": "3.11.2", "supported": True},
        "node": {"present": False, "error": "the image x has no Node.js"},
        "git": {"present": True, "path": "/usr/bin/git", "version": "2.39.5"},
        "pip": {"present": True, "path": None, "version": "23.0.1", "via": "/usr/bin/python3 -m pip"},
    }
    p.update(over)
    return p


def _report(probe: dict[str, Any] | None = None, **over: Any) -> dict[str, Any]:
    r = imagecheck.facts("team/agent:1", INSPECT)
    r["probe"] = _probe() if probe is None else probe
    r["runnable"] = bool(r["probe"].get("answered"))
    r["reason"] = None if r["runnable"] else "the worker did not answer in it: boom"
    r["notes"] = imagecheck.tool_notes(r["probe"])
    r.update(over)
    return r


def test_facts_from_inspect() -> None:
    """The inspect data gives kind, platform, size, layers, user, workdir, entrypoint, cmd, PATH and HOME."""
    f = imagecheck.facts("team/agent:1", INSPECT)
    assert f["kind"] == "foreign" and f["platform"] == "linux/amd64"
    assert (f["size_bytes"], f["layers"], f["user"], f["workdir"]) == (3 * 2**20, 2, "app", "/testbed")
    assert (f["entrypoint"], f["cmd"]) == (["/entry.sh"], ["serve"])
    assert (f["path"], f["home"]) == ("/usr/local/bin:/usr/bin:/bin", "/home/app")


def test_facts_worker_image_and_unset_env() -> None:
    """An image with the worker's source label is a worker image; no Env leaves PATH and HOME None."""
    info = {**INSPECT, "Config": {"Labels": {SOURCE_LABEL: "x"}}}
    f = imagecheck.facts("w", info)
    assert f["kind"] == "worker" and f["path"] is None and f["home"] is None and f["entrypoint"] == []


def test_missing_image_refused_in_one_line() -> None:
    """No inspect data: NotFound (exit 1) in one line that says nothing is pulled."""
    with pytest.raises(NotFound) as got:
        imagecheck.facts("img:1", None)
    assert "\n" not in got.value.message and "pulls nothing" in got.value.message
    assert got.value.exit_code == 1


@pytest.mark.parametrize(
    ("os_", "arch", "shown"),
    [("linux", "arm64", "linux/arm64"), ("windows", "amd64", "windows/amd64"), ("", "", "?/?")],
)
def test_other_platform_refused(os_: str, arch: str, shown: str) -> None:
    """Anything but linux/amd64 is refused before a start, naming the platform and the one that runs."""
    with pytest.raises(NotFound) as got:
        imagecheck.facts("img:1", {**INSPECT, "Os": os_, "Architecture": arch})
    assert shown in got.value.message and "linux/amd64" in got.value.message


def test_parse_lookup_keeps_asked_names_and_absolute_paths() -> None:
    """The shell lookup's lines: only the programs asked, only absolute paths, the first of each."""
    out = "git=/usr/bin/git\nnode=node\nevil=/x\npip3=/a/pip3\ngit=/other/git\nnoise\n"
    assert imagecheck.parse_lookup(out) == {"git": "/usr/bin/git", "pip3": "/a/pip3"}


def test_parse_writable() -> None:
    """The writable lines: absolute directories, each once; no shell means not known (None), shown so."""
    out = "git=/usr/bin/git\nwritable=/tmp\nwritable=rel\nwritable=/tmp\nwritable=/scratch\n"
    assert imagecheck.parse_writable(out) == ["/tmp", "/scratch"]
    lines = image_text(_report(_probe(writable=None, shell={"present": False, "path": None})))
    assert "writable    not known  (no shell to ask)" in lines
    assert "writable    nothing" in image_text(_report(_probe(writable=[])))


def test_parse_python_versions() -> None:
    """run_python's JSON: 3.11 supported, 3.7 and 2.7 not; a missing Python is not present, with the error."""
    ok = {"ok": True, "ran": True, "stdout": '{"path": "/usr/bin/python3", "version": [3, 11, 2]}\n', "error": None}
    assert imagecheck.parse_python(ok) == {
        "present": True,
        "path": "/usr/bin/python3",
        "version": "3.11.2",
        "supported": True,
    }
    old = {**ok, "stdout": '{"path": "/usr/bin/python", "version": [3, 7, 9]}'}
    assert imagecheck.parse_python(old)["supported"] is False
    two = {**ok, "stdout": '{"path": "/usr/bin/python", "version": [2, 7, 18]}'}
    assert imagecheck.parse_python(two)["version"] == "2.7.18"
    missing = {"ok": False, "ran": False, "stdout": "", "error": "the image x has no Python"}
    assert imagecheck.parse_python(missing) == {"present": False, "error": "the image x has no Python"}
    garbage = {**ok, "stdout": "hello"}
    got = imagecheck.parse_python(garbage)
    assert got["present"] and got["supported"] is False and "JSON" in got["error"]


def test_parse_version_program() -> None:
    """git/pip --version: the number; a program that ran and failed is present with its error line."""
    ok = {"ok": True, "ran": True, "stdout": "git version 2.39.5\n", "error": None}
    assert imagecheck.parse_version_program(ok, "/usr/bin/git") == {
        "present": True,
        "path": "/usr/bin/git",
        "version": "2.39.5",
    }
    failed = {"ok": False, "ran": True, "stdout": "", "error": "No module named pip"}
    assert imagecheck.parse_version_program(failed, None)["present"] is True


def test_notes_name_what_will_not_work() -> None:
    """Notes for no shell, no Python or a too old one, no Node; none when the worker did not answer."""
    bare = _probe(
        shell={"present": False, "path": None},
        python={"present": True, "version": "3.7.9", "supported": False},
    )
    notes = imagecheck.tool_notes(bare)
    assert any("no /bin/sh" in n for n in notes)
    assert any("3.7.9" in n and "3.8 or newer" in n for n in notes)
    assert any("Node.js" in n for n in notes)
    assert imagecheck.tool_notes({"answered": False}) == []


def test_text_table() -> None:
    """The people's table: one labelled line per fact, programs with path and version, the verdict last."""
    lines = image_text(_report())
    assert lines[0] == f"image       team/agent:1  {INSPECT['Id'][:19]}"
    assert lines[1] == "            linux/amd64, 3.0 MiB, 2 layers; the image's own (the worker mounted in)"
    assert "entrypoint  /entry.sh  (never run: the worker is the entrypoint)" in lines
    assert "worker      answered in 612 ms (sandbox container)" in lines
    assert "python      /usr/bin/python3 3.11.2  (run_python uses it)" in lines
    assert "writable    /tmp, /scratch" in lines
    assert "node        not found on its PATH" in lines
    assert "git         /usr/bin/git 2.39.5" in lines
    assert "pip         found 23.0.1 (as /usr/bin/python3 -m pip)" in lines
    assert "note        no Node.js on its PATH: run_node answers an error naming it" in lines
    assert lines[-1] == "verdict     runs"


def test_text_not_answering() -> None:
    """A worker that did not answer: the error on its line, programs not checked, the verdict says why."""
    lines = image_text(_report({"answered": False, "error": "boom"}))
    assert "worker      DID NOT ANSWER: boom" in lines
    assert "python      not checked" in lines and "shell       not checked" in lines
    assert lines[-1] == "verdict     WILL NOT RUN: the worker did not answer in it: boom"


def test_text_escapes_what_the_image_said() -> None:
    """Values from the image's config or its probe cannot put escape sequences or lines on the terminal."""
    hostile = "\x1b]52;c;AAAA\x07\nFAKE verdict     runs"
    report = _report(_probe(git={"present": True, "path": hostile, "version": "1\x1b[2J"}), workdir=hostile)
    text = "\n".join(image_text(report))
    assert "\x1b" not in text and "\x07" not in text
    assert len(image_text(report)) == text.count("\n") + 1  # every value stayed on its own line


def test_config_a_run_refuses() -> None:
    """An ENV variable glibc's loader acts on whatever its value: the run's own refusal, found from the config."""
    bad = {**INSPECT, "Config": {**INSPECT["Config"], "Env": ["LD_SHOW_AUXV=1"]}}
    problem = imagecheck.config_problem("x:1", bad)
    assert problem is not None and "LD_SHOW_AUXV" in problem
    assert imagecheck.config_problem("x:1", INSPECT) is None
    report = _report({"answered": False, "started": False, "error": problem}, runnable=False, reason=problem)
    lines = image_text(report)
    assert "worker      not started: a run refuses this image's config" in lines
    assert lines[-1].startswith("verdict     WILL NOT RUN: ") and "LD_SHOW_AUXV" in lines[-1]


@pytest.mark.parametrize(("runnable", "code"), [(True, 0), (False, 1)])
def test_cli_exit_code_and_reason(monkeypatch: pytest.MonkeyPatch, runnable: bool, code: int) -> None:
    """doctor --image exits 0 when the image runs, 1 with the reason on one stderr line when it does not; the
    kind a plain run gets is used unless --sandbox is given."""
    from click.testing import CliRunner

    from toolcage.cli.main import cli

    seen: list[str | None] = []

    def fake(ref: str, sandbox: str | None = None) -> dict[str, Any]:
        seen.append(sandbox)
        probe = _probe() if runnable else {"answered": False, "error": "boom"}
        return _report(probe)

    monkeypatch.setattr(imagecheck, "check", fake)
    got = CliRunner().invoke(cli, ["doctor", "--image", "team/agent:1"])
    assert got.exit_code == code
    assert ("will not run" in got.stderr) is (not runnable)
    assert got.stderr.count("\n") == (0 if runnable else 1)
    CliRunner().invoke(cli, ["doctor", "--image", "team/agent:1", "--sandbox", "gvisor", "--json"])
    assert seen == [None, "gvisor"]
