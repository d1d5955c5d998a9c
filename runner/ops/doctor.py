"""``toolcage doctor``: is this host fit to run sandboxes, and is every live sandbox as locked down as its policy?

The report is printed even when a check cannot run (Docker down: the engine check fails and
says why), so the answer to "what is wrong" is never an empty screen.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from toolcage.cli.output import emit, use_json
from toolcage.engine.hostconfig import LABEL_RUN_ID
from toolcage.errors import DockerUnavailable
from toolcage.policies.contract import PING
from toolcage.textsafe import escape


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


@click.command()
@click.option("--probe", is_flag=True, help="Also prove the isolation in a live sandbox under --policy.")
@click.option("--policy", "policy_ref", default="default", show_default=True, help="Policy for --probe.")
@click.option(
    "--sandbox",
    type=click.Choice(["container", "gvisor", "auto"]),
    default="auto",
    show_default=True,
    help="The sandbox kind --probe proves.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def doctor(probe: bool, policy_ref: str, sandbox: str, as_json: bool) -> None:
    """Check the engine, the sandbox kinds it offers (and which `--sandbox auto` picks), the image,
    the daemon's security features and every live sandbox against its policy.

    Exit 1 when anything is weaker than it should be (or cannot be checked). Warnings (a runtime
    older than the fix for a known escape) are printed and do not change the exit code.
    """
    use_json(as_json)
    report: dict[str, Any] = {"findings": [], "warnings": []}
    findings: list[str] = report["findings"]
    _checks(report, findings, probe, policy_ref, sandbox)
    if as_json:
        emit(report)
    else:
        _doctor_text(report, findings)
    sys.exit(1 if findings else 0)


def _doctor_text(report: dict[str, Any], findings: list[str]) -> None:
    """doctor's table for people; probe observations and container names are escaped."""
    eng = report.get("engine", {})
    if not eng.get("ok"):
        click.echo(f"engine      FAILED: {escape(eng.get('error'))}")
    else:
        click.echo(f"engine      Docker {escape(eng.get('version'))} (API {escape(eng.get('api'))})")
        im = report.get("image")
        state = ("current" if im["current"] else "OUT OF DATE") if im else ""
        click.echo(f"image       {escape(im['tag'])} {state}" if im else "image       missing")
        for e in report.get("engines", []):
            mark = "engine*" if e["in_use"] else "engine "
            if not e["ok"]:
                click.echo(f"{mark}     {escape(e['url'])}  not answering: {escape(e.get('error'))}")
                continue
            mode = "rootless" if e["rootless"] else "rootful" + (", userns-remap" if e["userns"] else "")
            line = f"{mark}     {escape(e['url'])}  {escape(e['flavor'])} {escape(e['version'])} ({mode}); kinds: "
            line += ", ".join(e["kinds"]) or "none"
            if e["limits_problem"]:
                line += f"  ({escape(e['limits_problem'])})"
            elif e["gvisor_problem"]:
                line += f"  (gvisor: {escape(e['gvisor_problem'])})"
            click.echo(line)
        d = report["daemon"]
        flags = ", ".join(k for k in ("seccomp", "apparmor", "selinux", "userns", "rootless") if d[k]) or "none"
        click.echo(
            f"daemon      security: {flags}; cgroup v{escape(d['cgroup_version'])}; "
            f"storage {escape(d['storage_driver'])}"
        )
    backends = report.get("backends")
    if backends:
        for kind, about in backends["kinds"].items():
            state = "available" if about["available"] else "not available"
            if "works" in about:
                state += ", works" if about["works"] else f", FAILS: {escape(about.get('error'))}"
            runtime = (
                f" (runtime {escape(about['runtime'])}{' ' + escape(about['version']) if about.get('version') else ''})"
            )
            note = f"  ({escape(about['note'])})" if about.get("note") else ""
            pick = "  <- --sandbox auto" if kind == backends["auto"] else note
            click.echo(f"sandbox     {kind:<10}{state}{runtime if about['runtime'] else ''}{pick}")
            proxy_rt = about.get("egress_proxy_runtime")
            if about["available"] and proxy_rt and proxy_rt != about["runtime"]:
                click.echo(
                    f"{'':<22}its egress proxy runs under {escape(proxy_rt)} "
                    "(runsc is registered with --network=none: no network stack to give it)"
                )
    for c in report.get("containers", []):
        verdict = "as locked down as its policy" if not c["findings"] else "WEAKER"
        click.echo(f"container   {escape(c['name'])}: {verdict}")
    for r in report.get("probes", []):
        click.echo(f"probe       {'PASS' if r['passed'] else 'FAIL'}  {escape(r['name']):<28} {escape(r['what'])}")
        if r.get("note"):
            click.echo(f"{'':<18}{'':<28} ({escape(r['note'])})")
    for w in report.get("warnings", []):
        click.echo(f"WARNING     {escape(w)}")
    for f in findings:
        click.echo(f"FINDING     {escape(f)}")


__all__ = ["doctor"]
