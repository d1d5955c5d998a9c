"""The MCP SDK is an extra (``toolcage[mcp]``): without it the library, ``toolcage run`` and ``mcp wrap``
work, and ``toolcage mcp serve`` exits 2 naming the extra (no traceback)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# a Python where the MCP SDK (and anyio, which only it needs) cannot be imported, as in a core install
WITHOUT_MCP = """
import sys
class _NoMcp:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("mcp", "mcp_types", "anyio"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoMcp())
"""


def _run(code: str, *argv: str) -> subprocess.CompletedProcess[str]:
    script = WITHOUT_MCP + code
    return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=120)


def test_core_needs_no_mcp_sdk() -> None:
    """pyproject: mcp and anyio are in the mcp extra, not the core dependencies; dev pulls the extra in."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    assert "mcp" not in core and "anyio" not in core
    extras = project["optional-dependencies"]
    assert any(d.startswith("mcp>=") for d in extras["mcp"]) and "toolcage[mcp]" in extras["dev"]


def test_library_and_run_work_without_the_sdk() -> None:
    """import toolcage, a Sandbox run and `toolcage run` need no MCP SDK; nor does `mcp wrap` (its own relay)."""
    code = (
        "import toolcage, toolcage.servers.mcp_wrap, toolcage.servers.mcp_relay\n"
        "from toolcage import Sandbox\n"
        "with Sandbox(sandbox='none', audit=False) as sb:\n"
        "    assert sb.call('run_python', {'code': 'print(6*7)'}).result['stdout'] == '42\\n'\n"
        "sys.argv = ['toolcage', 'run', 'ping', '--sandbox', 'none']\n"
        "from toolcage.cli.main import main\n"
        "main()\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert '"status": "ok"' in out.stdout and "Traceback" not in out.stderr


def test_mcp_serve_names_the_extra() -> None:
    """`toolcage mcp serve` without the SDK: exit 2, one line naming `toolcage[mcp]`, no traceback."""
    out = _run(
        "sys.argv = ['toolcage', 'mcp', 'serve', '--sandbox', 'none']\nfrom toolcage.cli.main import main\nmain()\n"
    )
    assert out.returncode == 2, out.stderr
    assert "pip install 'toolcage[mcp]'" in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.startswith("toolcage: ") and out.stdout == ""
