"""The ``toolcage`` command (click): run, serve, tools, image build.

stdout carries results (JSON) or the protocol (serve); everything for people goes to
stderr. Text a sandbox may have chosen is escaped (runner.textsafe) before it reaches a
terminal, in human output and in JSON alike. Exit codes: 0 ok, 1 the tool reported an error, 2 usage or policy error,
3 sandbox failure (timeout, memory, crash, Docker).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import click

from toolcage.errors import ToolcageError, UsageError
from toolcage.policies import PolicyError
from toolcage.textsafe import dumps, escape

EXIT_BY_STATUS = {"ok": 0, "error": 1, "output_capped": 1, "signal": 1, "timeout": 3, "oom_killed": 3, "crashed": 3}
_USAGE_CODES = (-32601, -32602, -32600, -32700)


def _emit(obj: Any) -> None:
    sys.stdout.write(dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


def _fail(exc: ToolcageError | PolicyError, as_json: bool) -> NoReturn:
    if isinstance(exc, PolicyError):
        payload = {"status": "error", "reason": "policy", "message": str(exc)}
        code = 2
    else:
        payload = exc.to_dict()
        code = exc.exit_code
    if as_json:
        _emit({"error": payload, "status": payload["status"]})
    click.echo(f"toolcage: {escape(payload['message'])}", err=True)
    sys.exit(code)


def _on_signal(signum: int, frame: Any) -> None:
    # unwinds through `with Sandbox`, so the container is removed before the process exits
    signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the clean-up
    click.echo(f"toolcage: {signal.Signals(signum).name}: removing the sandbox", err=True)
    raise SystemExit(128 + signum)


def _parse_params(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    text = sys.stdin.read() if raw == "-" else raw
    try:
        params = json.loads(text) if text.strip() else None
    except ValueError as exc:
        raise UsageError(f"--params is not valid JSON: {exc}") from None
    if params is not None and not isinstance(params, dict):
        raise UsageError('--params must be a JSON object, e.g. \'{"code": "print(1)"}\'')
    return params


def sandbox_options(f: Any) -> Any:
    opts = [
        click.option(
            "--sandbox",
            "sandbox",
            type=click.Choice(["container", "none"]),
            default="container",
            show_default=True,
            help="'none' runs the worker as a local process: NO isolation, development only.",
        ),
        click.option(
            "--policy", default="default", show_default=True, help="Bundled policy name or a policy file path."
        ),
        click.option(
            "--workspace",
            type=click.Path(file_okay=False),
            default=None,
            help="Directory mounted read-only at /workspace (default: none mounted).",
        ),
        click.option(
            "--timeout",
            type=float,
            default=None,
            help="Run deadline in seconds; can only tighten the policy's timeouts.run_s.",
        ),
        click.option("--keep", is_flag=True, help="Leave the container after the run, for debugging."),
        click.option(
            "--image", default=None, help="Worker image (default toolcage-worker:<version>, or $TOOLCAGE_IMAGE)."
        ),
        click.option("-v", "--verbose", count=True, help="Log run events on stderr (-vv for debug)."),
        click.option(
            "--egress-network",
            default=None,
            help="Docker network for the egress proxy's outbound side (network.mode: proxy; "
            "default: a per-run bridge).",
        ),
        click.option(
            "--ca-file",
            type=click.Path(dir_okay=False),
            default=None,
            help="Extra CA bundle (PEM) that SafeFetch trusts, e.g. a corporate CA.",
        ),
        click.option(
            "--audit-log",
            type=click.Path(dir_okay=False),
            default=None,
            help="Audit log file (default $TOOLCAGE_AUDIT_LOG or ~/.local/state/toolcage/audit.jsonl).",
        ),
        click.option(
            "--egress-proxy",
            default=None,
            help="Upstream HTTP proxy for allowed traffic (default $TOOLCAGE_EGRESS_PROXY).",
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="toolcage")
def cli() -> None:
    """toolcage: run tool handlers you did not write in a hardened, per-run Docker sandbox."""


def _sandbox(tool: str, opts: dict[str, Any]) -> Any:
    """The Sandbox the shared options describe (logging configured first)."""
    from toolcage import logs
    from toolcage.sandbox import Sandbox

    logs.configure(opts["verbose"])
    return Sandbox(
        opts["policy"],
        workspace=opts["workspace"],
        tool=tool,
        sandbox=opts["sandbox"],
        image=opts["image"],
        keep=opts["keep"],
        run_timeout=opts["timeout"],
        egress_network=opts["egress_network"],
        egress_proxy=opts["egress_proxy"],
        ca_file=opts["ca_file"],
        audit=opts["audit_log"],
    )


@cli.command()
@click.argument("tool")
@click.option("--params", default=None, help="Tool params as a JSON object, or '-' to read it from stdin.")
@sandbox_options
def run(tool: str, params: str | None, **opts: Any) -> None:
    """Run one TOOL call in a fresh sandbox and print the result as JSON.

    Example: toolcage run run_python --params '{"code": "print(2+2)"}'
    """
    sb = None
    try:
        parsed = _parse_params(params)
        sb = _sandbox(tool, opts)
        with sb:
            res = sb.call(tool, parsed)
        summary = sb.summary
    except (ToolcageError, PolicyError) as exc:
        _fail(exc, as_json=True)
    except (KeyboardInterrupt, SystemExit):
        # SIGINT/SIGTERM mid-run: the sandbox is gone (status interrupted); say so on stdout, then exit
        # with the signal's code (130 SIGINT, 143 SIGTERM), which main() and the signal handler choose
        if sb is not None and sb.summary is not None and sb.summary.status == "interrupted":
            _emit({"status": "interrupted", "name": sb.name, "run_id": sb.run_id, "run_wall_ms": sb.summary.wall_ms})
        raise
    out = res.to_dict()
    out["name"] = sb.name
    if summary is not None:
        out.update(run_wall_ms=summary.wall_ms, cpu_ms=summary.cpu_ms, peak_memory_bytes=summary.peak_memory_bytes)
    _emit(out)
    if res.error and res.error.get("code") in _USAGE_CODES:
        click.echo(f"toolcage: {escape(res.error.get('message'))}: {dumps(res.error.get('data'))}", err=True)
        sys.exit(2)
    sys.exit(EXIT_BY_STATUS.get(res.status, 3))


@cli.command()
@sandbox_options
@click.option(
    "--tool-label", default="serve", show_default=True, help="Tool name used in the container name and labels."
)
def serve(tool_label: str, **opts: Any) -> None:
    """Bridge JSON-RPC on this process's stdin/stdout into one sandboxed run.

    Send newline-delimited JSON-RPC 2.0 requests on stdin; responses come back on stdout.
    The run ends at stdin EOF or at the policy's run deadline.
    """
    from toolcage.bridge import bridge

    try:
        with _sandbox(tool_label, opts) as sb:
            bridge(sb, sys.stdin.buffer, sys.stdout.buffer)
    except (ToolcageError, PolicyError) as exc:
        _fail(exc, as_json=False)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print names, descriptions and params JSON schemas.")
def tools(as_json: bool) -> None:
    """List the built-in tools (the same list `tools.list` returns inside a sandbox)."""
    from toolcage.worker.tools import Catalog

    listing = Catalog().describe()
    if as_json:
        _emit(listing)
        return
    width = max(len(t["name"]) for t in listing)
    for t in listing:
        click.echo(f"{escape(t['name']):<{width}}  {escape(t['description'])}")


@cli.group()
def policy() -> None:
    """Check policies and URLs against them."""


@policy.command("test")
@click.argument("policy_ref", metavar="POLICY")
@click.argument("url")
@click.option("--method", default="GET", show_default=True, help="HTTP method of the request.")
@click.option(
    "--resolve",
    "resolve",
    multiple=True,
    metavar="HOST=IP",
    help="Answer for HOST instead of DNS (repeatable; several for one host give several answers).",
)
def policy_test(policy_ref: str, url: str, method: str, resolve: tuple[str, ...]) -> None:
    """Would POLICY let a sandbox fetch URL? Prints {"allowed", "reason"}; exit 0 allowed, 1 denied, 2 error.

    Runs the same decide() as SafeFetch and the egress proxy, with the system resolver for
    names not given with --resolve (a name that cannot be resolved is denied).
    """
    import ipaddress

    from toolcage.policies import load_policy
    from toolcage.policies.decide import Request, decide, system_resolver
    from toolcage.policies.names import NameError_, normalize_host

    fixed: dict[str, list[str]] = {}
    for item in resolve:
        host, sep, ip = item.partition("=")
        if not sep or not host or not ip:
            _fail(UsageError(f"--resolve wants HOST=IP, not {item!r}"), as_json=False)
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            _fail(UsageError(f"--resolve {item!r}: {ip!r} is not an IP address"), as_json=False)
        try:
            fixed.setdefault(normalize_host(host), []).append(ip)
        except NameError_ as exc:
            _fail(UsageError(f"--resolve {item!r}: {exc}"), as_json=False)

    def resolver(name: str) -> list[str]:
        if name in fixed:
            return fixed[name]
        return system_resolver(name)

    try:
        p = load_policy(policy_ref)
    except PolicyError as exc:
        _fail(exc, as_json=False)
    d = decide(Request(url, method.upper()), p, resolver)
    _emit({"allowed": d.allowed, "reason": d.reason, "rule": d.rule, "addresses": list(d.addresses)})
    sys.exit(0 if d.allowed else 1)


_SINCE = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _parse_since(text: str) -> float:
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if not m:
        raise UsageError(f"--since wants a duration like 30s, 10m, 2h or 1d, not {text!r}")
    return float(m.group(1)) * _SINCE[m.group(2)]


def _audit_line(rec: dict[str, Any]) -> str:
    """One audit record for people: every field escaped (egress targets, methods and reasons
    come from inside the sandbox)."""
    skip = {"ts", "event", "run_id", "hash", "prev", "seq"}
    rest = " ".join(f"{escape(k)}={escape(v)}" for k, v in sorted(rec.items()) if k not in skip and v is not None)
    ts, run_id, event = (escape(rec.get(k, d)) for k, d in (("ts", "?"), ("run_id", "-"), ("event", "?")))
    return f"{ts[:23]}  {run_id:<8}  {event:<16} {rest}"


@cli.command()
@click.option("--run", "run_id", default=None, help="Only this run id.")
@click.option("--since", default=None, help="Only the last DURATION (30s, 10m, 2h, 1d).")
@click.option("--json", "as_json", is_flag=True, help="Print records as JSON lines.")
@click.option("--verify", is_flag=True, help="Check the hash chain; exit 1 if a line was edited, dropped or moved.")
@click.option("--audit-log", type=click.Path(dir_okay=False), default=None, help="Audit log file.")
def audit(run_id: str | None, since: str | None, as_json: bool, verify: bool, audit_log: str | None) -> None:
    """Read the audit log: what ran, with which policy, what it did, how it ended."""
    from datetime import datetime
    from pathlib import Path

    from toolcage import audit as audit_mod

    path = Path(audit_log).expanduser() if audit_log else audit_mod.default_path()
    if verify:
        problems = audit_mod.verify(path)
        for p in problems:
            click.echo(f"toolcage audit: {escape(p)}", err=True)
        if problems:
            sys.exit(1)
        n = sum(1 for _ in audit_mod.read(path))
        click.echo(f"{path}: intact, {n} records")
        return
    if not path.exists():
        click.echo(f"toolcage: no audit log at {path}", err=True)
        sys.exit(2)
    try:
        cutoff = time.time() - _parse_since(since) if since else None
    except UsageError as exc:
        _fail(exc, as_json=False)
    for rec in audit_mod.read(path):
        if run_id and rec.get("run_id") != run_id:
            continue
        if cutoff is not None:
            try:
                if datetime.fromisoformat(str(rec.get("ts", "")).replace("Z", "+00:00")).timestamp() < cutoff:
                    continue
            except ValueError:
                continue
        if as_json:
            click.echo(dumps(rec, sort_keys=True))
            continue
        click.echo(_audit_line(rec))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def ps(as_json: bool) -> None:
    """Live runs (from Docker labels): name, tool, policy, age, memory."""
    from toolcage.docker_adapter import Engine
    from toolcage.ops import live_runs

    try:
        rows = live_runs(Engine.default())
    except ToolcageError as exc:
        _fail(exc, as_json=False)
    if as_json:
        _emit(rows)
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table("NAME", "TOOL", "POLICY", "AGE", "MEMORY", "OWNER", box=None)
    for r in rows:
        mem = f"{r['memory_bytes'] / 2**20:.1f} MiB" if r["memory_bytes"] else "-"
        # Text, not str: a label like "[red]x" is shown, not read as rich markup
        cells = (r["name"], r["tool"], r["policy"], r["age"], mem, r["owner"])
        table.add_row(*(Text(escape("-" if c is None else c)) for c in cells))
    Console().print(table)
    if not rows:
        click.echo("no live runs", err=True)


@cli.command()
@click.option("--dry-run", is_flag=True, help="List what would be removed.")
def gc(dry_run: bool) -> None:
    """Remove toolcage containers and networks whose owner is gone or whose deadline passed."""
    from toolcage.docker_adapter import Engine
    from toolcage.reaper import find_orphans, remove

    try:
        engine = Engine.default()
        orphans = find_orphans(engine)
        for o in orphans:
            verb = "would remove" if dry_run else "removing"
            click.echo(f"{verb} {o.kind} {escape(o.name)} (run {escape(o.run_id)}): {escape(o.reason)}")
        if not dry_run:
            from toolcage import audit as audit_mod

            remove(engine, orphans, audit_mod.shared())
    except ToolcageError as exc:
        _fail(exc, as_json=False)
    if not orphans:
        click.echo("nothing to collect", err=True)


@cli.command()
@click.option("--probe", is_flag=True, help="Also prove the isolation in a live sandbox under --policy.")
@click.option("--policy", "policy_ref", default="default", show_default=True, help="Policy for --probe.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def doctor(probe: bool, policy_ref: str, as_json: bool) -> None:
    """Check the engine, the image, the daemon's security features and every live sandbox against its policy.

    Exit 1 when anything is weaker than it should be.
    """
    from toolcage.docker_adapter import Engine
    from toolcage.image.build import SOURCE_LABEL, source_sha256
    from toolcage.ops import daemon_security, inspect_findings
    from toolcage.sandbox import DEFAULT_IMAGE

    report: dict[str, Any] = {"findings": []}
    findings: list[str] = report["findings"]
    try:
        engine = Engine.default()
        version = engine.ping()
        report["engine"] = {"version": version.get("Version"), "api": version.get("ApiVersion")}
        img = engine.image(DEFAULT_IMAGE)
        if img is None:
            findings.append(f"image {DEFAULT_IMAGE} is missing: run `toolcage image build`")
        else:
            current = ((img.get("Config") or {}).get("Labels") or {}).get(SOURCE_LABEL) == source_sha256()
            report["image"] = {"tag": DEFAULT_IMAGE, "id": img.get("Id"), "current": current}
            if not current:
                findings.append(f"image {DEFAULT_IMAGE} is out of date: run `toolcage image build`")
        sec = daemon_security(engine.info())
        report["daemon"] = sec
        if not sec["seccomp"]:
            findings.append("the Docker daemon runs without seccomp")
        checked = []
        for c in engine.containers("toolcage.run_id", all=False):
            info = engine.inspect(c["Id"])
            if info is None:
                continue
            problems = inspect_findings(info)
            name = info.get("Name", "?").lstrip("/")
            checked.append({"name": name, "findings": problems})
            findings.extend(f"{name}: {p}" for p in problems)
        report["containers"] = checked
        if probe and img is not None:
            from toolcage.probes import run_all
            from toolcage.sandbox import Sandbox

            with Sandbox(policy_ref, tool="doctor-probe") as sb:
                results = run_all(sb)
            report["probes"] = [r.__dict__ for r in results]
            findings.extend(f"probe {r.name} failed: {r.observed}" for r in results if not r.passed)
    except (ToolcageError, PolicyError) as exc:
        _fail(exc, as_json=as_json)
    if as_json:
        _emit(report)
    else:
        _doctor_text(report, findings)
    sys.exit(1 if findings else 0)


def _doctor_text(report: dict[str, Any], findings: list[str]) -> None:
    """doctor's table for people; probe observations and container names are escaped."""
    eng = report.get("engine", {})
    click.echo(f"engine      Docker {escape(eng.get('version'))} (API {escape(eng.get('api'))})")
    im = report.get("image")
    state = ("current" if im["current"] else "OUT OF DATE") if im else ""
    click.echo(f"image       {escape(im['tag'])} {state}" if im else "image       missing")
    d = report["daemon"]
    flags = ", ".join(k for k in ("seccomp", "apparmor", "selinux", "userns", "rootless") if d[k]) or "none"
    click.echo(
        f"daemon      security: {flags}; cgroup v{escape(d['cgroup_version'])}; storage {escape(d['storage_driver'])}"
    )
    for c in report["containers"]:
        verdict = "as locked down as its policy" if not c["findings"] else "WEAKER"
        click.echo(f"container   {escape(c['name'])}: {verdict}")
    for r in report.get("probes", []):
        click.echo(f"probe       {'PASS' if r['passed'] else 'FAIL'}  {escape(r['name']):<28} {escape(r['what'])}")
    for f in findings:
        click.echo(f"FINDING     {escape(f)}", err=True)


