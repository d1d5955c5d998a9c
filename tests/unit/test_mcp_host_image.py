"""mcp wrap's launcher in a user's own image (issue 36): the server's environment is the image's, the namespace
launcher's is the worker's; no Docker."""

from __future__ import annotations

from toolcage.worker import mcp_host
from toolcage.worker.image import Image

IMAGE = Image(
    ref="mine:1",
    env={"PATH": "/srv/bin:/usr/bin:/bin", "MYVAR": "x", "LD_PRELOAD": "/evil.so", "LANG": "de_DE.UTF-8"},
    workdir="/srv/app",
)
WORKER = {
    "PATH": "/opt/toolcage/rt/bin",
    "PYTHONPATH": "/opt/toolcage/lib",
    "TOOLCAGE_POLICY": "{}",
    "TOOLCAGE_IMAGE_CONFIG": "{}",
    "HTTP_PROXY": "http://127.0.0.1:3128",
    "LC_ALL": "C",
}


def test_the_server_gets_the_images_env_and_path_the_proxy_and_the_secrets() -> None:
    """The image's ENV (its own LD_PRELOAD too: the server is the image's program, in the cage) with its PATH,
    the proxy's settings, HOME/TMPDIR in scratch where the image names none, the secrets last; nothing of the
    worker's own (its PATH, PYTHONPATH, policy, locale)."""
    env = mcp_host.image_server_env(IMAGE, {"API_KEY": "secret-value", "MYVAR": "from-secret"}, WORKER)
    assert env["PATH"] == "/srv/bin:/usr/bin:/bin" and env["LD_PRELOAD"] == "/evil.so" and env["LANG"] == "de_DE.UTF-8"
    assert env["HTTP_PROXY"] == "http://127.0.0.1:3128" and env["HOME"] == env["TMPDIR"] == "/scratch"
    assert env["API_KEY"] == "secret-value" and env["MYVAR"] == "from-secret"
    assert not any(k.startswith("TOOLCAGE_") for k in env) and "PYTHONPATH" not in env and "LC_ALL" not in env


def test_an_image_without_path_gets_dockers_default() -> None:
    """No PATH in the image's ENV: the one Docker gives such an image."""
    env = mcp_host.image_server_env(Image(env={"HOME": "/root"}), {}, {})
    assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" and env["HOME"] == "/root"


def test_the_namespace_launcher_starts_with_the_workers_env_not_the_images() -> None:
    """Under gVisor nsinit (the runtime's interpreter) runs first: none of the image's variables reach it."""
    env = mcp_host._launcher_env(WORKER)
    assert env["PATH"] == "/opt/toolcage/rt/bin" and env["LC_ALL"] == "C" and env["HOME"] == "/scratch"
    assert "LD_PRELOAD" not in env and "MYVAR" not in env and env["HTTP_PROXY"] == "http://127.0.0.1:3128"
