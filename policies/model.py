"""The policy model: frozen stdlib dataclasses, constraints as annotated_types metadata.

Safe values are the defaults; every field is strict (``"yes"`` is not ``True``, ``"64"``
is not ``64``) and unknown keys are refused, so a typo cannot silently loosen a sandbox.
Validation: pydantic for files people write (policies.loader), :func:`policies.typed.build`
for the canonical JSON the worker receives (see policies.typed for why).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

from annotated_types import Ge, Gt, Le, MaxLen, MinLen

from policies.typed import SIZE, STRICT_CONFIG, to_dict

MiB = 1024**2
GiB = 1024**3
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Kernel-enforced resource limits for one run (cgroups, rlimits, tmpfs size)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_CONFIG

    memory: Annotated[int, SIZE, Ge(16 * MiB), Le(64 * GiB)] = 512 * MiB
    cpus: Annotated[float, Gt(0), Le(64)] = 1.0
    pids: Annotated[int, Ge(8), Le(32768)] = 64
    nofile: Annotated[int, Ge(16), Le(65536)] = 256
    scratch: Annotated[int, SIZE, Ge(1 * MiB), Le(16 * GiB)] = 64 * MiB
    output_cap: Annotated[int, SIZE, Ge(1024), Le(256 * MiB)] = 1 * MiB


@dataclass(frozen=True, kw_only=True)
class Timeouts:
    """Per-call timeout (enforced by the worker) and hard run deadline (by the runner)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_CONFIG

    call_s: Annotated[float, Gt(0), Le(24 * 3600)] = 30.0
    run_s: Annotated[float, Gt(0), Le(24 * 3600)] = 60.0


@dataclass(frozen=True, kw_only=True)
class NetworkPolicy:
    """Network access. Only ``none`` exists yet; allowlists arrive with the egress proxy."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_CONFIG

    mode: Literal["none"] = "none"


@dataclass(frozen=True, kw_only=True)
class Policy:
    """One sandbox policy. Immutable; hash it with :meth:`sha256`."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_CONFIG

    version: Literal[1] = 1
    name: Annotated[str, MinLen(1), MaxLen(64)] = "default"
    description: str = ""
    limits: Limits = field(default_factory=Limits)
    timeouts: Timeouts = field(default_factory=Timeouts)
    network: NetworkPolicy = field(default_factory=NetworkPolicy)

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError("name may contain only letters, digits, '_', '.' and '-'")

    def canonical_json(self) -> str:
        """The policy as sorted, compact JSON: the input of the hash and the worker's copy."""
        return json.dumps(to_dict(self), sort_keys=True, separators=(",", ":"))

    def sha256(self) -> str:
        """Stable content hash, recorded in container labels and the audit log."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def with_run_deadline(self, run_s: float) -> Policy:
        """A copy whose run deadline is ``run_s`` (callers only ever tighten it)."""
        return dataclasses.replace(self, timeouts=dataclasses.replace(self.timeouts, run_s=run_s))
