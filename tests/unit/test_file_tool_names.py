"""File names that are not UTF-8 reach strict JSON parsers quoted and come back (issue 23, item 1),
and grep names the binary files that match (item 2). No Docker: the worker as a process, --sandbox none."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox
from toolcage.policies import validate_policy
from toolcage.worker.errors import BadParams
from toolcage.worker.settings import Settings
from toolcage.worker.tools import Catalog
from toolcage.worker.tools.names import from_wire, to_wire

ROOT = Path(__file__).resolve().parents[2]
NAME = b"name_\xff\xfe.txt"
QUOTED = '"/workspace/name_\\xff\\xfe.txt"'  # what every result calls it


def _make(d: Path, name: bytes, data: bytes) -> None:
    with open(os.path.join(os.fsencode(d), name), "wb") as f:
        f.write(data)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    _make(d, NAME, b"hello\n")
    return d


def _strict(obj: Any) -> None:
    """Every string in ``obj`` is UTF-8 text (no lone surrogate), as Go's and serde_json's parsers require."""
    json.dumps(obj, ensure_ascii=False).encode("utf-8")


def _req(method: str, params: dict[str, Any], id: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "method": method, "params": params, "id": id}).encode() + b"\n"


def test_the_worker_sends_no_lone_surrogate_for_a_name_that_is_not_utf8(ws: Path, tmp_path: Path) -> None:
    """The raw response lines for list_files, grep and read_file of a non-UTF-8 name are strict UTF-8 JSON."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))}
    env |= {"TOOLCAGE_SCRATCH": str(scratch), "TOOLCAGE_WORKSPACE": str(ws)}
    lines = [
        _req("list_files", {"path": "/workspace"}, 1),
        _req("grep", {"pattern": "hello"}, 2),
        _req("read_file", {"path": QUOTED}, 3),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "toolcage.worker"], input=b"".join(lines), capture_output=True, env=env, timeout=60
    )
    raw = proc.stdout.splitlines()
    assert len(raw) == 3, proc.stderr.decode()[-2000:]
    for line in raw:
        assert not re.search(rb"\\ud[89a-f]", line, re.IGNORECASE), line  # no surrogate escape at all
        _strict(json.loads(line.decode("utf-8")))
    listed, grepped, read = (json.loads(x)["result"] for x in raw)
    assert [e["path"] for e in listed["entries"]] == [QUOTED]
    assert grepped["matches"][0]["path"] == QUOTED
    assert (read["path"], read["content"]) == (QUOTED, "hello\n")


def test_sandbox_none_reads_back_the_name_it_listed(ws: Path) -> None:
    """Under --sandbox none, the name list_files returns opens the same file in read_file, grep and write_file."""
    with Sandbox(sandbox="none", workspace=ws, audit=False) as sb:
        listed = sb.call("list_files", {}).result
        assert listed is not None
        (name,) = [e["path"] for e in listed["entries"]]
        assert name == QUOTED
        read = sb.call("read_file", {"path": name})
        assert read.result is not None and read.result["content"] == "hello\n", read
        assert sb.call("grep", {"pattern": "hello", "path": name}).result["matches"][0]["path"] == QUOTED
        out = '"/scratch/out_\\xff.txt"'
        assert sb.call("write_file", {"path": out, "content": "w"}).result["path"] == out
        assert [e["path"] for e in sb.call("list_files", {"path": "/scratch"}).result["entries"]] == [out]
        assert sb.call("read_file", {"path": out}).result["content"] == "w"


def _settings(ws: Path, scratch: Path) -> Settings:
    policy = validate_policy({"timeouts": {"call_s": 5, "run_s": 20}})
    return Settings(policy.canonical_json(), str(ws), str(scratch), "test")


def _call(s: Settings, name: str, **params: object) -> dict[str, Any]:
    tool = Catalog().get(name)
    return tool.handler(s, tool.validate(params))  # type: ignore[no-any-return]


def test_a_name_that_spells_an_escape_is_not_taken_for_one(ws: Path, tmp_path: Path) -> None:
    """'lit\\xff' (UTF-8, four characters) and lit<0xff> (one byte) get different names, each opening its own file."""
    _make(ws, b"lit\\xff", b"text name\n")
    _make(ws, b"lit\xff", b"byte name\n")
    _make(ws, b'q"\\\xff', b"quote and backslash\n")
    s = _settings(ws, tmp_path)
    names = [e["path"] for e in _call(s, "list_files")["entries"]]
    assert names == ["/workspace/lit\\xff", '"/workspace/lit\\xff"', QUOTED, '"/workspace/q\\"\\\\\\xff"']
    contents = [_call(s, "read_file", path=n)["content"] for n in names]
    assert contents == ["text name\n", "byte name\n", "hello\n", "quote and backslash\n"]


def test_python_clients_may_still_pass_the_surrogate_form(ws: Path, tmp_path: Path) -> None:
    """The name as Python spells it (lone surrogates) is still accepted; the result names it quoted."""
    r = _call(_settings(ws, tmp_path), "read_file", path="/workspace/" + os.fsdecode(NAME))
    assert (r["path"], r["content"]) == (QUOTED, "hello\n")


@pytest.mark.parametrize("name", [b"/a/b", b"/a\xff", b'/"x"\\y\x80', b"/caf\xc3\xa9\xe9", b"/\xed\xa0\x80"])
def test_quoting_round_trips(name: bytes) -> None:
    """from_wire(to_wire(p)) is p; valid UTF-8 is left as it is, anything else is quoted."""
    path = os.fsdecode(name)
    wire = to_wire(path)
    wire.encode("utf-8")
    assert from_wire(wire) == path
    try:
        name.decode("utf-8")
        assert wire == path
    except UnicodeDecodeError:
        assert wire.startswith('"/') and wire.endswith('"')


@pytest.mark.parametrize("given", ['"/workspace/a\\q"', '"/workspace/a"b"', '"/workspace/a\\x4"'])
def test_a_badly_quoted_path_is_a_params_error(given: str, ws: Path, tmp_path: Path) -> None:
    """A quoted path with an escape that means nothing is a -32602 saying how to quote, not a lookup."""
    with pytest.raises(BadParams, match=r"is quoted .* inside the quotes write"):
        _call(_settings(ws, tmp_path), "read_file", path=given)


def test_grep_names_a_binary_file_that_matches(tmp_path: Path) -> None:
    """A binary file holding the pattern is named in binary_matches (GNU grep's 'Binary file X matches')."""
    ws = tmp_path / "ws"
    ws.mkdir()
    _make(ws, b"app.bin", b"\x7fELF\x00\x00 needle \x00\x01")
    _make(ws, b"notes.txt", b"a needle here\n")
    _make(ws, b"other.bin", b"\x00\x00 nothing \x00")
    with Sandbox(sandbox="none", workspace=ws, audit=False) as sb:
        found = sb.call("grep", {"pattern": "needle"}).result
        assert found == {
            "matches": [{"path": "/workspace/notes.txt", "line": 1, "text": "a needle here"}],
            "binary_matches": ["/workspace/app.bin"],
            "truncated": False,
        }
        none = sb.call("grep", {"pattern": "absent"}).result
        assert none == {"matches": [], "binary_matches": [], "truncated": False}
        one = sb.call("grep", {"pattern": "needle", "max_matches": 1}).result
        assert one == {"matches": [], "binary_matches": ["/workspace/app.bin"], "truncated": True}
