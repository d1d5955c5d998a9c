"""`import toolcage` works from a directory that holds a folder named toolcage (users clone into a folder named
after the project, and run scripts beside it in the first five minutes). With setuptools' default editable
finder, which comes after the path, that folder was imported as an empty namespace package instead."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_a_folder_named_toolcage_beside_the_script_does_not_shadow_the_package(tmp_path: Path) -> None:
    (tmp_path / "toolcage" / "runner").mkdir(parents=True)  # a clone's shape: no __init__.py at its top
    (tmp_path / "script.py").write_text("import toolcage\nprint(toolcage.__version__, toolcage.Sandbox.__name__)\n")
    out = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["0.1.0", "Sandbox"], out.stderr[-800:]
