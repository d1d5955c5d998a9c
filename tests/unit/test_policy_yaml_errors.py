"""A policy file YAML cannot read is reported as FILE:LINE:COLUMN: what, on one readable line, with
whatever the file's author could use to drive a terminal still escaped (issue 23, item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from toolcage.cli.main import cli
from toolcage.policies import PolicyError, load_policy

CASES = [
    (
        b"name: x\nlimits: {memory: 1g\n",
        3,
        1,
        "policy file is not valid YAML: expected ',' or '}', but got '<stream end>' "
        "(while parsing a flow mapping that starts at line 2, column 9)",
    ),
    (
        b"name: x\nlimits:\n  memory: 1g\n   cpus: 2\n",
        4,
        8,
        "policy file is not valid YAML: mapping values are not allowed here",
    ),
    (
        b"name: x\n  bad: \x1b]0;pwned\x07\n",
        2,
        8,
        "policy file is not valid YAML: unacceptable character #x001b: special characters are not allowed",
    ),
    (b"name: caf\xe9\n", 1, 10, "policy file is not UTF-8 text (byte 0xe9)"),
]

IDS = ["unclosed-flow-mapping", "bad-indentation", "control-character", "not-utf8"]


@pytest.mark.parametrize(("text", "line", "column", "what"), CASES, ids=IDS)
def test_the_error_names_file_line_and_column(tmp_path: Path, text: bytes, line: int, column: int, what: str) -> None:
    """load_policy's PolicyError reads FILE:LINE:COLUMN: what, on one line, and carries file, line and column."""
    path = tmp_path / "policy.yaml"
    path.write_bytes(text)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.message == f"{path}:{line}:{column}: {what}"
    assert info.value.details == {"file": str(path), "line": line, "column": column}


@pytest.mark.parametrize(("text", "line", "column", "what"), CASES, ids=IDS)
def test_the_cli_prints_it_as_one_readable_line(tmp_path: Path, text: bytes, line: int, column: int, what: str) -> None:
    """`toolcage run --policy FILE` prints one stderr line with no escaped newline (\\x0a), and exits 2."""
    path = tmp_path / "policy.yaml"
    path.write_bytes(text)
    out = CliRunner().invoke(cli, ["run", "list_files", "--sandbox", "none", "--policy", str(path)])
    assert out.exit_code == 2, out.output
    assert out.stderr == f"toolcage: {path}:{line}:{column}: {what}\n"


def test_what_the_author_wrote_cannot_drive_the_terminal(tmp_path: Path) -> None:
    """A bidi override or a C1 control quoted from the file reaches stderr as a visible escape, never raw."""
    path = tmp_path / "policy.yaml"
    path.write_text("name: x\nlimits: !foo\u202e\x85 {}\n", encoding="utf-8")
    out = CliRunner().invoke(cli, ["run", "list_files", "--sandbox", "none", "--policy", str(path)])
    assert out.exit_code == 2, out.output
    assert out.stderr.startswith(f"toolcage: {path}:2:13: policy file is not valid YAML: "), out.stderr
    assert "\\u202e" in out.stderr
    assert not any(c in out.stderr for c in "\u202e\x85\x1b"), repr(out.stderr)
    assert out.stderr.count("\n") == 1
