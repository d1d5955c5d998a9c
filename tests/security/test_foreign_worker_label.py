"""An image that carries the worker label but was not built here runs with toolcage's runtime, not its own worker.

Attack: the label ``toolcage.source_sha256`` is a string anyone can write. An image built FROM the worker image
by plain ``docker build`` (or any image with the label) whose ``/opt/toolcage/lib/toolcage/worker`` is the
attacker's was started as a worker image: its own code became the worker, which receives a connector's
secrets and speaks for the sandbox on the channel. Now only the worker image itself and images this
installation built (``toolcage image build``: image.build.record_built) run their own worker; any other runs
with the worker image's runtime mounted over /opt/toolcage/lib and /opt/toolcage/rt.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolcage import DEFAULT_IMAGE, Sandbox, ToolcageError

pytestmark = pytest.mark.runc_only(
    "which worker an image runs is the runner's decision, made before any runtime starts"
)

TAG = "toolcage-test-sec36-labelled:2"
EVIL = """import os
os.write(2, b"EVIL-WORKER-RAN\\n")
os._exit(3)  # it could answer anything; it leaves at once, so the premise does not wait out a start timeout
"""


@pytest.fixture(scope="module")
def labelled(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    ctx: Path = tmp_path_factory.mktemp("labelled")
    (ctx / "evil.py").write_text(EVIL)
    (ctx / "Dockerfile").write_text(
        f"FROM {DEFAULT_IMAGE}\nUSER 0\nCOPY evil.py /opt/toolcage/lib/toolcage/worker/__main__.py\n"
        "RUN rm -rf /opt/toolcage/lib/toolcage/worker/__pycache__\nUSER 65532:65532\n"
    )
    subprocess.run(["docker", "build", "-q", "-t", TAG, str(ctx)], check=True, capture_output=True, timeout=300)
    yield TAG
    subprocess.run(["docker", "image", "rm", "-f", TAG], check=False, capture_output=True)


def test_premise_the_labelled_image_carries_its_own_worker(labelled: str) -> None:
    """Run by its own entrypoint, the image's 'worker' is the attacker's code (the attack is real)."""
    out = subprocess.run(["docker", "run", "--rm", "-i", "--network", "none", labelled], input="",
                         capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert "EVIL-WORKER-RAN" in out.stderr


def test_premise_the_old_rule_ran_it(labelled: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the old rule (the label alone makes a worker image) the attacker's worker is the one started."""
    from toolcage.image import build

    monkeypatch.setattr(build, "runs_own_worker", lambda info, worker: build.check_worker_image(info) == "worker")
    with pytest.raises(ToolcageError), Sandbox(image=labelled) as sb:
        sb.call("ping")


def test_a_labelled_image_not_built_here_runs_toolcage_s_worker(labelled: str) -> None:
    with Sandbox(image=labelled) as sb:
        assert sb.call("ping").result == "pong"
        r = sb.call("exec", {"argv": ["cat", "/opt/toolcage/lib/toolcage/worker/__main__.py"]})
        assert "EVIL-WORKER-RAN" not in r.result["stdout"]  # the runtime's lib is mounted over the image's
        assert "toolcage.worker" in r.result["stdout"] or "def main" in r.result["stdout"]
