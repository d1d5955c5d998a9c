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
        if name in {blocked!r} or name.split('.')[0] in {blocked!r}:
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
"""


def _imports_ok(modules: str, blocked: set[str]) -> None:
    code = BLOCK.format(blocked=blocked) + f"import {modules}\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# the runner's own modules (runner/ is the toolcage package itself)
RUNNER = {f"toolcage.{p.stem}" for p in (ROOT / "runner").glob("*.py") if p.stem != "__init__"}


def test_worker_does_not_import_runner() -> None:
    """The worker (and every tool module) imports without the runner's modules, docker or jsonrpcclient."""
    _imports_ok(
        "toolcage.worker.__main__, toolcage.worker.dispatch, toolcage.worker.tools.proc, "
        "toolcage.worker.tools.files, toolcage.worker.usage, toolcage.worker.mcp_host",
        RUNNER | {"docker", "jsonrpcclient"},
    )


def test_policies_import_neither_side() -> None:
    """policies imports neither runner nor worker."""
    _imports_ok("toolcage.policies", RUNNER | {"toolcage.worker"})


def test_one_top_level_name() -> None:
    """The wheel installs `toolcage` and nothing generic beside it (no runner, worker, policies at the top)."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert {p.split(".")[0] for p in cfg["packages"]} == {"toolcage"}
    assert set(cfg["package-dir"]) <= set(cfg["packages"])


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
