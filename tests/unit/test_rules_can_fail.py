"""Each house rule's test fails on a deliberately broken copy of the tree: a rule that cannot fail checks nothing.

The copy is the project's folders with one break per rule (each a lazy import or a literal, the kind the old
grep tests missed), laid out as installed (runner/ as ``toolcage``, worker/ as ``toolcage.worker``, ...) and put
first on the path; the rule tests run on it in a fresh pytest and every one of them must fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAZY = "\n\ndef _broken_on_purpose() -> None:\n    {stmt}\n"
_ROOM = "tests/unit/test_layering.py::test_a_room_imports_only_the_rooms_its_row_names"
# file -> (what is added, the rule test that must then fail)
BREAKS = {
    "worker/egress/proxy.py": (
        LAZY.format(stmt="from toolcage import sandbox  # noqa"),
        "tests/unit/test_layering.py::test_worker_does_not_import_runner",
    ),
    "policies/decide.py": (
        LAZY.format(stmt="import toolcage.worker.protocol  # noqa"),
        "tests/unit/test_layering.py::test_policies_import_neither_side",
    ),
    "runner/cli/output.py": (
        LAZY.format(stmt="import docker  # noqa"),
        "tests/unit/test_layering.py::test_only_the_adapter_imports_docker",
    ),
    "runner/sandbox.py": (
        "\n_BROKEN = lambda kind: kind != 'none'  # noqa\n",
        "tests/unit/test_backends.py::test_no_code_branches_on_a_backend_kind",
    ),
    "runner/pool.py": (
        "\n_BROKEN = 'TOOLCAGE_POOLED'\n",
        "tests/unit/test_contract.py::test_the_contract_is_spelled_once",
    ),
    # the floors of the host side (test_layering.LAYERS), one room's rule each
    "runner/engine/seccomp.py": (
        LAZY.format(stmt="import toolcage.options  # noqa"),
        f"{_ROOM}[engine]",
    ),
    "runner/lifecycle/watchdog.py": (
        LAZY.format(stmt="import toolcage.pool  # noqa"),
        f"{_ROOM}[lifecycle]",
    ),
    "runner/files/mountview.py": (
        LAZY.format(stmt="from toolcage.sandbox import Sandbox  # noqa"),
        f"{_ROOM}[files]",
    ),
    "runner/ops/probes.py": (
        LAZY.format(stmt="import toolcage.cli.output  # noqa"),
        f"{_ROOM}[ops]",
    ),
    "runner/stray.py": (  # a new module at the top, in no room
        "STRAY = 1\n",
        "tests/unit/test_layering.py::test_every_module_is_in_a_room",
    ),
    "runner/textsafe.py": (  # logs imports textsafe: a lazy circle of two modules in one room
        LAZY.format(stmt="import toolcage.logs  # noqa"),
        "tests/unit/test_layering.py::test_no_import_circle_in_the_house",
    ),
    "runner/ops/engines.py": (  # an error raised somewhere, outside the drawn tree
        "\n\nfrom toolcage.errors import SandboxError as _Base  # noqa: E402\n\n\n"
        "class StrayError(_Base):\n    reason = 'stray'\n",
        "tests/unit/test_error_tree.py::test_every_error_is_drawn_under_its_parent_and_importable",
    ),
}


def _installed_layout(src: Path, dest: Path) -> None:
    pkg = dest / "toolcage"
    pkg.mkdir(parents=True)
    for entry in (src / "runner").iterdir():
        (pkg / entry.name).symlink_to(entry)
    for sub in ("worker", "policies", "image"):
        (pkg / sub).symlink_to(src / sub)


def test_every_rule_fails_on_a_broken_copy(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("runner", "worker", "policies", "image", "tests"):
        shutil.copytree(ROOT / name, copy / name, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    for rel, (text, _) in BREAKS.items():
        with open(copy / rel, "a", encoding="utf-8") as f:
            f.write(text)
    _installed_layout(copy, tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    tests = [test for _, test in BREAKS.values()]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=-rf", *tests],
        cwd=copy, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert "copy/runner" in subprocess.run(
        [sys.executable, "-c", "import toolcage.sandbox, os; print(os.path.realpath(toolcage.sandbox.__file__))"],
        cwd=copy, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip  # the copy is what was checked, not the installed tree
    failed = set(re.findall(r"^FAILED (\S+)", proc.stdout, re.M))
    assert failed == set(tests), proc.stdout[-3000:]
