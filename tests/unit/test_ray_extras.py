"""Optional modules without their extra (toolcage.ray, toolcage.integrations.*): an ImportError that is also a
toolcage error and names the extra, so tools that import optional modules (pkgutil, IDEs, docs generators) skip
them, and a user reads what to install. Each case runs in a fresh interpreter with the framework hidden."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
for name in {hidden!r}:
    sys.modules[name] = None  # as if not installed: importing it is a ModuleNotFoundError
try:
    import {module}
except BaseException as exc:
    from toolcage.errors import ToolcageError, UsageError
    print(json.dumps({{"type": type(exc).__name__, "import_error": isinstance(exc, ImportError),
        "toolcage": isinstance(exc, ToolcageError), "usage": isinstance(exc, UsageError),
        "message": str(exc), "name": getattr(exc, "name", None), "details": getattr(exc, "details", None)}}))
else:
    print(json.dumps(None))
"""


def _import_without(module: str, hidden: list[str]) -> dict[str, object] | None:
    code = PROBE.format(hidden=hidden, module=module)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    got: dict[str, object] | None = json.loads(out.stdout.strip().splitlines()[-1])
    return got


@pytest.mark.parametrize(
    ("module", "hidden", "extra"),
    [
        ("toolcage.ray", ["ray"], "ray"),
        ("toolcage.integrations.openai_agents", ["agents"], "openai-agents"),
        ("toolcage.integrations.deepagents", ["deepagents"], "deepagents"),
        ("toolcage.integrations.langchain", ["langchain_core"], "langchain"),
    ],
)
def test_an_optional_module_without_its_extra_is_an_import_error_naming_the_extra(
    module: str, hidden: list[str], extra: str
) -> None:
    """Importing it raises MissingExtra: an ImportError, a UsageError, and the pip command in one line."""
    got = _import_without(module, hidden)
    assert got is not None, f"{module} imported with {hidden} hidden"
    assert got["type"] == "MissingExtra" and got["import_error"] and got["toolcage"] and got["usage"], got
    assert f"pip install 'toolcage[{extra}]'" in str(got["message"]) and "\n" not in str(got["message"]), got
    assert got["name"] == hidden[0] and got["details"] == {"extra": extra, "module": hidden[0]}, got


def test_walking_the_package_skips_the_ray_room_when_ray_is_missing() -> None:
    """pkgutil.walk_packages (as docs generators walk a package) goes on past toolcage.ray without Ray: it
    skips packages whose import raises an ImportError, and only those."""
    code = """
import json, pkgutil, sys
sys.modules["ray"] = None
import toolcage
names = [m.name for m in pkgutil.walk_packages(toolcage.__path__, "toolcage.")]
print(json.dumps(names))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    names = json.loads(out.stdout.strip().splitlines()[-1])
    assert "toolcage.ray" in names and "toolcage.ray.cluster" not in names  # listed, not entered


def test_the_ray_room_loads_ray_with_its_first_name_not_with_the_package() -> None:
    """``import toolcage.ray`` with Ray installed imports no Ray yet (the lazy face); ``toolcage.ray.Cluster`` does."""
    code = """
import json, sys
import toolcage.ray as tcr
before = "ray" in sys.modules
tcr.Cluster
print(json.dumps([before, "ray" in sys.modules, sorted(tcr.__all__)]))
"""
    pytest.importorskip("ray")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, after, names = json.loads(out.stdout.strip().splitlines()[-1])
    assert (before, after) == (False, True)
    assert names == sorted(
        [
            "NODE_RESOURCE",
            "AsyncClusterSandbox",
            "Cluster",
            "ClusterSandbox",
            "EngineAgent",
            "cluster_audit",
            "cluster_ps",
        ]
    )
