"""Secret bindings: the only place each named secret may be sent (the policy's ``secrets:``).

The policy names secrets and binds each to one origin and one header; it never holds a
value. Values reach the worker over the protocol after start and are added by SafeFetch,
only to requests the policy allows to the bound origin (see worker.secrets).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from annotated_types import Ge, Le, MaxLen, MinLen

from toolcage.policies.typed import STRICT_CONFIG

SECRET_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_HEADER_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
# framing, routing and proxy headers belong to SafeFetch and the proxy, never to a secret
_RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "te", "upgrade", "trailer", "keep-alive"}
)


@dataclass(frozen=True, kw_only=True)
class SendTo:
    """The one origin (scheme, exact host, port) and header a secret is sent to, and how it is written."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_CONFIG

    host: Annotated[str, MinLen(1), MaxLen(253)]
    scheme: Literal["http", "https"] = "https"
    port: Annotated[int, Ge(1), Le(65535)] | None = None  # None: the scheme's default port
    header: Annotated[str, MinLen(1), MaxLen(64)] = "Authorization"
    format: Annotated[str, MaxLen(256)] = "Bearer {value}"

    def __post_init__(self) -> None:
        from toolcage.policies.names import ip_literal, validate_glob

        if "*" in self.host:
            raise ValueError(f"send_to.host {self.host!r}: a secret is bound to one exact host, not a wildcard")
        literal = ip_literal(self.host)
        object.__setattr__(self, "host", str(literal) if literal is not None else validate_glob(self.host))
        lower = self.header.lower()
        if not _HEADER_RE.match(self.header) or lower in _RESERVED_HEADERS or lower.startswith("proxy-"):
            raise ValueError(f"send_to.header {self.header!r} cannot carry a secret")
        rest = self.format.replace("{value}", "", 1)
        if "{value}" not in self.format or "{" in rest or "}" in rest:
            raise ValueError("send_to.format must contain {value} exactly once and no other braces")
        if any(c in self.format for c in "\r\n\x00"):
            raise ValueError("send_to.format must not contain CR, LF or NUL")

    @property
    def effective_port(self) -> int:
        return self.port or {"http": 80, "https": 443}[self.scheme]

    def origin(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.effective_port}"


@dataclass(frozen=True, kw_only=True)
class SecretSpec:
    """One named secret: where it may be sent. ``unsafe_expose_to_handler`` lets a connector's
    handler read the value itself (for an SDK that must hold the token): it then can leak it."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_CONFIG

    send_to: SendTo
    unsafe_expose_to_handler: bool = False


def check_secret_names(secrets: dict[str, SecretSpec]) -> None:
    for name in secrets:
        if not SECRET_NAME_RE.match(name):
            raise ValueError(f"secret name {name!r}: use letters, digits and '_' (like an environment variable)")
