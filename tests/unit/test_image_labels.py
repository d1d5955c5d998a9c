"""An image's labels are one Dockerfile LABEL step, not one build step per label (issue 35: 8-10 s each)."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolcage.errors import BuildError
from toolcage.image.build import label_line, run_build


class RecordingEngine:
    """build() records the labels the API was given and the Dockerfile it was handed."""

    def __init__(self) -> None:
        self.api_labels: dict[str, str] | None = None
        self.dockerfile = ""

    def build(self, context: str, tag: str, buildargs: dict[str, str], labels: dict[str, str]) -> Iterator[Any]:
        self.api_labels, self.dockerfile = labels, (Path(context) / "Dockerfile").read_text()
        yield {"stream": "Step 1/2 : FROM x\n"}

    def image(self, ref: str) -> dict[str, Any]:
        return {"Id": "sha256:new"}


def test_labels_are_one_dockerfile_line_not_the_build_apis() -> None:
    """run_build gives the engine no labels (it would add a step per label) and appends one LABEL line."""
    engine = RecordingEngine()
    labels = {"toolcage.context_sha256": "ab" * 32, "toolcage.parent_id": "sha256:cd", "toolcage.apt": "git curl"}
    ctx = Path(__import__("tempfile").mkdtemp(prefix="toolcage-test-labels-"))
    (ctx / "Dockerfile").write_text("FROM x")  # no final newline: the LABEL still starts a line of its own
    run_build(engine, ctx, "toolcage-test:1", {}, labels, lambda _m: None)  # type: ignore[arg-type]
    assert engine.api_labels == {}
    lines = engine.dockerfile.splitlines()
    assert lines[0] == "FROM x" and [ln for ln in lines if ln.startswith("LABEL")] == [lines[-1]]
    assert dict(w.split("=", 1) for w in shlex.split(lines[-1].removeprefix("LABEL "))) == labels


def test_label_values_are_quoted_for_the_dockerfile() -> None:
    """Quotes, backslashes and $ are escaped (the engine would expand $HOME); checked against the engine in
    tests/integration/test_image_derived.py; a control character is refused, never written."""
    line = label_line({"toolcage.a": 'x $HOME "q" \\'})
    assert line == 'LABEL "toolcage.a"="x \\$HOME \\"q\\" \\\\"\n'
    with pytest.raises(BuildError, match="control character"):
        label_line({"toolcage.a": "x\nRUN rm -rf /"})
