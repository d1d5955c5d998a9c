"""The frozen, validated policy model and its stable sha256.

Safe values are the defaults; every field is strict (``"yes"`` is not ``True``,
``"64"`` is not ``64``) and unknown keys are refused, so a typo cannot silently
loosen a sandbox.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(value: Any) -> int:
    """Turn ``512m``, ``64MiB``, ``1g`` or a plain int into bytes (binary units)."""
    if isinstance(value, bool):
        raise ValueError("a size must be a number of bytes or a string like '64m'")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise ValueError(f"not a size: {value!r} (use bytes or a string like '64m', '1g')")


Size = Annotated[int, BeforeValidator(parse_size)]

_STRICT = ConfigDict(frozen=True, extra="forbid", strict=True)


class Limits(BaseModel):
    """Kernel-enforced resource limits for one run (cgroups, rlimits, tmpfs size)."""

    model_config = _STRICT

    memory: Size = Field(default=512 * 1024**2, ge=16 * 1024**2, le=64 * 1024**3)
    cpus: float = Field(default=1.0, gt=0, le=64)
    pids: int = Field(default=64, ge=8, le=32768)
    nofile: int = Field(default=256, ge=16, le=65536)
    scratch: Size = Field(default=64 * 1024**2, ge=1024**2, le=16 * 1024**3)
    output_cap: Size = Field(default=1024**2, ge=1024, le=256 * 1024**2)


class Timeouts(BaseModel):
    """Per-call timeout (enforced by the worker) and hard run deadline (by the runner)."""

    model_config = _STRICT

    call_s: float = Field(default=30.0, gt=0, le=24 * 3600)
    run_s: float = Field(default=60.0, gt=0, le=24 * 3600)


class NetworkPolicy(BaseModel):
    """Network access. Only ``none`` exists yet; allowlists arrive with the egress proxy."""

    model_config = _STRICT

    mode: Literal["none"] = "none"


class Policy(BaseModel):
    """One sandbox policy. Immutable; hash it with :meth:`sha256`."""

    model_config = _STRICT

    version: Literal[1] = 1
    name: str = Field(default="default", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    limits: Limits = Limits()
    timeouts: Timeouts = Timeouts()
    network: NetworkPolicy = NetworkPolicy()

    def canonical_json(self) -> str:
        """The policy as sorted, compact JSON: the input of the hash and the worker's copy."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def sha256(self) -> str:
        """Stable content hash, recorded in container labels and the audit log."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()
