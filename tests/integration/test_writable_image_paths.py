"""writable= on the real engine (issue 36, points 3 and 4), under runc and (TOOLCAGE_SANDBOX=gvisor) gVisor: a
path of the image is writable for the run, filled with the image's content (root-only files too), written by
the sandbox user through the tools and through programs, capped (ENOSPC, the sandbox lives on), diffed against
the image by ``changes(path=...)``; ``pip install`` of a local wheel into a writable /usr/local; the CLI's
``--writable``; a path the image lacks or holds as a file is refused before a sandbox starts; the worker
image takes it too.

The image is this module's own, built FROM toolcage-base:bookworm with no network: a /testbed repository
with a bug, a root-only file, a hard link, a symlink, a setuid copy of /bin/true, and pip (copied from this
checkout's virtualenv: no index, nothing fetched).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import run_cli
from toolcage import Sandbox
from toolcage.errors import UsageError

IMAGE = "toolcage-test-wr-repo:1"
BASE = "toolcage-base:bookworm"
DOCKERFILE = f"""FROM {BASE}
RUN set -eu; mkdir -p /testbed/src /testbed/data; cd /testbed; \\
    printf 'def add(a, b):\\n    return a - b\\n' > src/calc.py; \\
    printf 'from src.calc import add\\nassert add(2, 3) == 5\\n' > test_calc.py; \\
    printf 'only root reads this\\n' > rootonly.txt; chmod 600 rootonly.txt; \\
    ln -s src/calc.py calc_link; \\
    head -c 300000 /dev/urandom > data/blob.bin; ln data/blob.bin hard.bin; \\
    cp /bin/true setuid_true; chmod 4755 setuid_true; \\
    mkdir -p /usr/local/lib/python3.11/dist-packages
