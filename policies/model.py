"""The policy model: frozen stdlib dataclasses, constraints as annotated_types metadata.

Safe values are the defaults; every field is strict (``"yes"`` is not ``True``, ``"64"``
is not ``64``) and unknown keys are refused, so a typo cannot silently loosen a sandbox.
Validation: pydantic for files people write (policies.loader), :func:`policies.typed.build`
for the canonical JSON the worker receives (see policies.typed for why).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

from annotated_types import Ge, Gt, Le, MaxLen, MinLen

from toolcage.policies.errors import PolicyError
from toolcage.policies.secrets import SecretSpec, check_secret_names
from toolcage.policies.typed import SIZE, STRICT_CONFIG, BuildError, build, to_dict

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
    # the writable copy of the workspace (workspace_mode copy): a tmpfs of this size at /workspace. Like
    # scratch, its pages count against ``memory``: the copy and what the code writes there share it.
    workspace_copy: Annotated[int, SIZE, Ge(1 * MiB), Le(16 * GiB)] = 256 * MiB
    output_cap: Annotated[int, SIZE, Ge(1024), Le(256 * MiB)] = 1 * MiB
    # calls that run code (run_python, run_shell, connectors) in flight at once on one sandbox; they
    # share its memory, CPU and pids limits. More wait, in order, for one to end.
    concurrency: Annotated[int, Ge(1), Le(64)] = 4


@dataclass(frozen=True, kw_only=True)
class Timeouts:
    """Per-call timeout (enforced by the worker); hard run deadline and idle timeout (by the runner).

    ``idle_s`` ends a run in which no call has been in progress for that long, so a long
    session (a large ``run_s``) that its client forgot still ends early."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_CONFIG

    call_s: Annotated[float, Gt(0), Le(24 * 3600)] = 30.0
    run_s: Annotated[float, Gt(0), Le(24 * 3600)] = 60.0
    idle_s: Annotated[float, Gt(0), Le(24 * 3600)] = 60.0


DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, kw_only=True)
class AllowRule:
    """One allowlist entry: a host (exact, or ``*.`` for subdomains) and what may be sent to it."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_CONFIG

    host: Annotated[str, MinLen(1), MaxLen(253)]
    schemes: tuple[Literal["http", "https"], ...] = ("https",)
    ports: tuple[Annotated[int, Ge(1), Le(65535)], ...] = ()  # empty: each scheme's default port
    methods: tuple[Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"], ...] = ()  # empty: all

    def __post_init__(self) -> None:
        from toolcage.policies.names import validate_glob

        object.__setattr__(self, "host", validate_glob(self.host))  # compare normal forms only
        if not self.schemes:
            raise ValueError(f"host {self.host!r}: schemes must not be empty")

    def allowed_ports(self, scheme: str) -> tuple[int, ...]:
        return self.ports or (DEFAULT_PORTS[scheme],)


@dataclass(frozen=True, kw_only=True)
class NetworkPolicy:
    """Network access: ``none`` (no interface but lo) or ``proxy`` (only through the egress proxy,
    only to the allowlist). ``allow_private_cidrs`` deliberately opens private ranges."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_CONFIG

    mode: Literal["none", "proxy"] = "none"
    allow: tuple[AllowRule, ...] = ()
    allow_private_cidrs: tuple[str, ...] = ()
    # Loosens: what the allowlist would refuse is let through and recorded as ``would_deny`` (to learn a policy);
    # the floor (private, loopback, link-local and metadata addresses, DNS pinning) still refuses. Permitted on a
    # host only with TOOLCAGE_EGRESS_AUDIT_ONLY=allow (``toolcage doctor`` says when it is)
    unsafe_audit_only: bool = False

    def __post_init__(self) -> None:
        if self.mode == "none" and (self.allow or self.allow_private_cidrs or self.unsafe_audit_only):
            raise ValueError("mode 'none' cannot enforce an allowlist: set mode: proxy, or remove allow")
        if self.allow_private_cidrs:
            self._check_cidrs()

    def _check_cidrs(self) -> None:
        import ipaddress  # only for a policy that names networks: the worker's first call parses every policy

        for cidr in self.allow_private_cidrs:
            try:
                net = ipaddress.ip_network(cidr, strict=True)
            except ValueError as exc:
                raise ValueError(f"allow_private_cidrs: {cidr!r} is not a network ({exc})") from None
            if net.prefixlen == 0:
                raise ValueError(f"allow_private_cidrs: {cidr!r} would open every address")

    def allows_origin(self, scheme: str, host: str, port: int) -> bool:
        """Whether some allow rule lets requests go to this exact origin (a normalised host)."""
        from toolcage.policies.names import host_matches

        return any(
            host_matches(host, r.host) and scheme in r.schemes and port in r.allowed_ports(scheme) for r in self.allow
        )

    def private_networks(self) -> tuple[Any, ...]:
        import ipaddress

        return tuple(ipaddress.ip_network(c) for c in self.allow_private_cidrs)


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
    # Loosens isolation: processes a call starts in the background live on until the run ends
    # (by default every process but the worker is killed when a call ends). The protocol stream
    # stays out of their reach either way.
    unsafe_background_processes: bool = False
    # the weakest sandbox this policy may run in, if any: "container" (runc, the host's kernel) or
    # "gvisor" (runsc, gVisor's user-space kernel in between); a weaker one is refused before it starts
    isolation: Literal["container", "gvisor"] | None = None
    # Named secrets and the one origin each may be sent to (values come with the run, never here)
    secrets: dict[str, SecretSpec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError("name may contain only letters, digits, '_', '.' and '-'")
        check_secret_names(self.secrets)
        for name, spec in self.secrets.items():
            to = spec.send_to
            if not self.network.allows_origin(to.scheme, to.host, to.effective_port):
                raise ValueError(
                    f"secret {name} is bound to {to.origin()}, which network.allow does not allow: "
                    "a secret may only be sent where the policy lets requests go"
                )

    def canonical_json(self) -> str:
        """The policy as sorted, compact JSON: the input of the hash and the worker's copy. Made once per
        policy object (it is frozen; ``with_run_deadline`` makes a new one): a pooled run's adoption
        asked for it twice, ~0.25 ms each."""
        made = self.__dict__.get("_canonical_json")
        if made is None:
            made = json.dumps(to_dict(self), sort_keys=True, separators=(",", ":"))
            object.__setattr__(self, "_canonical_json", made)
        return str(made)

    def sha256(self) -> str:
        """Stable content hash, recorded in container labels and the audit log."""
        import hashlib  # here: the worker parses a policy on its first call and never hashes one (OpenSSL's load)

        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def with_run_deadline(self, run_s: float) -> Policy:
        """A copy whose run deadline is ``run_s`` (callers only ever tighten it)."""
        return dataclasses.replace(self, timeouts=dataclasses.replace(self.timeouts, run_s=run_s))


def policy_from_json(text: str) -> Policy:
    """Rebuild a policy from its canonical JSON (how the worker receives it), without pydantic. Here, not in
    the loader: the worker's first call parses its policy, and the loader's pathlib and YAML are the host's."""
    try:
        return build(Policy, json.loads(text))  # type: ignore[no-any-return]
    except BuildError as exc:
        raise PolicyError(f"invalid policy (from JSON): {exc}") from None
    except ValueError as exc:
        raise PolicyError(f"policy JSON is malformed: {exc}") from None
