"""examples/data_agent runs as written (issue 38, point 5): a scripted data agent in one Python context of an
image with pandas and matplotlib: the DataFrame persists across steps, a mistake is the cell's error and the
context lives on, and the chart comes back as a PNG result without savefig."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.runc_only(
    "the example's loop, host-side; the interpreter's cells, bounds and images run under gVisor in its own tests"
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "data_agent" / "data_agent.py"
IMAGE = os.environ.get("TOOLCAGE_DATA_IMAGE", "toolcage-data:dev")


@pytest.fixture(scope="module")
def data_image() -> str:
    """The example's image, built (from the worker image, pandas and matplotlib from PyPI) if this engine lacks
    it; a build that fails fails the test, saying why."""
    have = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, check=False)
    if have.returncode != 0:
        build = subprocess.run(
            [sys.executable, "-m", "toolcage.cli", "image", "build", "--pip", "pandas", "--pip", "matplotlib",
             "--tag", IMAGE],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        assert build.returncode == 0, f"could not build {IMAGE} for the example:\n{build.stderr[-3000:]}"
    return IMAGE


def test_the_data_agent_keeps_its_dataframe_and_draws_a_chart(engine: Any, data_image: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "--image", data_image, "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    steps = {s["step"]: s for s in map(json.loads, out.stdout.splitlines())}
    assert list(steps) == ["load", "summarise", "mistake", "answer", "chart"]
    assert [s["execution_count"] for s in steps.values()] == [1, 2, 3, 4, 5]  # one context throughout
    assert steps["load"]["stdout"] == "24 rows; columns: month, region, units, revenue\n"
    (table,) = steps["summarise"]["results"]
    assert "html" in table["formats"] and table["main"] and "east" in table["text"]  # a DataFrame: HTML and text
    assert steps["mistake"]["status"] == "error" and steps["mistake"]["error"] == "KeyError: 'profit'"
    assert steps["answer"]["results"][0]["text"] == "'best region: east, 13,689 in revenue over 6 months'"
    (chart,) = steps["chart"]["results"]
    assert chart["formats"] == ["png"] and not chart["main"] and chart["png_bytes"] > 5000
    png = (tmp_path / "chart-1.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) == chart["png_bytes"]
