"""A user's own image as values: what the engine's inspect data says it expects (Env, WorkingDir, User,
Entrypoint, Cmd), read once by the runner and handed to the worker as data (``TOOLCAGE_IMAGE_CONFIG``).

Nothing here is trusted for the worker itself: the worker never runs the image's entrypoint, never
takes its environment for its own (every variable of the image is blanked in the container's Env, the
loader and Python variables among them: ``blanked_env``), and never runs as the image's USER. The
tools use these values for the image's own programs (``exec``, ``run_shell``, ``run_python``,
``run_node``): its PATH, its other variables, its WORKDIR as their default directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from toolcage.policies import contract

# set over any value the image gives them, for the worker's own process (Docker can override an image's
# variable, never unset it); the loader's and libc's first, each a way to run code in a process at start
WORKER_ENV = {
    "LD_PRELOAD": "",
    "LD_LIBRARY_PATH": "",
    "LD_AUDIT": "",
    "GLIBC_TUNABLES": "",
    "GCONV_PATH": "",
    "LOCPATH": "",
    "NLSPATH": "",
    "HOSTALIASES": "",
    "RES_OPTIONS": "",
    "LOCALDOMAIN": "",
    "TZDIR": "",
    "LC_ALL": "C",
    "LANG": "",
    "PYTHONPATH": "/opt/toolcage/lib",
    "PYTHONHOME": "",
    "PYTHONSTARTUP": "",
    "PYTHONUTF8": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PATH": "/opt/toolcage/rt/bin",
    "HOME": contract.SCRATCH,
}
# glibc's loader acts on these whatever their value, the empty one they are blanked to included: an image's
# ENV LD_SHOW_AUXV printed the auxiliary vector on the worker's stdout (the channel) before the worker ran,
# LD_TRACE_LOADED_OBJECTS listed its libraries there instead of starting it (tests/security/
# test_foreign_image_attacks.py). Docker cannot unset an image's variable: such an image is refused at once.
LOADER_ANY_VALUE = frozenset({"LD_SHOW_AUXV", "LD_TRACE_LOADED_OBJECTS", "LD_TRACE_PRELINKING", "LD_DYNAMIC_WEAK"})
MAX_ENV = 4096  # variables an image may declare that are read (more: refused, a hostile config)
MAX_CONFIG_BYTES = 256 * 1024  # the JSON handed to the worker (Docker's own Env is bounded by the kernel)


@dataclass(frozen=True)
class ImageConfig:
    """What a user's image expects, as its inspect data says (strings only; bounded)."""

    ref: str
    id: str
    env: tuple[tuple[str, str], ...] = ()
    workdir: str = ""
    user: str = ""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()

    def as_json(self) -> str:
        return json.dumps(
            {
                "ref": self.ref,
                "id": self.id,
                "env": [list(kv) for kv in self.env],
                "workdir": self.workdir,
                "user": self.user,
                "entrypoint": list(self.entrypoint),
                "cmd": list(self.cmd),
            },
            separators=(",", ":"),
        )

    def blanked_env(self) -> dict[str, str]:
        """The container's Env for the worker: every variable of the image blanked (the worker drops them at
        start, ``worker.image``), then the worker's own values, then the config itself."""
        env = {k: "" for k, _ in self.env}
        env.update(WORKER_ENV)
        env[contract.ENV_IMAGE_CONFIG] = self.as_json()
        return env


class BadImageConfig(ValueError):
    """The image's config is not one a runner reads (too many variables, too large)."""


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def from_inspect(ref: str, info: dict[str, Any]) -> ImageConfig:
    """The config of an image, from ``engine.image(ref)``; refuses a config too large to hand over."""
    cfg = info.get("Config") or {}
    raw_env = cfg.get("Env") or []
    if not isinstance(raw_env, list) or len(raw_env) > MAX_ENV:
        raise BadImageConfig(f"image {ref}: its config declares more than {MAX_ENV} environment variables")
    env = []
    for item in raw_env:
        key, sep, value = str(item).partition("=")
        if sep and key and "\0" not in item:
            env.append((key, value))
        if key in LOADER_ANY_VALUE:
            raise BadImageConfig(
                f"image {ref}: its ENV sets {key}, which would act on toolcage's worker whatever its value: "
                "remove it from the image"
            )
    out = ImageConfig(
        ref=ref,
        id=str(info.get("Id") or ""),
        env=tuple(env),
        workdir=str(cfg.get("WorkingDir") or ""),
        user=str(cfg.get("User") or ""),
        entrypoint=_strings(cfg.get("Entrypoint")),
        cmd=_strings(cfg.get("Cmd")),
    )
    if len(out.as_json().encode()) > MAX_CONFIG_BYTES:
        raise BadImageConfig(f"image {ref}: its config is over {MAX_CONFIG_BYTES // 1024} KiB")
    return out


__all__ = ["LOADER_ANY_VALUE", "WORKER_ENV", "BadImageConfig", "ImageConfig", "from_inspect"]
