"""The run's secret values, held by the worker only: injected by SafeFetch, redacted from everything.

Threat: a handler (or any code in the sandbox) that wants a connector's API key. Values
arrive once, over the protocol (``sandbox.configure``), and live in this process only:
the worker is non-dumpable, so no other process can read its memory, environment or fds;
handler children are fresh interpreters (fork + exec) that never had a copy. A value is
written into one header of a request that the policy allows to the secret's bound origin,
and replaced by ``[secret NAME]`` in every answer, log line and fetch response a handler
receives. What the bound host itself does with the value is outside the sandbox.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from toolcage.worker.errors import BadParams, EgressDenied

if TYPE_CHECKING:  # annotations only: the worker redacts every answer, and must not load the model for it
    from toolcage.policies.decide import Target
    from toolcage.policies.secrets import SecretSpec
    from toolcage.worker.redaction import Redactor

MIN_SECRET_LEN = 8  # shorter values would redact ordinary text; refused before the run starts
# Threat: a value no header can carry (a trailing newline from a file or an env var) made http.client
# raise "Invalid header value b'Bearer <value>\n'", and that message reached the handler unredacted.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class SecretStore:
    """Name -> value, with the policy's binding for each."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}
        self._specs: dict[str, SecretSpec] = {}
        self._redactor: Redactor | None = None  # made with the values (a run without secrets never loads it)

    def __bool__(self) -> bool:
        return bool(self._values)

    def names(self) -> list[str]:
        return sorted(self._values)

    def wire(self) -> dict[str, str]:
        """The values, for ``sandbox.configure`` only (the runner's side of the one channel they cross)."""
        return dict(self._values)

    def load(self, values: Any, specs: dict[str, SecretSpec]) -> None:
        """Take the run's values (once). Every name must be bound by the policy, and every bound name given."""
        if self._values:
            raise BadParams("secrets were already given for this run")
        if not isinstance(values, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in values.items()
        ):
            raise BadParams("secrets must be an object of names to string values")
        unknown = sorted(set(values) - set(specs))
        missing = sorted(set(specs) - set(values))
        if unknown or missing:
            raise BadParams("secrets do not match the policy", {"not_in_policy": unknown, "missing": missing})
        self._take(values, specs)

    @classmethod
    def unbound(cls, values: dict[str, str]) -> SecretStore:
        """Values bound to no host, held only to be redacted: ``toolcage mcp wrap`` hands them to the
        wrapped server's environment. The same checks on the values as :meth:`load`."""
        store = cls()
        store._take(dict(values), {})
        return store

    def _take(self, values: dict[str, str], specs: dict[str, SecretSpec]) -> None:
        short = sorted(k for k, v in values.items() if len(v) < MIN_SECRET_LEN)
        if short:
            raise BadParams(f"secret values must be at least {MIN_SECRET_LEN} characters", {"secrets": short})
        controls = sorted(k for k, v in values.items() if _CONTROL.search(v))
        if controls:
            raise BadParams(
                "secret values must not contain control characters (a trailing newline?): no header can carry them",
                {"secrets": controls},
            )
        self._values = dict(values)
        self._specs = dict(specs)
        from toolcage.worker.redaction import Redactor

        self._redactor = Redactor(self._values)

    # sending --------------------------------------------------------------------------------
    def _spec(self, name: str) -> SecretSpec:
        spec = self._specs.get(name)
        if spec is None or name not in self._values:
            raise EgressDenied(f"no secret named {name} in this run", {"secret": name, "reason": "unknown_secret"})
        return spec

    def header_for(self, name: str, target: Target) -> tuple[str, str]:
        """The (header, value) to add for a request to ``target``; EgressDenied if the secret is
        unknown or bound elsewhere (the caller checked the policy allows the request)."""
        to = self._spec(name).send_to
        if (target.scheme, target.host, target.port) != (to.scheme, to.host, to.effective_port):
            where = f"{target.scheme}://{target.host}:{target.port}"
            raise EgressDenied(
                f"secret {name} is bound to {to.origin()}, not to {where}",
                {"secret": name, "reason": "secret_not_bound", "bound_to": to.origin(), "url_origin": where},
            )
        return to.header, to.format.replace("{value}", self._values[name])

    def exposed(self, name: str) -> str:
        """The value itself, only for a secret the policy marks ``unsafe_expose_to_handler``."""
        if not self._spec(name).unsafe_expose_to_handler:
            raise EgressDenied(
                f"secret {name} is not exposed to handlers (the policy would have to set unsafe_expose_to_handler)",
                {"secret": name, "reason": "secret_not_exposed"},
            )
        return self._values[name]

    # redaction --------------------------------------------------------------------------------
    def binds(self, target: Target) -> bool:
        """Whether a secret of this run is bound to ``target``'s origin (its transport is SafeFetch's there)."""
        return any(
            (target.scheme, target.host, target.port) == (s.send_to.scheme, s.send_to.host, s.send_to.effective_port)
            for s in self._specs.values()
        )

    @property
    def redaction(self) -> object:
        """What redacts now (None: nothing): a new object whenever the values change, so an answer redacted
        once may be kept while this is the same object."""
        return self._redactor

    @property
    def lookahead(self) -> int:
        """Bytes past a cut that :meth:`cut_bytes` needs to see a value starting before it whole."""
        return self._redactor.lookahead if self._redactor is not None else 0

    def redact_text(self, text: str) -> str:
        return self._redactor.text(text) if self._redactor is not None else text

    def clip(self, text: str, limit: int, *, tail: bool = False) -> str:
        """``text`` redacted, then cut to its first (or last) ``limit`` characters. In this order: a cut
        through a value leaves a part that no longer matches, and would be shown as it is."""
        text = self.redact_text(text)
        return text[-limit:] if tail else text[:limit]

    def redact_bytes(self, data: bytes) -> bytes:
        return self._redactor.data(data) if self._redactor is not None else data

    def cut_bytes(self, data: bytes, limit: int) -> bytes:
        """``data[:limit]`` redacted, a value that starts before ``limit`` removed whole (``data`` holds
        :attr:`lookahead` bytes past ``limit``, or all there is)."""
        return self._redactor.cut(data, limit) if self._redactor is not None else data[:limit]

    def redact(self, obj: Any) -> Any:
        """Every string in a JSON-like value (keys too), with each secret's value replaced."""
        if not self._redactor:  # None, or no values
            return obj
        if isinstance(obj, str):
            return self.redact_text(obj)
        if isinstance(obj, dict):
            return {self.redact_text(k) if isinstance(k, str) else k: self.redact(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self.redact(v) for v in obj]
        return obj


STORE = SecretStore()  # the worker's one store (a worker serves one run)
