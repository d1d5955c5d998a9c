"""The gVisor pass leaves out the tests marked ``runc_only(reason)`` and nothing else: every such mark carries
its reason beside the test, and .ci/run, the README and docs/ give the one gVisor test command."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GVISOR = (
    'TOOLCAGE_SANDBOX=gvisor .venv/bin/python -m pytest tests/integration tests/security -m "not runc_only" -n auto'
)
PREFIX = "TOOLCAGE_SANDBOX=gvisor "


def _reason(arg: ast.expr, consts: dict[str, str]) -> str | None:
    """The mark's reason if it is a string literal or a module-level name bound to one."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.Name):
        return consts.get(arg.id)
    return None


def marks_without_reason(tests: Path) -> list[str]:
    """file:line of every ``runc_only`` mark under ``tests`` that is not called with a non-empty reason."""
    bad = []
    for path in sorted(tests.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        consts = {
            t.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        called: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "runc_only":
                called.add(id(node.func))
                args = [*node.args, *(k.value for k in node.keywords if k.arg == "reason")]
                reason = _reason(args[0], consts) if len(args) == 1 else None
                if not (reason or "").strip():
                    bad.append(f"{path.relative_to(tests.parent)}:{node.lineno}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "runc_only" and id(node) not in called:
                bad.append(f"{path.relative_to(tests.parent)}:{node.lineno}")
    return bad


def gvisor_lines(text: str) -> list[str]:
    """The gVisor test commands in a script or page (a shell prompt and .ci/run's `|| failed=1` aside)."""
    found = []
    for line in text.splitlines():
        line = line.strip().removeprefix("$ ")
        if line.startswith(PREFIX) and " pytest " in line:
            found.append(line.removesuffix("|| failed=1").strip())
    return found


def test_every_runc_only_mark_carries_its_reason() -> None:
    """Each runc_only mark in tests/ is called with one non-empty reason, so the gVisor pass's gaps are explained."""
    assert marks_without_reason(ROOT / "tests") == []


def test_the_check_finds_a_mark_without_reason(tmp_path: Path) -> None:
    """On a broken copy the check names each mark with no reason, an empty one or an unresolvable one."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_x.py").write_text(
        textwrap.dedent(
            """
            import pytest
            WHY = "host-side"
            EMPTY = ""
            pytestmark = pytest.mark.runc_only
            @pytest.mark.runc_only("")
            def test_a(): pass
            @pytest.mark.runc_only("  ")
            def test_b(): pass
            @pytest.mark.runc_only(EMPTY)
            def test_c(): pass
            @pytest.mark.runc_only(f"{WHY}")
            def test_d(): pass
            @pytest.mark.runc_only()
            def test_e(): pass
            @pytest.mark.runc_only(WHY)
            def test_ok(): pass
            @pytest.mark.runc_only(reason="image building")
            def test_ok_too(): pass
            """
        )
    )
    assert marks_without_reason(tests) == [f"tests/test_x.py:{n}" for n in (6, 8, 10, 12, 14, 5)]


def test_the_marker_is_registered() -> None:
    """runc_only is a registered marker (strict markers are on), documented with its reason."""
    assert '"runc_only(reason): ' in (ROOT / "pyproject.toml").read_text()


def test_ci_readme_and_docs_give_one_gvisor_command() -> None:
    """.ci/run's gVisor pass is `-m "not runc_only"` (no node ids by hand); README.md shows that same line, and
    no page of docs/ shows another."""
    ci = gvisor_lines((ROOT / ".ci" / "run").read_text())
    assert ci == [GVISOR]
    assert set(gvisor_lines((ROOT / "README.md").read_text())) == {GVISOR}
    for page in sorted((ROOT / "docs").rglob("*.md")):
        assert set(gvisor_lines(page.read_text())) <= {GVISOR}, page.relative_to(ROOT)


def test_the_command_check_catches_a_deselect() -> None:
    """A gVisor line with a node id left out by hand is not the command."""
    broken = f"{GVISOR} --deselect tests/integration/test_image.py || failed=1\n"
    assert gvisor_lines(broken) != [GVISOR]
    assert gvisor_lines(f"$ {GVISOR}\n") == [GVISOR]
