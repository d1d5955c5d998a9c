"""Import direction: policies imports neither side; the worker never imports the runner; one docker importer.

Every module is checked, the lazily loaded ones included (walked with pkgutil, not listed): each is imported
in a fresh interpreter with the forbidden side blocked, and its import statements (those inside functions
too) are read, so an import that only runs on first use is caught as well.
"""

from __future__ import annotations

import ast
import pkgutil
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import toolcage

ROOT = Path(__file__).resolve().parents[2]

BLOCK = """
import sys
BLOCKED = {blocked!r}
class Block:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + '.') for b in BLOCKED):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import {module}
"""
# run as a script, never imported (its text is `python3 -c`'d by worker.children.zygote): read, not imported
SCRIPTS = {"toolcage.worker.children.zygote_main"}


def _modules(package: str) -> list[str]:
    """Every module of ``package``, however it is loaded (a new module is checked without a list to update)."""
    pkg = __import__(package, fromlist=["_"])
    return [package, *(m.name for m in pkgutil.walk_packages(pkg.__path__, package + "."))]


def _runner() -> set[str]:
    """The host side: the runner's modules (the toolcage package; the other folders are mapped in by the
    install, not found on its path) and the image builder's."""
    names = {m.name for m in pkgutil.walk_packages(toolcage.__path__, "toolcage.")} | set(_modules("toolcage.image"))
    return {n for n in names if not n.startswith(("toolcage.worker", "toolcage.policies"))}


def _file(module: str) -> Path:
    spec = __import__("importlib.util").util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    return Path(spec.origin)


def _static_imports(module: str) -> set[str]:
    """Every absolute module name ``module``'s file imports, at any depth (in functions too)."""
    tree = ast.parse(_file(module).read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def _violations(modules: list[str], blocked: set[str]) -> list[str]:
    # read here, in this thread: ast.parse in several threads at once can fail in CPython (a SystemError)
    found = []
    for module in modules:
        wrong = sorted(n for n in _static_imports(module) if any(n == b or n.startswith(b + ".") for b in blocked))
        if wrong:
            found.append(f"{module} imports {wrong}")

    def imports(module: str) -> str | None:
        code = BLOCK.format(blocked=sorted(blocked), module=module)
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
        return None if proc.returncode == 0 else f"{module}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"

    with ThreadPoolExecutor(max_workers=4) as pool:
        found += [v for v in pool.map(imports, [m for m in modules if m not in SCRIPTS]) if v]
    return found


def test_the_walk_finds_the_lazy_modules() -> None:
    """The walk reaches modules nothing imports at start-up (so a rule checked over it covers them)."""
    worker, policies = _modules("toolcage.worker"), _modules("toolcage.policies")
    assert {
        "toolcage.worker.connectors.host",
        "toolcage.worker.egress.safefetch",
        "toolcage.worker.egress.proxy",
    } <= set(worker)
    assert {"toolcage.policies.decide", "toolcage.policies.contract"} <= set(policies)
    assert {"toolcage.sandbox", "toolcage.cli.main", "toolcage.image.build"} <= _runner()


def test_worker_does_not_import_runner() -> None:
    """Every worker module (tools, connectors, the egress proxy) imports without the runner, docker or
    jsonrpcclient."""
    assert not _violations(_modules("toolcage.worker"), _runner() | {"docker", "jsonrpcclient"})


def test_policies_import_neither_side() -> None:
    """Every policies module imports neither the runner nor the worker."""
    assert not _violations(_modules("toolcage.policies"), _runner() | {"toolcage.worker"})


def test_one_top_level_name() -> None:
    """The wheel installs `toolcage` and nothing generic beside it (no runner, worker, policies at the top)."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert {p.split(".")[0] for p in cfg["packages"]} == {"toolcage"}
    assert set(cfg["package-dir"]) <= set(cfg["packages"])


def test_only_the_adapter_imports_docker() -> None:
    """Only runner/engine/docker_adapter.py imports docker; only worker/dispatch.py imports jsonrpcserver."""
    for pkg, lib, allowed in (
        ("runner", "docker", {"docker_adapter.py"}),
        ("worker", "jsonrpcserver", {"dispatch.py"}),
    ):
        for f in (ROOT / pkg).rglob("*.py"):
            text = f.read_text()
            if re.search(rf"^\s*(import {lib}\b|from {lib}\b)", text, re.M):
                assert f.name in allowed, f"{f} imports {lib}"
