"""toolcage image build is idempotent: with nothing changed it does not rebuild."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.runc_only(
    "image building (the host's engine and its build steps): the same whatever kernel the sandbox has"
)

ROOT = Path(__file__).resolve().parents[2]


def test_second_build_is_a_no_op(engine: Any) -> None:
    """A build right after a build reports 'up to date', keeps the image id, and takes seconds, not minutes."""
    from toolcage import DEFAULT_IMAGE

    before = engine.image(DEFAULT_IMAGE)["Id"]
    t = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "toolcage.cli", "image", "build"], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["built"] is False and "up to date" in out.stderr
    assert engine.image(DEFAULT_IMAGE)["Id"] == before
    assert time.monotonic() - t < 30


def test_image_user_and_entrypoint(engine: Any) -> None:
    """The image runs as uid 65532 with `python3 -S -m toolcage.worker` and carries its source hash."""
    from toolcage import DEFAULT_IMAGE
    from toolcage.image.build import SOURCE_LABEL, source_sha256

    cfg = engine.image(DEFAULT_IMAGE)["Config"]
    assert cfg["User"] == "65532:65532"
    assert cfg["Entrypoint"] == ["python3", "-S", "-m", "toolcage.worker"]
    assert cfg["Labels"][SOURCE_LABEL] == source_sha256()
