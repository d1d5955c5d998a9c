"""Import direction: policies imports neither side; worker never imports runner; one docker importer."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
"""


def _imports_ok(modules: str, blocked: set[str]) -> None:
    code = BLOCK.format(blocked=blocked) + f"import {modules}\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_worker_does_not_import_runner() -> None:
    """The worker (and every tool module) imports without runner, docker or jsonrpcclient."""
    _imports_ok(
        "worker.__main__, worker.dispatch, worker.tools.proc, worker.tools.files, worker.usage",
        {"runner", "docker", "jsonrpcclient"},
    )


def test_policies_import_neither_side() -> None:
    """policies imports neither runner nor worker."""
    _imports_ok("policies", {"runner", "worker"})


def test_only_the_adapter_imports_docker() -> None:
    """Only runner/docker_adapter.py imports docker; only worker/dispatch.py imports jsonrpcserver."""
    for pkg, lib, allowed in (
        ("runner", "docker", {"docker_adapter.py"}),
        ("worker", "jsonrpcserver", {"dispatch.py"}),
    ):
        for f in (ROOT / pkg).rglob("*.py"):
            text = f.read_text()
            if re.search(rf"^\s*(import {lib}\b|from {lib}\b)", text, re.M):
                assert f.name in allowed, f"{f} imports {lib}"
