"""Import a library's core submodules without running its package ``__init__``.

Why: the worker's start-up is on the critical path of every run. ``import jsonrpcserver``
pulls in jsonschema, asyncio and http.server (~150 ms in a 1-CPU container here) only to
offer a default request validator and an HTTP server, neither of which the worker uses.
Its dispatch pipeline lives in ``jsonrpcserver.dispatcher`` and imports none of them.
This helper registers the package as a bare namespace so ``import pkg.submodule`` loads
just what is named. Versions are pinned (pyproject, image requirements) and a unit test
checks the trick still yields a working dispatcher.
"""

from __future__ import annotations

import importlib.util
import sys
import types


def bare_package(name: str) -> None:
    """Make ``name`` importable as a package whose ``__init__`` never runs (no-op if already imported)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not an installed package")
    module = types.ModuleType(name)
    module.__path__ = list(spec.submodule_search_locations)
    module.__spec__ = spec
    module.__file__ = spec.origin
    sys.modules[name] = module
