"""One session surface and one contract between the twins, shown to fail when broken.

- ``toolcage.types.SandboxLike`` / ``AsyncSandboxLike``: mypy checks ``Sandbox`` and ``AsyncSandbox``
  against them (``.ci/typecheck``); here, a copy of each with one method cut out fails that check,
  and an uncut copy passes it.
- ``toolcage.aio`` drives ``Sandbox`` and ``Pool`` through their named internal API only (and
  ``toolcage.servers.serve``'s Forwarder a Sandbox's run): it reaches no other object's ``_private``
  attribute (the module's own classes aside) and imports no ``_private`` name; the check is shown to fail
  on a copy that does.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import toolcage.aio
import toolcage.sandbox
import toolcage.servers.serve

AIO = Path(toolcage.aio.__file__)


def _strays(source: str) -> list[str]:
    """``obj._name`` in ``source`` where ``obj`` is not ``self``/``cls`` and ``_name`` is not defined by the
    module itself, and ``from ... import _name``: another class's privates reached into."""
    tree = ast.parse(source)
    own = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    own |= {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and ast.unparse(n.value) == "self"
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = node.attr
            private = name.startswith("_") and not name.startswith("__")
            mine = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if private and not mine and name not in own:
                found.append(f"{ast.unparse(node)} (line {node.lineno})")
        elif isinstance(node, ast.ImportFrom):
            found += [f"import {a.name} (line {node.lineno})" for a in node.names if a.name.startswith("_")]
    return found


@pytest.mark.parametrize("module", [toolcage.aio, toolcage.servers.serve], ids=["aio", "serve"])
def test_the_twin_and_the_forwarder_reach_no_private_of_another_class(module: object) -> None:
    """aio.py and serve's Forwarder use Sandbox, Pool and Run through their named (internal) API, never privates."""
    assert _strays(Path(module.__file__).read_text()) == []  # type: ignore[attr-defined]


def test_the_private_check_fails_on_a_broken_copy() -> None:
    """A copy of aio.py that calls Sandbox._before_call, or imports a private name, is caught."""
    source = AIO.read_text()
    broken = source.replace("sb.begin_call(tool, params, timeout)", "sb._before_call(tool, params, timeout)")
    assert broken != source
    assert any("sb._before_call" in s for s in _strays(broken))
    imports = source.replace("import READY_WAIT_S,", "import _Slot, READY_WAIT_S,")
    assert imports != source
    assert any("import _Slot" in s for s in _strays(imports))


def _cut(source: str, cls: str, method: str) -> str:
    """``source`` without ``cls.method`` (its decorators included)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == method:
                    first = min([item.lineno, *(d.lineno for d in item.decorator_list)])
                    lines = source.splitlines(keepends=True)
                    return "".join(lines[: first - 1] + lines[item.end_lineno or item.lineno :])
    raise AssertionError(f"{cls}.{method} not found")


PROBE = """\
from cut_aio import AsyncSandbox as CutAsync
from cut_sandbox import Sandbox as CutSandbox
from toolcage.types import AsyncSandboxLike, SandboxLike
from whole_aio import AsyncSandbox as WholeAsync
from whole_sandbox import Sandbox as WholeSandbox


def whole_sync(sb: WholeSandbox) -> SandboxLike:
    return sb


def whole_async(sb: WholeAsync) -> AsyncSandboxLike:
    return sb


def cut_sync(sb: CutSandbox) -> SandboxLike:
    return sb  # line 17


def cut_async(sb: CutAsync) -> AsyncSandboxLike:
    return sb  # line 21
"""


def test_a_session_missing_a_method_fails_the_type_check(tmp_path: Path) -> None:
    """mypy rejects a copy of Sandbox without usage() and of AsyncSandbox without snapshot(); whole copies pass."""
    sandbox_src, aio_src = Path(toolcage.sandbox.__file__).read_text(), AIO.read_text()
    (tmp_path / "whole_sandbox.py").write_text(sandbox_src)
    (tmp_path / "whole_aio.py").write_text(aio_src)
    (tmp_path / "cut_sandbox.py").write_text(_cut(sandbox_src, "Sandbox", "usage"))
    (tmp_path / "cut_aio.py").write_text(_cut(aio_src, "AsyncSandbox", "snapshot"))
    (tmp_path / "probe.py").write_text(PROBE)
    out = subprocess.run(
        [
            sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports",
            "--cache-dir=/dev/null", "--no-error-summary", "--hide-error-context", "probe.py",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    errors = re.findall(r"^probe\.py:(\d+): error: (.*)$", out.stdout, re.M)
    assert [int(line) for line, _ in errors] == [17, 21], out.stdout + out.stderr
    assert 'missing following "SandboxLike" protocol member' in out.stdout and "usage" in out.stdout, out.stdout
    assert 'missing following "AsyncSandboxLike" protocol member' in out.stdout and "snapshot" in out.stdout
