"""The shared kernel of both sides: the one policy model (load, validate, hash, decide) and what the
runner, the worker and the egress proxy must agree on (``contract``, ``codes``, the error root in
``errors``, ``gitignore``, ``typed``).

Imports neither `runner` nor `worker`: both depend on it, never the other way round.
The names below load on first use (PEP 562): the worker imports ``policies.codes`` on its
start-up path, which must not pay for the model and the YAML loader.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolcage.policies.errors import PolicyError
    from toolcage.policies.loader import (
        PolicySource,
        bundled_policy_names,
        load_policy,
        validate_policy,
    )
    from toolcage.policies.model import Limits, NetworkPolicy, Policy, Timeouts, policy_from_json
    from toolcage.policies.typed import parse_size

_WHERE = {
    "PolicyError": "errors",
    "PolicySource": "loader",
    "bundled_policy_names": "loader",
    "load_policy": "loader",
    "policy_from_json": "model",
    "validate_policy": "loader",
    "Limits": "model",
    "NetworkPolicy": "model",
    "Policy": "model",
    "Timeouts": "model",
    "parse_size": "typed",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "Limits",
    "NetworkPolicy",
    "Policy",
    "PolicyError",
    "PolicySource",
    "Timeouts",
    "bundled_policy_names",
    "load_policy",
    "parse_size",
    "policy_from_json",
    "validate_policy",
]
