"""`toolcage image build --requirements` on the real engine: the packages are importable from
/opt/toolcage/deps, read-only for the sandbox user, the worker still starts, a rebuild is a no-op."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = "six==1.16.0\n"

pytestmark = [
    pytest.mark.usefixtures("no_leaks"),
    pytest.mark.runc_only(
        "image building (the host's engine and its build steps): the same whatever kernel the sandbox has"
    ),
]


def _parent() -> str:
    """The worker image these tests run on, used as it is (--from), so no one's image is rebuilt."""
    from toolcage import DEFAULT_IMAGE

    return os.environ.get("TOOLCAGE_IMAGE", DEFAULT_IMAGE)


def _build(requirements: Path, tag: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "toolcage.cli", "image", "build", "--requirements", str(requirements)]
    cmd += ["--tag", tag, "--from", _parent()]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)


@pytest.fixture(scope="module")
def derived(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A derived image with six, under a toolcage-test- tag, removed at the end whatever happened."""
    tag = f"toolcage-test-derived-{uuid.uuid4().hex[:8]}:1"
    req = tmp_path_factory.mktemp("derived") / "requirements.txt"
    req.write_text(REQUIREMENTS)
    try:
        out = _build(req, tag)
        assert out.returncode == 0, out.stderr[-3000:]
        yield {"tag": tag, "requirements": req, "result": json.loads(out.stdout), "stderr": out.stderr}
    finally:
        try:
            engine.api.remove_image(tag)
        except Exception as exc:  # gone already (a failed build) is fine; anything else is said
            if "No such image" not in str(exc):
                raise


def _python(engine: Any, tag: str, code: str, env: tuple[str, ...] = ()) -> str:
    """Run ``python3 -c code`` in the image as its user (65532), with no network; its output."""
    config = {
        "Image": tag,
        "Entrypoint": ["python3"],
        "Cmd": ["-c", code],
        "Env": list(env),
        "NetworkDisabled": True,
        "Labels": {"toolcage.test": "image-derived"},
        "HostConfig": {"CapDrop": ["ALL"]},
    }
    cid = engine.create(config, f"toolcage-test-derived-{uuid.uuid4().hex[:8]}")
    try:
        engine.start(cid)
        code_ = engine.wait(cid, 60)
        out = engine.logs(cid)
    finally:
        engine.remove(cid)
    assert code_ == 0, out
    return str(out)


def test_package_imports_from_deps(engine: Any, derived: dict[str, Any]) -> None:
    """With /opt/toolcage/deps on PYTHONPATH, the requirement imports, from there."""
    code = "import six; print(six.__version__, six.__file__)"
    out = _python(engine, derived["tag"], code, ("PYTHONPATH=/opt/toolcage/deps",))
    assert out.split() == ["1.16.0", "/opt/toolcage/deps/six.py"]


def test_worker_still_starts_and_keeps_its_own_path(engine: Any, derived: dict[str, Any]) -> None:
    """Sandbox(image=derived) runs a call; the image keeps the worker's user, entrypoint and env (no deps on it)."""
    from toolcage import Sandbox

    with Sandbox(image=derived["tag"]) as sb:
        r = sb.call("run_python", {"code": "print(1)"})
    assert r.status == "ok" and r.result["stdout"] == "1\n", r
    mine, parent = engine.image(derived["tag"])["Config"], engine.image(_parent())["Config"]
    for key in ("User", "Entrypoint", "Env", "WorkingDir"):
        assert mine[key] == parent[key], key
    assert mine["User"] == "65532:65532" and not any("/opt/toolcage/deps" in e for e in mine["Env"])


def test_code_and_connectors_import_the_packages(engine: Any, derived: dict[str, Any], tmp_path: Path) -> None:
    """run_python code and a connector's handler (both children of the worker) import the image's packages."""
    from toolcage import Sandbox

    conn = tmp_path / "uses_six.py"
    conn.write_text(
        "import six\nfrom toolcage.sdk import tool\n\n\n@tool\ndef six_version() -> str:\n"
        '    """The version of six."""\n    return six.__version__\n'
    )
    with Sandbox(image=derived["tag"], tools=[conn]) as sb:
        code = sb.call("run_python", {"code": "import six; print(six.__file__)"})
        handler = sb.call("six_version")
    assert code.ok and code.result["stdout"] == "/opt/toolcage/deps/six.py\n", code
    assert handler.ok and handler.result == "1.16.0", handler


def test_deps_are_read_only_for_the_sandbox_user(engine: Any, derived: dict[str, Any]) -> None:
    """Every file and directory in deps is root's, not writable by uid 65532, setuid-free, and byte-compiled."""
    code = (
        "import json, os, stat\n"
        "bad = []\n"
        "for root, dirs, files in os.walk('/opt/toolcage/deps'):\n"
        "    for p in [root] + [os.path.join(root, f) for f in files]:\n"
        "        st = os.lstat(p)\n"
        "        if os.access(p, os.W_OK) or st.st_uid != 0 or st.st_mode & (stat.S_ISUID | stat.S_ISGID):\n"
        "            bad.append(p)\n"
        "print(json.dumps({'uid': os.getuid(), 'bad': bad,\n"
        "    'pyc': sorted(os.listdir('/opt/toolcage/deps/__pycache__'))}))\n"
    )
    found = json.loads(_python(engine, derived["tag"], code).strip().splitlines()[-1])
    assert found["uid"] == 65532 and found["bad"] == []
    assert any(name.startswith("six.cpython-311") for name in found["pyc"])


def test_labels_name_the_requirements_and_the_parent(engine: Any, derived: dict[str, Any]) -> None:
    """Labelled with the file's hash and the parent's id; the worker's source label is the parent's,
    so `doctor`'s comparison says of a derived image what it says of its parent."""
    from toolcage.image.build import SOURCE_LABEL
    from toolcage.image.derived import PARENT_LABEL, REQUIREMENTS_LABEL

    labels = engine.image(derived["tag"])["Config"]["Labels"]
    parent = engine.image(_parent())
    assert labels[REQUIREMENTS_LABEL] == hashlib.sha256(REQUIREMENTS.encode()).hexdigest()
    assert labels[PARENT_LABEL] == parent["Id"] == derived["result"]["parent_id"]
    assert labels[SOURCE_LABEL] == parent["Config"]["Labels"][SOURCE_LABEL]
    # all in one build step (the engine's build API made one step per label, 2-10 s each: issue 35)
    assert sum(": LABEL " in line for line in derived["stderr"].splitlines()) == 1, derived["stderr"][-2000:]


def test_second_build_is_up_to_date(engine: Any, derived: dict[str, Any]) -> None:
    """A second build with nothing changed reports built=false, says 'up to date' and keeps the image."""
    before = engine.image(derived["tag"])["Id"]
    out = _build(derived["requirements"], derived["tag"])
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["built"] is False and "up to date" in out.stderr
    assert engine.image(derived["tag"])["Id"] == before
