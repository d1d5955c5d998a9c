"""``toolcage doctor``: prints the report ``toolcage.ops.doctor`` makes (a table for people, or ``--json``)
and exits 1 on any finding. The checks are the ops room's; only their printing is here."""

from __future__ import annotations

import sys
from typing import Any

import click

from toolcage.cli.output import emit, use_json
from toolcage.textsafe import escape


@click.command()
@click.option("--probe", is_flag=True, help="Also prove the isolation in a live sandbox under --policy.")
@click.option("--policy", "policy_ref", default="default", show_default=True, help="Policy for --probe.")
@click.option(
    "--sandbox",
    type=click.Choice(["container", "gvisor", "auto"]),
    default="auto",
    show_default=True,
    help="The sandbox kind --probe proves (--image: the kind its run uses; default, a plain run's).",
)
@click.option(
    "--image",
    "image_ref",
    metavar="REF",
    help="Only check this image (the engine's; nothing is pulled): what it offers and whether it runs, "
    "from its config and one short hardened run.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def doctor(probe: bool, policy_ref: str, sandbox: str, image_ref: str | None, as_json: bool) -> None:
    """Check the engine, the sandbox kinds it offers (and which `--sandbox auto` picks), the image,
    the daemon's security features and every live sandbox against its policy.

    With --image REF, only that image: its platform, size, user, workdir, entrypoint, PATH and HOME, then
    one short run under the same hardening as any run (the worker's first answer, /bin/sh, where a run may
    write, Python and its version, Node, git, pip). Exit 0 when it runs, 1 with a one-line reason when it
    will not (missing: nothing is pulled; a platform other than linux/amd64; a config a run refuses; the
    worker not answering in it).

    Exit 1 when anything is weaker than it should be (or cannot be checked). Warnings (a runtime
    older than the fix for a known escape) are printed and do not change the exit code.
    """
    from toolcage.ops.doctor import report as checks

    use_json(as_json)
    if image_ref is not None:
        # the kind a plain run of the image gets, unless --sandbox says (the probe is a run like any other)
        given = click.get_current_context().get_parameter_source("sandbox") != click.core.ParameterSource.DEFAULT
        _image(image_ref, sandbox if given else None, as_json)
        return
    report = checks(probe, policy_ref, sandbox)
    findings: list[str] = report["findings"]
    if as_json:
        emit(report)
    else:
        _doctor_text(report, findings)
    sys.exit(1 if findings else 0)


def _image(ref: str, sandbox: str | None, as_json: bool) -> None:
    """doctor --image: the report (toolcage.ops.imagecheck), then exit 0 runnable, 1 with the reason."""
    from toolcage.cli.output import say
    from toolcage.ops.imagecheck import check

    report = check(ref, sandbox)  # NotFound (missing, another platform): the CLI's one line, exit 1
    if as_json:
        emit(report)
    else:
        for line in image_text(report):
            click.echo(line)
    if not report["runnable"]:
        say(f"image {ref} will not run: {report['reason']}")
        sys.exit(1)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _program(about: dict[str, Any] | None, ran: bool) -> str:
    """One program's line: where and which version, or what is missing (escaped: the image answered it)."""
    about = about or {}
    if not about.get("present"):
        return "not found on its PATH" if ran else "not checked"
    words = [escape(about.get("path")) if about.get("path") else "found"]
    if about.get("version"):
        words.append(escape(about["version"]))
    if about.get("via"):
        words.append(f"(as {escape(about['via'])})")
    if about.get("error"):
        words.append(f"FAILS: {escape(about['error'])}")
    return " ".join(words)


def image_text(report: dict[str, Any]) -> list[str]:
    """doctor --image's lines for people; every value the image or its probe gave is escaped."""
    kind = "a toolcage worker image" if report["kind"] == "worker" else "the image's own (the worker mounted in)"
    layers = report["layers"]
    never = "  (never run: the worker is the entrypoint)" if report["entrypoint"] and report["kind"] != "worker" else ""
    lines = [
        f"image       {escape(report['ref'])}  {escape(report['id'][:19])}",
        f"            {escape(report['platform'])}, {_mib(report['size_bytes'])}, "
        f"{layers} layer{'s' if layers != 1 else ''}; {kind}",
        f"user        {escape(report['user']) or '(none: root)'}; the run's code runs as 65532 whatever it says",
        f"workdir     {escape(report['workdir']) or '(none)'}",
        f"entrypoint  {escape(' '.join(report['entrypoint'])) or '(none)'}{never}",
        f"PATH        {escape(report['path']) if report['path'] is not None else '(unset: the usual default)'}",
        f"HOME        {escape(report['home']) if report['home'] is not None else '(unset: /scratch for its programs)'}",
    ]
    p = report.get("probe") or {}
    if p.get("answered"):
        lines.append(f"worker      answered in {p['first_answer_ms']:.0f} ms (sandbox {escape(p.get('sandbox'))})")
    elif p.get("started") is False:
        lines.append("worker      not started: a run refuses this image's config")
    else:
        lines.append(f"worker      DID NOT ANSWER: {escape(p.get('error') or '?')}")
    ran = bool(p.get("answered"))
    shell = p.get("shell") or {}
    lines.append(f"shell       {'/bin/sh' if shell.get('present') else 'none' if ran else 'not checked'}")
    writable = p.get("writable")
    if ran:
        shown = ", ".join(escape(w) for w in writable) if writable else "nothing" if writable == [] else "not known"
        lines.append(f"writable    {shown}{'  (no shell to ask)' if writable is None else ''}")
    py = p.get("python") or {}
    py_line = _program(py, ran)
    if py.get("present") and not py.get("error"):
        py_line += "  (run_python uses it)" if py.get("supported") else "  (too old for run_python: 3.8 or newer)"
    lines.append(f"python      {py_line}")
    for name in ("node", "git", "pip"):
        lines.append(f"{name:<12}{_program(p.get(name), ran)}")
    lines.extend(f"note        {escape(n)}" for n in report.get("notes", []))
    verdict = "runs" if report["runnable"] else f"WILL NOT RUN: {escape(report['reason'])}"
    lines.append(f"verdict     {verdict}")
    return lines


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
    probes = report.get("probes", [])
    width = max((len(escape(r["name"])) for r in probes), default=0)  # the longest name sets the column
    for r in probes:
        click.echo(
            f"probe       {'PASS' if r['passed'] else 'FAIL'}  {escape(r['name']):<{width}}  {escape(r['what'])}"
        )
        if r.get("note"):
            click.echo(f"{'':<18}{'':<{width}}  ({escape(r['note'])})")
    for w in report.get("warnings", []):
        click.echo(f"WARNING     {escape(w)}")
    for f in findings:
        click.echo(f"FINDING     {escape(f)}")


__all__ = ["doctor", "image_text"]
