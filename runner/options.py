"""A run's options, resolved once: what ``Sandbox``, ``Pool``, ``McpWrap`` and the CLI all take.

Each door used to resolve the same keyword options on its own (the policy, the kind, the image
from ``$TOOLCAGE_IMAGE`` with three fallbacks, the audit triad, the egress proxy, the CA file).
``RunOptions.resolve`` does it here, before anything starts, and the result is a frozen value
every run of the door shares; ``backend_options`` is what the backend is made from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolcage.errors import PolicyError, UsageError
from toolcage.policies import contract

if TYPE_CHECKING:
    from collections.abc import Iterable

    from toolcage.connectors import ToolSource
    from toolcage.engine.api import EngineAPI
    from toolcage.lifecycle.audit import Audit
    from toolcage.policies import Policy, PolicySource


def _default_image() -> str:
    from toolcage import __version__

    return f"toolcage-worker:{__version__}"


DEFAULT_IMAGE = _default_image()  # the image this version builds (`toolcage image build`)
# "ro": the workspace is mounted read-only at /workspace (the default); "copy": /workspace is a writable copy
WORKSPACE_MODES = ("ro", "copy")


def worker_image(image: str | None = None) -> str:
    """The worker image a run uses: ``image`` when given, else ``$TOOLCAGE_IMAGE``, else :data:`DEFAULT_IMAGE`.
    The one place that variable is read (the egress proxy, precheck and ``mcp wrap`` ask here too)."""
    return image or os.environ.get(contract.ENV_IMAGE) or DEFAULT_IMAGE


def resolve_policy(policy: PolicySource, run_timeout: float | None = None) -> Policy:
    """The run's policy: a bundled name, a file, a mapping or a Policy (checked against the model);
    ``run_timeout`` may only tighten its run_s."""
    from toolcage.policies import load_policy

    p = _audit_only_checked(load_policy(policy), "the run's policy")
    if run_timeout is not None:
        if run_timeout <= 0:
            raise UsageError("--timeout must be a positive number of seconds")
        # A caller may tighten the deadline, never loosen the policy's.
        run_s = min(run_timeout, p.timeouts.run_s)
        p = p.with_run_deadline(run_s)
    return p


def audit_only_permitted() -> bool:
    """Whether this host lets a policy's egress be audit-only (``network.unsafe_audit_only``): only when the
    operator set TOOLCAGE_EGRESS_AUDIT_ONLY=allow (``toolcage doctor`` says when it is)."""
    return os.environ.get(contract.ENV_EGRESS_AUDIT_ONLY, "") == "allow"


def _audit_only_checked(p: Policy, what: str) -> Policy:
    if p.network.unsafe_audit_only and not audit_only_permitted():
        raise PolicyError(
            f"{what} asks for audit-only egress (network.unsafe_audit_only: what the allowlist would refuse is let "
            f"through and recorded), which this host does not permit: the operator sets "
            f"{contract.ENV_EGRESS_AUDIT_ONLY}=allow to permit it"
        )
    return p


def network_policy(current: Policy, network: Any) -> Policy:
    """The run's policy with ``network`` (a policy's ``network:`` section as a mapping, or a NetworkPolicy) in
    place of its own, checked as a policy at start is (the model, the secrets' origins) and against the egress
    floor for a live change (policies.decide.change_problem); PolicyError says why not."""
    import json

    from toolcage.policies import NetworkPolicy, validate_policy
    from toolcage.policies.decide import change_problem
    from toolcage.policies.typed import to_dict

    if isinstance(network, NetworkPolicy):
        data: Any = to_dict(network)
    elif isinstance(network, Mapping):
        data = dict(network)
    else:
        raise PolicyError(
            'a network change is a policy\'s network section: a mapping such as {"mode": "proxy", "allow": '
            f'[{{"host": "example.com"}}]}} or {{"mode": "none"}}, not {type(network).__name__}'
        )
    base = json.loads(current.canonical_json())
    base["network"] = data
    new = validate_policy(base, "(network change)")
    problem = change_problem(current, new.network)
    if problem is not None:
        raise PolicyError(f"network change refused: {problem}")
    return _audit_only_checked(new, "the network change")


def requester(door: str) -> str:
    """Who asks for a change, as the audit log records it: the door and the local user."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid {os.getuid()}"
    return f"{door}:{user}"


def resolve_audit(audit: Any) -> Audit | None:
    """None -> the default log ($TOOLCAGE_AUDIT_LOG or ~/.local/state/toolcage/audit.jsonl), a path ->
    that log, an Audit -> it, False -> no audit log."""
    from toolcage.lifecycle import audit as audit_mod

    if audit is False:
        return None
    return audit if isinstance(audit, audit_mod.Audit) else audit_mod.shared(audit)


def read_ca(ca_file: str | os.PathLike[str] | None) -> str | None:
    """An extra CA bundle SafeFetch trusts (corporate TLS inspection, test CAs)."""
    if ca_file is None:
        return None
    try:
        pem = Path(ca_file).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read CA file {ca_file}: {exc}") from None
    if "-----BEGIN CERTIFICATE-----" not in pem:
        raise UsageError(f"CA file {ca_file} holds no PEM certificate")
    return pem


@dataclass(frozen=True)
class RunOptions:
    """Everything a run is made from except its secrets (those belong to the one run) and its id."""

    policy: Policy
    kind: str  # the backend: container, gvisor or none ("auto" resolved)
    image: str
    tool: str  # the containers' toolcage.tool label and name part
    workspace: Path | None = None
    tool_sources: tuple[ToolSource, ...] = ()
    egress_network: str | None = None
    egress_proxy: str | None = None
    ca_pem: str | None = None
    audit: Audit | None = None
    keep: bool = False
    engine: EngineAPI | None = None
    # workspace_mode copy: /workspace is a writable copy of ``workspace`` (a tmpfs of limits.workspace_copy,
    # filled by the runner at start; the host's directory is never mounted); ``workspace_gitignore``: the
    # copy leaves out what the workspace's .gitignore files ignore, and .git
    workspace_copy: bool = False
    workspace_gitignore: bool = False
    # workspace_cache: the copy is laid over a tree the engine keeps, made by the first run of that tree
    # (toolcage.engine.copycache); a tree changed since is a miss, copied as without the cache
    workspace_cache: bool = False
    # writable=: paths of the image writable for the run, (path, size cap in bytes), each a tmpfs the
    # runner fills with the image's content there (toolcage.files.imagepaths); () keeps the root read-only
    writable: tuple[tuple[str, int], ...] = ()

    @classmethod
    def resolve(
        cls,
        policy: PolicySource = "default",
        *,
        tool: str,
        sandbox: str | None = None,
        image: str | None = None,
        workspace: str | os.PathLike[str] | None = None,
        tools: Iterable[str | os.PathLike[str]] = (),
        run_timeout: float | None = None,
        engine: EngineAPI | None = None,
        egress_network: str | None = None,
        egress_proxy: str | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        audit: Any = None,
        keep: bool = False,
        workspace_mode: str = "ro",
        workspace_gitignore: bool = False,
        run_s: float | None = None,
        memory: int | str | None = None,
        scratch: int | str | None = None,
        writable: Iterable[str] | str = (),
        writable_size: int | str | None = None,
        workspace_cache: bool = False,
    ) -> RunOptions:
        """Check and resolve every option before anything starts (UsageError/PolicyError with the fix).

        ``run_s``, ``memory``, ``scratch``: the policy's ``timeouts.run_s`` and ``limits.memory`` and
        ``limits.scratch`` set for this run (as the CLI's ``--run-s``, ``--memory``, ``--scratch``: sizes
        as bytes or ``"512m"``, ``"1g"``), checked against the model like the policy's own; ``run_timeout``
        then only tightens the deadline.

        ``writable``: paths of the image (``/testbed``, ``/root``, ``/usr/local``, ``/tmp``) made writable for
        this run, each a tmpfs of ``writable_size`` (default 256m) filled with the image's content there; the
        sizes count against ``memory`` (a tmpfs is memory), with ``scratch`` (toolcage.files.imagepaths)."""
        from toolcage import connectors
        from toolcage.backends import default_kind, resolve_kind
        from toolcage.workspace import validate_workspace

        if run_s is not None or memory is not None or scratch is not None:
            from toolcage.policies.overlay import overlay

            policy = overlay(policy, run_s=run_s, memory=memory, scratch=scratch)
        pol = resolve_policy(policy, run_timeout)
        if workspace_mode not in WORKSPACE_MODES:
            raise UsageError(f"workspace_mode must be one of {', '.join(WORKSPACE_MODES)}, not {workspace_mode!r}")
        if workspace_gitignore and workspace_mode != "copy":
            raise UsageError("workspace_gitignore applies to a workspace copy: give workspace_mode='copy' too")
        if workspace_cache and (workspace_mode != "copy" or workspace is None):
            raise UsageError(
                "workspace_cache keeps a workspace copy in the engine: give workspace= and workspace_mode='copy' too"
            )
        # auto: the strongest the engine has; a policy's isolation minimum is checked here
        kind = resolve_kind(default_kind(sandbox), pol, engine)
        wanted = (writable,) if isinstance(writable, str) else tuple(writable)
        if wanted:
            from toolcage.backends import in_container
            from toolcage.engine import writable as writable_paths

            copy = workspace_mode == "copy"
            paths = writable_paths.check(wanted, writable_size, pol.limits, copy, in_container(kind))
        elif writable_size is not None:
            raise UsageError("writable_size sizes the writable paths: give writable=PATH too (--writable PATH)")
        else:
            paths = ()
        return cls(
            policy=pol,
            kind=kind,
            image=worker_image(image),
            tool=tool,
            workspace=validate_workspace(workspace) if workspace is not None else None,
            # connectors: their sources, mounted read-only, checked before anything starts
            tool_sources=connectors.tool_sources([tools] if isinstance(tools, str | os.PathLike) else tools),
            egress_network=egress_network,
            egress_proxy=egress_proxy if egress_proxy is not None else os.environ.get(contract.ENV_EGRESS_PROXY),
            ca_pem=read_ca(ca_file),
            audit=resolve_audit(audit),
            keep=keep,
            engine=engine,
            workspace_copy=workspace_mode == "copy",
            workspace_gitignore=workspace_gitignore,
            workspace_cache=workspace_cache,
            writable=paths,
        )

    def backend_options(self) -> dict[str, Any]:
        """What ``backends.BackendOptions`` takes from the options (the run adds its name, log and redaction)."""
        return {
            "engine": self.engine,
            "image": self.image,
            "proxy_image": worker_image(),  # the worker image, never the run's (BackendOptions.proxy_image)
            "audit": self.audit,
            "workspace": str(self.workspace) if self.workspace else None,
            "egress_network": self.egress_network,
            "egress_proxy": self.egress_proxy,
            "ca_pem": self.ca_pem,
        }

    def started_fields(self) -> dict[str, Any]:
        """What every run's ``run.started`` records about its options (log line and audit record alike)."""
        return {
            "kind": self.kind,
            "policy": self.policy.name,
            "policy_sha256": self.policy.sha256(),
            "workspace": str(self.workspace) if self.workspace else None,
            "workspace_mode": self.workspace_mode,
        }

    @property
    def workspace_mode(self) -> str:
        return "copy" if self.workspace_copy else "ro"

    def warn_unreadable_workspace(self, log: Any, sandbox_user: bool) -> None:
        """A workspace the sandbox user cannot read is mounted all the same: say so once, with the fix."""
        from toolcage.workspace import readable_by_sandbox

        if (
            self.workspace is not None
            and sandbox_user
            and not self.workspace_copy
            and not readable_by_sandbox(self.workspace)
        ):
            log.warning(
                "workspace.unreadable",
                workspace=str(self.workspace),
                hint=f"the sandbox user (uid {contract.SANDBOX_UID}) cannot read it: `chmod o+rX` what it should see",
            )


__all__ = ["DEFAULT_IMAGE", "RunOptions", "read_ca", "resolve_audit", "resolve_policy", "worker_image"]
