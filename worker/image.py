"""A user's own image, from the worker's side (issue 36): what its programs run with.

The runner hands the image's config over as data (``TOOLCAGE_IMAGE_CONFIG``: its Env, WorkingDir, User,
Entrypoint, Cmd) and blanks every variable of the image in the container's Env, so that none of them
(``LD_PRELOAD``, ``PYTHONSTARTUP``, ...) acts on the worker's own interpreter, which runs from the
runtime mount (``/opt/toolcage/rt``). :func:`scrub` drops the blanked names from the worker's environment
at start. The tools then run the image's programs with the image's environment (:meth:`Image.program_env`):
its PATH, HOME and other variables, its WORKDIR as their default directory, as the sandbox user.

Trusted from the image: nothing the worker executes or maps. The values here are data for the image's
own programs, which are tool code like any other (the same cage).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from toolcage.policies import contract

RT = "/opt/toolcage/rt"
DOCKER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # what Docker gives an image without PATH


@dataclass(frozen=True)
class Image:
    ref: str = ""
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""
    user: str = ""

    @property
    def path(self) -> str:
        return self.env.get("PATH") or DOCKER_PATH

    def which(self, *names: str) -> str | None:
        """The first of ``names`` found as an executable file on the image's PATH (never in the runtime)."""
        for name in names:
            for d in self.path.split(os.pathsep):
                if not d.startswith("/") or d == RT or d.startswith(RT + "/"):
                    continue
                p = os.path.join(d, name)
                try:
                    if os.path.isfile(p) and os.access(p, os.X_OK):
                        return p
                except (OSError, ValueError):
                    continue
        return None

    def program_env(self, environ: Mapping[str, str], keep: tuple[str, ...], scratch: str) -> dict[str, str]:
        """What the image's own programs run with (a tool's child, a wrapped MCP server): the image's ENV and
        PATH, the names in ``keep`` from ``environ`` (the egress proxy's settings), scratch for HOME and TMPDIR
        where the image names none. None of the worker's own variables."""
        env = dict(self.env)
        env.update({k: v for k, v in environ.items() if k in keep})
        env["PATH"] = self.path
        env.setdefault("HOME", scratch)
        env.setdefault("TMPDIR", scratch)
        env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
        return env

    def default_dir(self, scratch: str) -> str:
        """Where the image's programs start unless a call says: its WORKDIR if that is a directory, else scratch."""
        w = self.workdir
        return w if w.startswith("/") and w != "/" and os.path.isdir(w) else scratch


def from_env() -> Image | None:
    raw = os.environ.get(contract.ENV_IMAGE_CONFIG)
    if not raw:
        return None
    try:
        cfg = json.loads(raw)
        env = {str(k): str(v) for k, v in cfg.get("env", [])}
        return Image(
            ref=str(cfg.get("ref", "")), env=env, workdir=str(cfg.get("workdir", "")), user=str(cfg.get("user", ""))
        )
    except (ValueError, TypeError, AttributeError):
        return Image()  # the runner wrote it: a bad one is a bug there; the image's programs then get no ENV


def worker_env(environ: Mapping[str, str], keep: tuple[str, ...], scratch: str) -> dict[str, str]:
    """What the worker's own children start with in a user's own image (a connector's handler, the namespace
    launcher: the runtime's interpreter): the worker's environment, never the image's (its LD_PRELOAD would
    load in them)."""
    env = {k: v for k, v in environ.items() if k in keep}
    env.update(
        PATH=environ.get("PATH", f"{RT}/bin"),
        HOME=scratch,
        TMPDIR=scratch,
        LC_ALL="C",
        PYTHONUTF8="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


def scrub() -> None:
    """Drop what the runner blanked (the image's variables) from the worker's own environment."""
    for key in [k for k, v in os.environ.items() if v == ""]:
        del os.environ[key]


__all__ = ["Image", "from_env", "scrub", "worker_env"]
