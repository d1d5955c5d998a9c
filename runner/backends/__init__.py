"""Where a worker runs: the one seam between a run and a container engine or a local process.

``base`` is the seam (``Backend``, ``BackendOptions``, ``ExitStatus``); each kind is a module with one
class (``container``: runc, ``gvisor``: runsc, ``process``: ``--sandbox none``) and an entry in
``BACKENDS`` below. The class carries its kind's facts (``strength``, ``in_container``, ``auto``,
``how_to_use``, ``unavailable(engine)``), so nothing here or above compares a kind with its name: adding a backend is
one module plus one registry entry. ``egress`` is the container kinds' egress proxy.
"""

from __future__ import annotations

import os

from toolcage.backends.base import Backend, BackendClass, BackendOptions, ExitStatus
from toolcage.backends.container import ContainerBackend
from toolcage.backends.gvisor import GVisorBackend
from toolcage.backends.process import ProcessBackend
from toolcage.engine.api import EngineAPI
from toolcage.errors import UsageError
from toolcage.policies import Policy, contract

# the registry: a kind's name (``--sandbox``, ``$TOOLCAGE_SANDBOX``, a policy's ``isolation``) -> its class
BACKENDS: dict[str, BackendClass] = {"container": ContainerBackend, "gvisor": GVisorBackend, "none": ProcessBackend}
AUTO = "auto"  # the strongest kind the engine has (never one with auto = False)


def strength(kind: str) -> int:
    """How strong a wall the kind is (``isolation`` in a policy is a minimum; ``auto`` takes the strongest)."""
    return BACKENDS[kind].strength


def in_container(kind: str) -> bool:
    """Does this kind run the worker in a container (mounts, a sandbox user), or as a local process?"""
    return BACKENDS[kind].in_container


def available_kinds(engine: EngineAPI | None = None) -> list[str]:
    """The kinds ``auto`` may pick on this engine, strongest first (never ``none``): ``gvisor`` when the
    engine has the ``runsc`` runtime registered, then ``container``."""
    if engine is None:
        from toolcage.engine.docker_adapter import Engine

        engine = Engine.default()
    ranked = sorted((k for k, cls in BACKENDS.items() if cls.auto), key=strength, reverse=True)
    return [k for k in ranked if BACKENDS[k].unavailable(engine) is None]


def default_kind(kind: str | None) -> str:
    """``--sandbox`` when given, else ``$TOOLCAGE_SANDBOX``, else ``container``."""
    return kind or os.environ.get(contract.ENV_SANDBOX) or "container"


def resolve_kind(kind: str, policy: Policy, engine: EngineAPI | None = None) -> str:
    """``--sandbox`` as given (``auto``: the strongest available), checked against the policy's
    ``isolation`` minimum; UsageError with the fix otherwise."""
    if kind not in BACKENDS and kind != AUTO:
        raise UsageError(f"unknown sandbox kind {kind!r}: use one of {', '.join(map(repr, [*BACKENDS, AUTO]))}")
    if kind == AUTO:
        kind = available_kinds(engine)[0]
    else:
        problem = BACKENDS[kind].unavailable(engine)  # (only a kind that needs more than an engine asks it)
        if problem:
            raise UsageError(problem)
    need = policy.isolation
    if need is not None and strength(kind) < strength(need):
        hint = BACKENDS[need].how_to_use
        raise UsageError(f"policy {policy.name!r} requires isolation {need!r}; this run would use {kind!r}: {hint}")
    return kind


def make_backend(kind: str, policy: Policy, options: BackendOptions) -> Backend:
    """The backend named ``kind`` (``--sandbox``, resolved)."""
    factory = BACKENDS.get(kind)
    if factory is None:
        raise UsageError(f"unknown sandbox kind {kind!r}: use one of {', '.join(map(repr, BACKENDS))}")
    return factory(policy, options)


__all__ = [
    "AUTO",
    "BACKENDS",
    "Backend",
    "BackendOptions",
    "ExitStatus",
    "available_kinds",
    "default_kind",
    "in_container",
    "make_backend",
    "resolve_kind",
    "strength",
]
