"""Modules that moved into rooms keep their old import paths for one release, with a DeprecationWarning."""

from __future__ import annotations

import subprocess
import sys

import pytest

import toolcage

CODE = """
import importlib, warnings
warnings.simplefilter("error")
import toolcage
for old, new in toolcage._MOVED.items():
    try:
        importlib.import_module(old)
    except DeprecationWarning as exc:
        assert new in str(exc), exc
    else:
        raise SystemExit(old + " gave no DeprecationWarning")
warnings.simplefilter("ignore")
for old, new in toolcage._MOVED.items():
    assert importlib.import_module(old) is importlib.import_module(new), old
from toolcage import transfer
from toolcage.transfer import DownloadError
from toolcage.files.safetar import DownloadError as same
assert DownloadError is same
print("ok")
"""


def test_old_paths_warn_and_give_the_new_module() -> None:
    """``import toolcage.transfer`` (and each moved path) warns, then is the very module now in its room."""
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "ok", proc.stderr[-2000:]


@pytest.mark.parametrize("old", sorted(toolcage._MOVED))
def test_each_new_path_exists(old: str) -> None:
    """Each old path names a module that exists under its new name (a typo in the table would fail here)."""
    import importlib

    assert importlib.import_module(toolcage._MOVED[old]).__name__ == toolcage._MOVED[old]
