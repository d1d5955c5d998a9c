"""Import direction: policies imports neither side; the worker never imports the runner; one docker importer;
each room of the host side imports only the rooms its row of ``LAYERS`` names; no import circle anywhere.

Every module is checked, the lazily loaded ones included (walked with pkgutil, not listed): each is imported
in a fresh interpreter with the forbidden side blocked, and its import statements (those inside functions
too) are read, so an import that only runs on first use is caught as well. Imports under ``if TYPE_CHECKING:``
are for the type checker only and never run: the room rules and the circle test leave them aside.
"""

from __future__ import annotations

import ast
import pkgutil
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

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


# -- Floors: which rooms each room of the house may import ------------------------------------------------
# A room is a folder (a subpackage: it holds every module under it, a new one included) or a named group of
# modules at the top of ``toolcage``. A module in no room fails test_every_module_is_in_a_room: place it here.
ROOMS: dict[str, tuple[str, ...]] = {
    "face": ("toolcage",),  # the package's __init__ alone: __version__ and the public names, loaded on first use
    "front": (
        "toolcage.sandbox",
        "toolcage.aio",
        "toolcage.pool",
        "toolcage.types",
        "toolcage.sdk",
        "toolcage.processes",
        "toolcage.interpreter",
    ),
    "home": ("toolcage.run", "toolcage.options", "toolcage.timing", "toolcage.connectors", "toolcage.precheck"),
    # telemetry: the OpenTelemetry hooks the run, records, backends and pool call into
    "base": (
        "toolcage.errors",
        "toolcage.results",
        "toolcage.logs",
        "toolcage.textsafe",
        "toolcage.workspace",
        "toolcage.telemetry",
    ),
    "files": ("toolcage.files",),
    "backends": ("toolcage.backends",),
    "engine": ("toolcage.engine",),
    "lifecycle": ("toolcage.lifecycle",),
    "rpc": ("toolcage.rpc",),
    "servers": ("toolcage.servers",),
    "integrations": ("toolcage.integrations",),
    "ray": ("toolcage.ray",),
    "ops": ("toolcage.ops",),
    "cli": ("toolcage.cli",),
    "image": ("toolcage.image",),
    "policies": ("toolcage.policies",),
    "worker": ("toolcage.worker",),
}
# room -> the rooms it may import (its own modules always). The face imports no room at all (its names load
# by string, on first use), so every room may take ``__version__`` from it; ``from toolcage import Sandbox``
# counts as an import of toolcage.sandbox, the module that defines the name.
_KERNEL = {"face", "policies"}
LAYERS: dict[str, set[str]] = {
    "face": set(),
    "policies": set(),  # the shared kernel: imports neither side (test_policies_import_neither_side, too)
    "worker": {"policies"},  # the sandbox's side: never the runner (test_worker_does_not_import_runner, too)
    "base": _KERNEL,  # errors, results, logs, textsafe, workspace: what every floor above stands on
    "rpc": _KERNEL | {"base", "worker"},  # the wire (the worker's line splitter and request checks)
    "image": _KERNEL | {"base"},  # the image builder
    # the engine adapter: neither a run's options nor what is left of runs (lifecycle), nor anything above
    "engine": _KERNEL | {"base", "rpc"},
    # what runs leave behind and their cleanup: never the library's front, never a run's home (run, options)
    "lifecycle": _KERNEL | {"base", "engine"},
    # the files facet: never the library's front; each door takes a call function
    "files": _KERNEL | {"base", "rpc", "worker"},
    "backends": _KERNEL | {"base", "rpc", "engine", "lifecycle", "image"},  # never options: BackendOptions
    "home": _KERNEL | {"base", "rpc", "engine", "lifecycle", "backends", "worker"},
    "front": _KERNEL | {"base", "rpc", "engine", "lifecycle", "backends", "home", "files", "worker"},
    "servers": _KERNEL | {"base", "rpc", "engine", "lifecycle", "backends", "home", "front", "worker"},
    "integrations": _KERNEL | {"base", "rpc", "backends", "home", "front", "files"},
    # the operator's views: they return reports, and the CLI prints them (never the CLI)
    "ops": _KERNEL | {"base", "rpc", "engine", "lifecycle", "backends", "image", "home", "front"},
    "ray": _KERNEL | {"base", "rpc", "engine", "lifecycle", "backends", "home", "front", "files", "ops"},
    "cli": _KERNEL | {"base", "rpc", "engine", "lifecycle", "backends", "image", "home", "front", "files",
                      "ops", "servers", "ray", "worker"},
}  # fmt: skip


def _house() -> list[str]:
    """Every module of the package (host side, worker and kernel), found by walking, not listed."""
    return sorted({"toolcage", *_runner(), *_modules("toolcage.worker"), *_modules("toolcage.policies")})


