"""changes() and the host repository's ignore rules, on the real engine (issue 35): code in the sandbox
rewrites the copy's .gitignore files to hide its edits, and writes caches as pytest does. The host's rules
decide (every edit shown, the .gitignore edits too), the caches are listed as ignored, and `git apply`
of the diff in the host's repository plants none of them. The copy keeps its .git (workspace_gitignore off)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from toolcage import Sandbox

pytestmark = pytest.mark.usefixtures("no_leaks")


def git(cwd: Path, *args: str, stdin: bytes | None = None) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    cfg = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    done = subprocess.run(["git", *cfg, *args], cwd=cwd, env=env, input=stdin, check=True, capture_output=True)
    return done.stdout.decode()


def test_rewriting_the_copys_gitignore_hides_nothing_and_caches_are_not_planted(tmp_path: Path) -> None:
    """The sandbox's .gitignore says `*` at the top and in sub/; its edits are all shown; .pytest_cache,
    __pycache__ and a nested *.tmp are listed as ignored; the diff applies on the host and adds no cache."""
    ws = tmp_path / "repo"
    (ws / "sub").mkdir(parents=True)
    (ws / ".gitignore").write_text(".pytest_cache/\n__pycache__/\n")
    (ws / "sub" / ".gitignore").write_text("*.tmp\n")
    (ws / "main.py").write_text("print(1)\n")
    git(ws, "init", "-q")
    git(ws, "add", ".")
    git(ws, "commit", "-q", "-m", "init")
    attack = (
        "cd /workspace && test -d .git && printf '*\\n' > .gitignore && printf '*\\n' > sub/.gitignore"
        " && echo 'print(2)' > main.py && echo 'import os' > evil.py && echo t > sub/x.tmp"
        " && mkdir -p .pytest_cache/v/cache __pycache__ && echo '[]' > .pytest_cache/v/cache/nodeids"
        " && echo c > __pycache__/main.cpython-311.pyc"
    )
    with Sandbox(workspace=ws, workspace_mode="copy") as sb:
        r = sb.call("run_shell", {"command": attack})
        assert r.ok and r.result["exit_code"] == 0, r
        got = sb.changes()
    assert got.added == ("evil.py",)
    assert got.changed == (".gitignore", "main.py", "sub/.gitignore")
    assert got.ignored == (".pytest_cache/v/cache/nodeids", "__pycache__/main.cpython-311.pyc", "sub/x.tmp")
    git(ws, "apply", "-", stdin=got.diff.encode())  # evil.py is there, ignored by the applied `*`: no cache is
    assert git(ws, "status", "--porcelain", "--ignored", "--untracked-files=all").split("\n")[:-1] == [
        " M .gitignore",
        " M main.py",
        " M sub/.gitignore",
        "!! evil.py",
    ]