@cli.group()
def image() -> None:
    """Build and inspect the worker image."""


@image.command("build")
@click.option("--tag", default=None, help="Image tag (default toolcage-worker:<version>).")
@click.option(
    "--base",
    default=None,
    help="Base image with Python 3.11 (default: registry python image, else a local debootstrap).",
)
@click.option("--force", is_flag=True, help="Rebuild even if the image is up to date.")
def image_build(tag: str | None, base: str | None, force: bool) -> None:
    """Build the worker image (idempotent: nothing happens when nothing changed)."""
    from toolcage.docker_adapter import Engine
    from toolcage.image.build import build_image
    from toolcage.progress import StepReporter
    from toolcage.sandbox import DEFAULT_IMAGE

    try:
        engine = Engine(timeout=600)
        engine.ping()
        with StepReporter("toolcage image build") as reporter:
            result = build_image(engine, tag or DEFAULT_IMAGE, reporter.step, base=base, force=force)
    except ToolcageError as exc:
        _fail(exc, as_json=False)
    verb = "built" if result.built else "up to date"
    click.echo(f"{result.tag}: {verb} in {result.seconds:.1f}s (base {result.base})", err=True)
    _emit(
        {
            "tag": result.tag,
            "built": result.built,
            "base": result.base,
            "context_sha256": result.context_sha256,
            "seconds": round(result.seconds, 1),
        }
    )


def main() -> None:
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        cli(standalone_mode=True)
    except KeyboardInterrupt:
        click.echo("toolcage: interrupted; the sandbox was removed", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()


__all__ = ["Path", "cli", "main"]