COPY pip /usr/lib/python3/dist-packages/pip
"""


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    if subprocess.run(["docker", "image", "inspect", BASE], capture_output=True).returncode != 0:
        pytest.fail(f"{BASE} is not on this engine: run `toolcage image build` (it bootstraps it)", pytrace=False)
    import pip

    with tempfile.TemporaryDirectory() as ctx:
        shutil.copytree(os.path.dirname(pip.__file__), os.path.join(ctx, "pip"))
        Path(ctx, "Dockerfile").write_text(DOCKERFILE)
        build = ["docker", "build", "-q", "--network", "none", "-t", IMAGE, ctx]
        subprocess.run(build, check=True, capture_output=True)
    yield IMAGE
    subprocess.run(["docker", "image", "rm", "-f", IMAGE], capture_output=True)


def _sh(sb: Sandbox, command: str) -> dict[str, object]:
    res = sb.call("exec", {"argv": ["sh", "-c", command]})
    assert res.ok, res.error
    assert isinstance(res.result, dict)
    return res.result


def test_testbed_is_writable_filled_from_the_image_and_diffed(image: str, no_leaks: None) -> None:
    with Sandbox(image=image, writable=("/testbed",), writable_size="32m") as sb:
        out = _sh(
            sb,
            "id -u; cat /testbed/rootonly.txt; stat -c '%a %u' /testbed/setuid_true /testbed/src/calc.py; "
            "readlink /testbed/calc_link; cmp /testbed/hard.bin /testbed/data/blob.bin && echo same; "
            "sed -i 's/a - b/a + b/' /testbed/src/calc.py && cd /testbed && python3 test_calc.py && echo passed; "
            'rm /testbed/data/blob.bin; awk \'$5 == "/" {split($6, o, ","); print o[1]}\' /proc/self/mountinfo',
        )
        lines = str(out["stdout"]).splitlines()
        assert lines[0] == "65532"  # never root, whatever the image's USER
        assert lines[1] == "only root reads this"  # the engine read it as root; the sandbox user owns the copy
        assert lines[2] == "755 65532" and lines[3].endswith(" 65532")  # setuid dropped, owner the sandbox user
        assert lines[4:] == ["src/calc.py", "same", "passed", "ro"]  # the root stays read-only
        # the file tools and downloads reach it as they reach /scratch
        assert sb.call("write_file", {"path": "/testbed/NOTES.md", "content": "fixed\n"}).ok
        assert sb.call("read_file", {"path": "/testbed/NOTES.md"}).result["content"] == "fixed\n"  # type: ignore[index]
        listed = sb.call("list_files", {"path": "/testbed"})
        assert listed.ok and "src" in json.dumps(listed.result)
        with tempfile.TemporaryDirectory() as down:
            got = sb.download("/testbed/src", down)
            assert got.files == 1
            assert ["a + b" in f.read_text() for f in Path(down).rglob("calc.py")] == [True]
        ch = sb.changes(path="/testbed")
        assert ch.added == ("NOTES.md",) and ch.changed == ("src/calc.py",) and ch.removed == ("data/blob.bin",)
        assert "-    return a - b\n+    return a + b\n" in ch.diff
        # the patch applies to the image's own tree: what an eval harness grades by
        with tempfile.TemporaryDirectory() as repo:
            name = f"toolcage-test-wr-cp-{sb.run_id}"
            subprocess.run(["docker", "create", "--name", name, image, "true"], check=True, capture_output=True)
            try:
                subprocess.run(["docker", "cp", f"{name}:/testbed", repo], check=True, capture_output=True)
            finally:
                subprocess.run(["docker", "rm", name], capture_output=True)
            tree = Path(repo, "testbed")
            done = subprocess.run(["git", "apply", "-"], input=ch.diff, text=True, cwd=tree, capture_output=True)
            assert done.returncode == 0, done.stderr
            assert "a + b" in (tree / "src" / "calc.py").read_text() and (tree / "NOTES.md").is_file()
            assert not (tree / "data" / "blob.bin").exists()


def test_past_the_cap_the_writer_gets_enospc_and_the_sandbox_lives_on(image: str, no_leaks: None) -> None:
    with Sandbox(image=image, writable=("/testbed",), writable_size="16m") as sb:
        out = _sh(sb, "dd if=/dev/zero of=/testbed/big bs=1M count=64; echo rc=$?")
        assert "No space left on device" in str(out["stderr"]) and "rc=1" in str(out["stdout"])
        _sh(sb, "rm /testbed/big; dd if=/dev/zero of=/testbed/big bs=1M count=15 2>/dev/null")
        big = sb.call("write_file", {"path": "/testbed/big2", "content": base64.b64encode(b"x" * (3 << 20)).decode(),
                                      "encoding": "base64"})  # fmt: skip
        assert not big.ok and "writable_size" in json.dumps(big.error)
        assert _sh(sb, "rm /testbed/big; echo ok")["stdout"] == "ok\n"
        assert sb.dead is None


def _wheel(path: Path) -> None:
    """A wheel of one module (demo_wr), made here: pip installs it from the file, no index."""
    files = {
        "demo_wr.py": "VALUE = 42\n",
        "demo_wr-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: demo-wr\nVersion: 1.0\n",
        "demo_wr-1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{name},,\n" for name in files) + "demo_wr-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in {**files, "demo_wr-1.0.dist-info/RECORD": record}.items():
            zf.writestr(name, text)


def test_pip_installs_a_local_wheel_into_a_writable_usr_local(image: str, no_leaks: None, tmp_path: Path) -> None:
    wheel = tmp_path / "demo_wr-1.0-py3-none-any.whl"
    _wheel(wheel)
    with Sandbox(image=image, writable=("/usr/local",), writable_size="64m") as sb:
        sb.upload(wheel, "/scratch/wheels")
        out = _sh(
            sb,
            "python3 -m pip install --no-index --no-cache-dir --break-system-packages --disable-pip-version-check "
            "/scratch/wheels/demo_wr-1.0-py3-none-any.whl >/dev/null && cd / && python3 -c "
            "'import demo_wr; print(demo_wr.VALUE, demo_wr.__file__)'",
        )
        assert out["stdout"] == "42 /usr/local/lib/python3.11/dist-packages/demo_wr.py\n", out
        ch = sb.changes(path="/usr/local")
        assert "lib/python3.11/dist-packages/demo_wr.py" in ch.added


def test_a_path_the_image_holds_as_a_file_starts_nothing(image: str, no_leaks: None) -> None:
    sb = Sandbox(image=image, writable=("/etc/hostname",), writable_size="8m")
    with pytest.raises(UsageError, match="not a directory"):
        sb.start()
    assert sb.container_id is None
    sb.close()


def test_a_path_the_image_lacks_starts_empty(image: str, no_leaks: None) -> None:
    """Harbor's /logs, /tests and /solution, which a task's image need not have: the engine makes the mount point
    (on a read-only root too), and the path starts as an empty writable directory, diffed against nothing."""
    with Sandbox(image=image, writable=("/logs", "/deep/er"), writable_size="8m") as sb:
        out = _sh(sb, "ls -A /logs /deep/er && echo x > /logs/l && cat /logs/l")["stdout"]
        assert out == "/deep/er:\n\n/logs:\nx\n", out
        assert sb.changes(path="/logs").added == ("l",)


def test_the_cli_takes_writable(image: str, no_leaks: None) -> None:
    params = {"argv": ["sh", "-c", "echo hi > /testbed/x && cat /testbed/x /testbed/src/calc.py | head -2"]}
    done = run_cli("run", "exec", "--image", image, "--writable", "/testbed", "--writable-size", "16m",
                   "--params", json.dumps(params))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"]["stdout"] == "hi\ndef add(a, b):\n"
    bad = run_cli("run", "exec", "--image", image, "--writable", "/proc", "--params", json.dumps(params))
    assert bad.returncode == 2 and "/proc" in bad.stderr and "Traceback" not in bad.stderr


def test_the_worker_image_takes_writable_too(no_leaks: None) -> None:
    with Sandbox(writable=("/tmp",), writable_size="8m") as sb:
        assert _sh(sb, "echo w > /tmp/w && cat /tmp/w && id -u")["stdout"] == "w\n65532\n"
        assert sb.changes(path="/tmp").added == ("w",)


def test_async_sandbox_takes_writable(image: str, no_leaks: None) -> None:
    import asyncio

    from toolcage import AsyncSandbox

    async def go() -> tuple[str, tuple[str, ...]]:
        async with AsyncSandbox(image=image, writable="/testbed", writable_size="16m") as sb:
            res = await sb.call("exec", {"argv": ["sh", "-c", "echo a > /testbed/a.txt; echo done"]})
            return str(res.result["stdout"]), (await sb.changes(path="/testbed")).added  # type: ignore[index]

    started = time.monotonic()
    out, added = asyncio.run(go())
    assert out == "done\n" and added == ("a.txt",)
    assert time.monotonic() - started < 120
