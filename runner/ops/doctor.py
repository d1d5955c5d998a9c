"""``toolcage doctor``'s checks: is this host fit to run sandboxes, and is every live sandbox as locked down as
its policy? ``report()`` returns the answer as data; the CLI prints it (toolcage.cli.doctor), never this room.

The report is whole even when a check cannot run (Docker down: the engine check fails and says why), so the
answer to "what is wrong" is never an empty screen.
"""

from __future__ import annotations

from typing import Any

from toolcage.engine.labels import LABEL_RUN_ID
from toolcage.errors import DockerUnavailable
from toolcage.policies.contract import PING


def report(probe: bool = False, policy_ref: str = "default", sandbox: str = "auto") -> dict[str, Any]:
    """The doctor's report: ``findings`` (anything weaker than it should be, or that cannot be checked: the
    CLI exits 1), ``warnings`` (printed, exit code unchanged), and what each check saw (``engine``,
    ``engines``, ``image``, ``daemon``, ``backends``, ``containers``; with ``probe``, ``probes`` proved in a
    live sandbox under ``policy_ref`` and ``sandbox``)."""
    out: dict[str, Any] = {"findings": [], "warnings": []}
    _checks(out, out["findings"], probe, policy_ref, sandbox)
    _egress_mode(out)
    return out


def _egress_mode(report: dict[str, Any]) -> None:
    """Whether this host permits audit-only egress (network.unsafe_audit_only: refusals recorded, not enforced)."""
    from toolcage.options import audit_only_permitted
    from toolcage.policies import contract

    report["egress_audit_only"] = permitted = audit_only_permitted()
    if permitted:
        report["warnings"].append(
            f"{contract.ENV_EGRESS_AUDIT_ONLY}=allow: a policy or a live change may make a sandbox's egress "
            "audit-only (what its allowlist would refuse is let through and recorded; the floor still refuses)"
        )


def _checks(report: dict[str, Any], findings: list[str], probe: bool, policy_ref: str, sandbox: str) -> None:
    from toolcage.engine.docker_adapter import Engine
    from toolcage.image.build import SOURCE_LABEL, source_sha256
    from toolcage.ops.views import daemon_security, inspect_findings
    from toolcage.sandbox import DEFAULT_IMAGE

    try:
        engine = Engine.default()
        version = engine.ping()
    except DockerUnavailable as exc:
        report["engine"] = {"ok": False, "error": exc.message}
        findings.append(f"engine: {exc.message}")
        return
    report["engine"] = {"ok": True, "version": version.get("Version"), "api": version.get("ApiVersion")}
    report["engines"] = _engines()
    img = engine.image(DEFAULT_IMAGE)
    if img is None:
        findings.append(f"image {DEFAULT_IMAGE} is missing: run `toolcage image build`")
    else:
        current = ((img.get("Config") or {}).get("Labels") or {}).get(SOURCE_LABEL) == source_sha256()
        report["image"] = {"tag": DEFAULT_IMAGE, "id": img.get("Id"), "current": current}
        if not current:
            findings.append(f"image {DEFAULT_IMAGE} is out of date: run `toolcage image build`")
    from toolcage.ops.engines import backends_report

    info = engine.info()
    sec = daemon_security(info)
    report["daemon"] = sec
    report["backends"] = backends = backends_report(version, info)
    report["warnings"].extend(backends["warnings"])
    if not sec["seccomp"]:
        findings.append("the Docker daemon runs without seccomp")
    checked = report["containers"] = []
    for c in engine.containers(LABEL_RUN_ID, all=False):
        live = engine.inspect(c["Id"])
        if live is None:
            continue
        problems = inspect_findings(live)
        name = live.get("Name", "?").lstrip("/")
        checked.append({"name": name, "findings": problems})
        findings.extend(f"{name}: {p}" for p in problems)
    if probe and img is not None:
        from toolcage.errors import ToolcageError
        from toolcage.ops.probes import run_all
        from toolcage.sandbox import Sandbox

        for kind, about in backends["kinds"].items():  # does each one the engine has start a sandbox?
            if kind != "none" and about["available"] and (kind != "gvisor" or backends["auto"] == "gvisor"):
                try:
                    with Sandbox(tool="doctor-backend", sandbox=kind) as sb:
                        about["works"] = sb.call(PING).result == "pong"
                except ToolcageError as exc:
                    about["works"], about["error"] = False, exc.message
                    findings.append(f"sandbox kind {kind}: {exc.message}")
        with Sandbox(policy_ref, tool="doctor-probe", sandbox=sandbox) as sb:
            report["probed_kind"] = sb.kind
            results = run_all(sb)
        report["probes"] = [r.__dict__ for r in results]
        findings.extend(f"probe {r.name} failed: {r.observed}" for r in results if not r.passed)


def _engines() -> list[dict[str, Any]]:
    """Every engine endpoint found on this host (DOCKER_HOST's, then rootful and rootless Docker and
    Podman), each with what it is and which sandbox kinds it can serve: the one flag to change
    (DOCKER_HOST) and what the others would give."""
    import os

    from toolcage.engine.docker_adapter import Engine
    from toolcage.errors import ToolcageError
    from toolcage.ops.engines import engine_sockets, engine_summary

    out: list[dict[str, Any]] = []
    for i, url in enumerate(engine_sockets(dict(os.environ), os.getuid())):
        if url.startswith("unix://") and not os.path.exists(url[len("unix://") :]):
            continue
        row: dict[str, Any] = {"url": url, "in_use": i == 0}
        try:
            eng = Engine(base_url=url, timeout=5)
            row.update(engine_summary(eng.ping(), eng.info()), ok=True)
        except ToolcageError as exc:
            row.update(ok=False, error=exc.message)
        out.append(row)
    return out


__all__ = ["report"]