def _room(module: str) -> str | None:
    """The room holding ``module``: the longest name of ROOMS that is the module or a package above it."""
    best: tuple[int, str] | None = None
    for room, names in ROOMS.items():
        for name in names:
            if module == name or (name != "toolcage" and module.startswith(name + ".")):
                best = max(best or (0, ""), (len(name), room))
    return best[1] if best else None


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(module: str, known: set[str], source: str | None = None) -> list[tuple[str, int]]:
    """(module of the house, line) for every import ``module`` may run, at any depth (in functions too),
    ``if TYPE_CHECKING:`` blocks aside; ``from X import name`` is X.name when that is a module, and a
    public name of the face is the module that defines it (``toolcage._EXPORTS``). ``source``: read this
    text as the module's, not its file."""
    path = _file(module) if source is None else Path(module.rpartition(".")[2] + ".py")
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []

    def deepest(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((t, node.lineno) for a in node.names if (t := deepest(a.name)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    target: str | None = f"{base}.{alias.name}"
                elif base == "toolcage" and alias.name in toolcage._EXPORTS:
                    target = toolcage._EXPORTS[alias.name]
                else:
                    target = deepest(base)
                if target:
                    found.append((target, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text() if source is None else source))
    return [(t, line) for t, line in found if t != module]


def _graph() -> dict[str, set[str]]:
    """The house's file-level import graph: module -> the modules of the house it may import at run time."""
    modules = _house()
    known = set(modules)
    return {m: {t for t, _ in _runtime_imports(m, known)} for m in modules}


def test_the_reader_counts_lazy_imports_and_leaves_type_checking_aside() -> None:
    """An import in a function counts, one under ``if TYPE_CHECKING:`` does not (its ``else`` does); a name
    of the face counts as its defining module, a submodule as itself, a relative import as its target."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "import typing\n"
        "from toolcage import __version__, Sandbox, logs\n"
        "from . import hostconfig\n"
        "if TYPE_CHECKING:\n    from toolcage.pool import Pool\n"
        "else:\n    import toolcage.results\n"
        "if typing.TYPE_CHECKING:\n    import toolcage.aio\n"
        "def f():\n    from toolcage.options import worker_image\n"
    )
    known = set(_house())
    found = {t for t, _ in _runtime_imports("toolcage.engine.labels", known, source)}
    assert found == {"toolcage", "toolcage.sandbox", "toolcage.logs", "toolcage.engine.hostconfig",
                     "toolcage.results", "toolcage.options"}  # fmt: skip


def test_every_module_is_in_a_room() -> None:
    """Every module of the house belongs to a room of ROOMS (a new room, or a new module at the top, is placed
    there first), and every room has its row in LAYERS, naming only rooms that exist."""
    assert [m for m in _house() if _room(m) is None] == []
    assert set(LAYERS) == set(ROOMS)
    assert all(allowed <= set(ROOMS) for allowed in LAYERS.values())


def test_the_rooms_stand_on_floors() -> None:
    """The table itself has no circle: rooms stack in floors, each importing only rooms below it."""
    left = {room: set(allowed) - {room} for room, allowed in LAYERS.items()}
    floors: list[set[str]] = []
    while left:
        floor = {room for room, allowed in left.items() if not allowed}
        assert floor, f"LAYERS has a circle among {sorted(left)}"
        floors.append(floor)
        left = {room: allowed - floor for room, allowed in left.items() if room not in floor}
    assert floors[0] == {"face", "policies"} and floors[-1] == {"cli"}


@pytest.mark.parametrize("room", sorted(LAYERS))
def test_a_room_imports_only_the_rooms_its_row_names(room: str) -> None:
    """Each module of ``room`` imports (lazily too; TYPE_CHECKING aside) only its own room and those of its
    LAYERS row: e.g. the engine adapter neither options nor lifecycle, lifecycle never the library's front,
    the files room never Sandbox, ops never the CLI."""
    modules = _house()
    known = set(modules)
    wrong = [
        f"{m}:{line} imports {target} (room {_room(target)})"
        for m in modules
        if _room(m) == room
        for target, line in _runtime_imports(m, known)
        if _room(target) not in LAYERS[room] | {room}
    ]
    assert wrong == []


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def test_circles_are_found() -> None:
    """The circle finder sees a lazy two-module circle, a longer one and a self-import, and no circle in a chain."""
    assert _circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}}) == [["a", "b", "c"], ["d"]]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle_in_the_house() -> None:
    """No circle among the house's modules (host side, worker and kernel), lazy imports included."""
    assert _circles(_graph()) == []
