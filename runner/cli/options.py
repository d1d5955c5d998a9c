"""The options the sandboxed commands share (run, serve, tools, mcp serve, mcp wrap), in one place:
their click decorators, and the flags turned into what the library takes (a checked Policy, the
keyword options of Sandbox and Pool, a Sandbox or a warm Pool). Public inside ``toolcage.cli``: the
commands of every module import these by name."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from toolcage.cli import policy_flags
from toolcage.cli.output import emit, warn
from toolcage.errors import UsageError
from toolcage.policies import Policy, contract


def parse_params(raw: str | None) -> dict[str, Any] | None:
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


def prepared_call(tool: str, raw: str | None, opts: dict[str, Any]) -> dict[str, Any] | None:
    """Everything `run` can check before a container starts: params JSON, policy, --timeout,
    the tool and its params (host-side, toolcage.precheck). Loads the policy once into opts.
    (A child's timeout is cut to the time left in the run by the sandbox, for every door: toolcage.timing.)"""
    from toolcage.precheck import check_call

    params = parse_params(raw)
    policy(opts)
    check_call(tool, params, opts["image"], connectors=bool(opts.get("tools")))
    return params


def policy(opts: dict[str, Any]) -> Policy:
    """The run's policy: --policy, the policy flags set over it (--memory, --allow-host, ...: one overlay
    the policy model validates, toolcage.cli.policy_flags), then --timeout; warns when --timeout asks
    for more than that policy allows."""
    from toolcage.options import resolve_policy
    from toolcage.policies import load_policy

    if isinstance(opts["policy"], Policy):
        return opts["policy"]
    base = policy_flags.apply(load_policy(opts["policy"]), opts)
    timeout = opts["timeout"]
    if timeout is not None and timeout > base.timeouts.run_s:
        warn(f"--timeout {timeout:g}s is more than the policy's run deadline; using {base.timeouts.run_s:g}s")
    pol = resolve_policy(base, timeout)
    opts["policy"] = pol
    return pol


def sandbox_options(f: Any = None, *, without: tuple[str, ...] = ()) -> Any:
    """The options every sandboxed command shares; ``without`` leaves some out, by parameter name
    (``toolcage mcp wrap`` has no connectors and an --image of its own)."""
    if f is None:
        return lambda g: sandbox_options(g, without=without)
    if "image" in without:  # mcp wrap, with an --image of its own: no --writable there yet
        without = (*without, "writable", "writable_size")
    opts = [
        click.option(
            "--sandbox",
            "sandbox",
            type=click.Choice(["container", "gvisor", "auto", "none"]),
            default="container",
            envvar=contract.ENV_SANDBOX,
            show_default=True,
            help="'gvisor': a container under gVisor's runsc; 'auto': the strongest the engine has (gvisor, "
            "then container); 'none' runs the worker as a local process: NO isolation, development only.",
        ),
        click.option(
            "--policy",
            default="default",
            show_default=True,
            shell_complete=policy_flags.complete_policy,
            help="Bundled policy name or a policy file path.",
        ),
        *policy_flags.policy_options(),
        click.option(
            "--workspace",
            type=click.Path(),  # checked by toolcage.workspace, so every workspace problem is reason "workspace"
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
        click.option(
            "--writable",
            "writable",
            multiple=True,
            metavar="PATH",
            help="A directory of the image writable for this run (repeatable, e.g. /testbed, /root, /usr/local): a "
            "tmpfs of --writable-size filled with the image's content there, discarded at the end.",
        ),
        click.option(
            "--writable-size",
            "writable_size",
            default=None,
            metavar="SIZE",
            help="The cap of each --writable path, e.g. 512m (default 256m; counts against --memory).",
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
        click.option(
            "--tools",
            "tools",
            multiple=True,
            type=click.Path(),
            help="Connector source: a .py file, a folder of them or a package folder (repeatable); mounted read-only.",
        ),
        click.option(
            "--secret",
            "secret",
            multiple=True,
            metavar="NAME=env:VAR|NAME=file:PATH",
            help="A secret the policy binds (repeatable); the sandboxed code never reads it.",
        ),
    ]
    for opt in reversed(opts):
        probe: Any = opt(lambda: None)  # the option's parameter name, read off what click attached
        if probe.__click_params__[0].name not in without:
            f = opt(f)
    return f


def keywords(tool: str, opts: dict[str, Any]) -> dict[str, Any]:
    """The shared options as the keyword options Sandbox and Pool take (toolcage.options resolves them),
    mapped once; logging is configured first."""
    from toolcage import logs

    logs.configure(opts["verbose"], json_logs=False)  # stderr is for people: plain, escaped text
    return {
        "tool": tool,
        "workspace": opts["workspace"],
        "tools": opts["tools"],
        "sandbox": opts["sandbox"],
        "image": opts["image"],
        "run_timeout": None,  # applied by _policy, with its warning
        "egress_network": opts["egress_network"],
        "egress_proxy": opts["egress_proxy"],
        "ca_file": opts["ca_file"],
        "audit": opts["audit_log"],
    }


def sandbox(tool: str, opts: dict[str, Any], **more: Any) -> Any:
    """The Sandbox the shared options describe (``more``: a command's own, e.g. ``run``'s workspace mode)."""
    from toolcage.connectors import parse_secret_options
    from toolcage.sandbox import Sandbox

    kwargs = keywords(tool, opts)
    if opts.get("writable"):  # writable=: the run's own paths of the image (not a pool's: see pool())
        kwargs.update(writable=tuple(opts["writable"]), writable_size=opts.get("writable_size"))
    elif opts.get("writable_size") is not None:
        raise UsageError("--writable-size sizes the --writable paths: give --writable PATH too")
    return Sandbox(policy(opts), keep=opts["keep"], secrets=parse_secret_options(opts["secret"]), **kwargs, **more)


def pool(tool: str, opts: dict[str, Any], size: int) -> Any:
    """A warm pool for the life of this process (``--pool N``), described by the shared options; and
    how to make a sandbox that adopts one of its slots (with this process's secrets)."""
    from toolcage.connectors import parse_secret_options
    from toolcage.pool import Pool
    from toolcage.sandbox import Sandbox

    kwargs = keywords(tool, opts)
    if opts["keep"]:
        raise UsageError("--keep cannot be used with --pool: a pooled container is always removed after its run")
    if opts.get("writable"):
        raise UsageError("--writable cannot be used with --pool yet: each run fills its paths from the image at start")
    secrets = parse_secret_options(opts["secret"])
    warm = Pool(policy(opts), size=size, **kwargs)
    return warm, lambda: Sandbox(pool=warm, secrets=secrets)


def pool_option(f: Any) -> Any:
    return click.option(
        "--pool",
        "pool_size",
        type=click.IntRange(min=1),
        default=None,
        metavar="N",
        help="Keep N sandboxes pre-started for the life of this process; each serves one run, then is removed.",
    )(f)


def dry_run_option(f: Any) -> Any:
    return click.option(
        "--dry-run",
        is_flag=True,
        help="Check the tool, its params and the policy, print the effective policy (after the flags) as JSON "
        "and exit 0; nothing starts.",
    )(f)


def dry_run(tool: str, opts: dict[str, Any], params: dict[str, Any] | None = None) -> None:
    """What a run would be made of, as one JSON document on stdout: the checked policy (after --policy,
    the policy flags and --timeout), its sha256, and the sandbox, image and tool asked for."""
    from toolcage.options import worker_image
    from toolcage.policies.typed import to_dict

    pol = policy(opts)
    out: dict[str, Any] = {"dry_run": True, "tool": tool}
    if params is not None:
        out["params"] = params
    out.update(
        sandbox=opts["sandbox"],
        image=worker_image(opts["image"]),
        policy_sha256=pol.sha256(),
        policy=to_dict(pol),
    )
    emit(out)


__all__ = [
    "dry_run",
    "dry_run_option",
    "keywords",
    "parse_params",
    "policy",
    "pool",
    "pool_option",
    "prepared_call",
    "sandbox",
    "sandbox_options",
]
