"""The OpenAI Agents SDK's own test modules, from the released sdist of the installed ``openai-agents``, for
``test_openai_agents_sdk_suite.py``: fetched once with pip into a cache (``$XDG_CACHE_HOME/toolcage-tests``)
and imported under names of their own. A failure to fetch is an error that says why, never a skip.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from importlib import metadata
from pathlib import Path
from types import ModuleType

import pytest


def sdk_tests(*files: str) -> dict[str, ModuleType]:
    """The SDK's test modules (``tests/sandbox/<file>``) from the released sdist of the installed version,
    fetched once with pip into a cache. A failure to fetch is an error that says why, never a skip."""
    version = metadata.version("openai-agents")
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cache = home / "toolcage-tests" / f"openai-agents-{version}"
    root = cache / "sdk"
    if not (root / "pyproject.toml").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        got = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps",
             f"openai-agents=={version}", "-d", str(cache)],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        sdists = sorted(cache.glob("openai_agents-*.tar.gz"))
        if got.returncode != 0 or not sdists:
            raise RuntimeError(
                f"could not fetch the openai-agents {version} sdist from PyPI (its tests run here): "
                f"{got.stderr.strip() or got.stdout.strip()}"
            )
        staging = Path(tempfile.mkdtemp(dir=cache))
        with tarfile.open(sdists[-1]) as tf:
            parts = [m.name.split("/") for m in tf]
            keep = [m for m, p in zip(tf, parts, strict=True) if p[1:2] == ["tests"] or p[1:] == ["pyproject.toml"]]
            tf.extractall(staging, members=keep, filter="data")
        (top,) = staging.iterdir()
        try:
            os.rename(top, root)  # whole or not at all
        except OSError:
            if not (root / "pyproject.toml").is_file():  # not another run's copy, landed meanwhile
                raise
        shutil.rmtree(staging)
    # The SDK's own markers (its pyproject's), registered as its conftest would (this run has --strict-markers)
    config = getattr(pytest.mark, "_config", None)
    if config is not None:
        sdist_meta = tomllib.loads((root / "pyproject.toml").read_text())
        for line in sdist_meta["tool"]["pytest"]["ini_options"]["markers"]:
            config.addinivalue_line("markers", line)
    # The SDK's tests import their helpers as ``tests.*``, toolcage's own package name: lend them the name
    # while they load, then give it back (what they imported stays bound in their modules).
    ours = {k: v for k, v in sys.modules.items() if k == "tests" or k.startswith("tests.")}
    for k in ours:
        del sys.modules[k]
    sys.path.insert(0, str(root))
    out = {}
    try:
        for f in files:
            name = f"_openai_agents_sdk_{Path(f).stem}"
            spec = importlib.util.spec_from_file_location(name, root / "tests" / "sandbox" / f)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
            out[f] = mod
    finally:
        sys.path.remove(str(root))
        for k in [k for k in sys.modules if k == "tests" or k.startswith("tests.")]:
            del sys.modules[k]
        sys.modules.update(ours)
    return out


__all__ = ["sdk_tests"]
