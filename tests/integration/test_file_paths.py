"""Issue 8 item 3 in a container: relative paths mean /scratch for every tool, errors name the
resolved path, and a run without a workspace says so (the image's empty /workspace is not one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_relative_path_round_trips_in_container(engine: Any, tmp_path: Path) -> None:
    """write_file 's.txt' is read back by read_file, list_files, grep and run_python as 's.txt'; a miss names
    /scratch and points at /workspace."""
    (tmp_path / "README.md").write_text("project\n")
    tmp_path.chmod(0o755)  # pytest makes it 0700; the sandbox user is not root
    with Sandbox(workspace=tmp_path, tool="paths") as sb:
        assert sb.call("write_file", {"path": "s.txt", "content": "hi\n"}).result["path"] == "/scratch/s.txt"
        assert sb.call("read_file", {"path": "s.txt"}).result["content"] == "hi\n"
        assert "/scratch/s.txt" in [e["path"] for e in sb.call("list_files", {"path": "."}).result["entries"]]
        assert sb.call("grep", {"pattern": "hi", "path": "s.txt"}).result["matches"][0]["path"] == "/scratch/s.txt"
        assert sb.call("run_python", {"code": "print(open('s.txt').read(), end='')"}).result["stdout"] == "hi\n"
        assert [e["path"] for e in sb.call("list_files", {}).result["entries"]] == ["/workspace/README.md"]
        miss = sb.call("read_file", {"path": "README.md"})
        assert miss.error is not None and miss.error["data"]["resolved"] == "/scratch/README.md", miss
        assert "'/workspace/README.md'" in miss.error["message"], miss
        ro = sb.call("write_file", {"path": "/workspace/x", "content": "x"})
        assert ro.error is not None and ro.error["code"] == -32002 and "read-only" in ro.error["message"], ro
        env = sb.call("run_shell", {"command": 'echo "${TOOLCAGE_WORKSPACE-unset} $PWD"'})
        assert env.result["stdout"] == "unset /scratch\n", env  # the paths are the names: no variables needed


def test_no_workspace_is_said_in_container(engine: Any) -> None:
    """Without --workspace, list_files (default /workspace) is a tool error naming --workspace, not an empty list."""
    with Sandbox(tool="paths") as sb:
        r = sb.call("list_files", {})
        assert r.error is not None and r.error["code"] == -32001 and "--workspace" in r.error["message"], r
        assert sb.call("list_files", {"path": "/scratch"}).ok
