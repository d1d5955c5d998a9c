"""One error tree: every ToolcageError subclass defined anywhere in the package is drawn in toolcage.errors'
docstring under its real parent (with the exit code and status drawn, where drawn), importable from
toolcage.errors, and exported from toolcage unless it never reaches a caller."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import toolcage
import toolcage.errors

# Every ToolcageError subclass of every module of the package (walked with pkgutil, not listed; __main__ modules
# run the CLI when imported), in a fresh interpreter: name, module, parent in the tree, exit code, status.
WALK = """
import importlib, json, pkgutil, toolcage, toolcage.image
from toolcage.errors import MissingExtra, ToolcageError
for pkg in (toolcage, toolcage.image):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        if not m.name.endswith("__main__") and not m.name.startswith("toolcage.worker"):
            try:
                importlib.import_module(m.name)
            except MissingExtra:
                pass
seen, todo = {}, [ToolcageError]
while todo:
    cls = todo.pop()
    for sub in cls.__subclasses__():
        parent = next(b for b in sub.__bases__ if issubclass(b, ToolcageError))
        seen[sub.__name__] = [sub.__module__, parent.__name__, sub.exit_code, sub.status]
        todo.append(sub)
print(json.dumps(seen))
"""
# In toolcage.errors, not at the top: caught inside `image build`, which raises it as the BuildError it is.
NOT_EXPORTED = {"NoApt"}


def _drawn() -> dict[str, tuple[str | None, str]]:
    """The tree in toolcage.errors' docstring: name -> (its parent as drawn, the rest of its line)."""
    drawn: dict[str, tuple[str | None, str]] = {}
    stack: list[tuple[int, str]] = []
    for line in (toolcage.errors.__doc__ or "").splitlines():
        m = re.match(r"^(?P<lead>[ │├└─]*?)(?P<name>[A-Z][A-Za-z]+)\b(?P<rest>.*)$", line)
        if m is None or not (m["lead"].endswith("── ") or (m["name"] == "ToolcageError" and not drawn)):
            continue
        depth = len(m["lead"])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        drawn[m["name"]] = (stack[-1][1] if stack else None, m["rest"])
        stack.append((depth, m["name"]))
    return drawn


def _classes() -> dict[str, list[object]]:
    proc = subprocess.run([sys.executable, "-c", WALK], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    classes: dict[str, list[object]] = json.loads(proc.stdout)
    return classes


def test_the_drawing_is_read() -> None:
    """The docstring's tree is parsed: the root, a child of the root, a grandchild, each with its parent."""
    drawn = _drawn()
    assert drawn["ToolcageError"][0] is None and drawn["SandboxError"][0] == "ToolcageError"
    assert drawn["DownloadLimit"][0] == "DownloadError" and drawn["EngineUnavailable"][0] == "DockerUnavailable"


def test_every_error_is_drawn_under_its_parent_and_importable() -> None:
    """Each ToolcageError subclass anywhere in the package: drawn under its real parent, as drawn (exit code,
    status), defined in (or, for the kernel's, re-exported by) toolcage.errors, and exported from toolcage."""
    drawn, classes = _drawn(), _classes()
    assert set(classes) <= set(drawn) - {"ToolcageError"}, f"not drawn: {sorted(set(classes) - set(drawn))}"
    assert set(drawn) - {"ToolcageError"} <= set(classes), f"drawn, not defined: {sorted(set(drawn) - set(classes))}"
    for name, (module, parent, exit_code, status) in classes.items():
        assert drawn[name][0] == parent, f"{name} is drawn under {drawn[name][0]}, its parent is {parent}"
        rest = drawn[name][1]
        if m := re.search(r"\(exit (\d+)\)", rest):
            assert int(m[1]) == exit_code, name
        if m := re.search(r'status "(\w+)"', rest):
            assert m[1] == status, name
        assert module in ("toolcage.errors", "toolcage.policies.errors"), f"{name} is defined in {module}"
        assert name in toolcage.errors.__all__ and getattr(toolcage.errors, name).__name__ == name
        assert name in NOT_EXPORTED or name in toolcage.__all__, f"{name} is not exported from toolcage"
