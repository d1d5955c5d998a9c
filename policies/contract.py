"""The runner<->worker contract, once: what the host and the sandbox must spell alike.

Every ``TOOLCAGE_*`` environment name, the in-sandbox paths, the sandbox's uid, the protocol's
method names, the in-container exit codes and the one grace between the worker's own deadline and
the runner's. Both sides import this module, so a name cannot drift between them (the JSON-RPC
error codes are the same kind of contract and live in ``codes``). A unit test fails when one of
these is spelled as a literal anywhere else. It lives in ``policies`` because that package is the
one both sides may import; it imports only ``json`` (loaded by the worker anyway), so the worker's
first answer does not pay for it.
"""

from __future__ import annotations

import json
from typing import Any

# -- environment names -------------------------------------------------------------------------
# Set by the runner on the sandbox (runner/engine/hostconfig.py, runner/backends/), read by the worker.
ENV_POLICY = "TOOLCAGE_POLICY"  # the policy as canonical JSON
ENV_RUN_ID = "TOOLCAGE_RUN_ID"
ENV_DEADLINE = "TOOLCAGE_DEADLINE"  # the run's wall-clock end, epoch seconds
ENV_IN_CONTAINER = "TOOLCAGE_IN_CONTAINER"  # "1" in a container; absent under --sandbox none
ENV_WATCH_RUNNER = "TOOLCAGE_WATCH_RUNNER"  # "1": exit when the runner's end of the stream closes
ENV_WORKSPACE = "TOOLCAGE_WORKSPACE"  # --sandbox none: the host directory standing in for /workspace
ENV_SCRATCH = "TOOLCAGE_SCRATCH"  # --sandbox none: the host directory standing in for /scratch
ENV_PROXY_SOCKET = "TOOLCAGE_PROXY_SOCKET"  # the egress proxy's unix socket
ENV_CA_PEM = "TOOLCAGE_CA_PEM"  # an extra CA (PEM text) SafeFetch trusts
ENV_CA_FILE = "TOOLCAGE_CA_FILE"  # the same, as a file
# "1": a pool's pre-started slot, which readies what its runs' secrets and connectors need while it waits;
# "bare": one whose runs take neither, with nothing to ready (the worker treats it as a cold start)
ENV_POOLED = "TOOLCAGE_POOLED"
POOLED_BARE = "bare"
ENV_TOOL_NAMESPACES = "TOOLCAGE_TOOL_NAMESPACES"  # gVisor: the tool's namespaces are made by the worker
ENV_TOOL_MODULES = "TOOLCAGE_TOOL_MODULES"  # extra tool modules to load
# a user's own image (not toolcage's): its config (Env, WorkingDir, User, Entrypoint, Cmd) as JSON, data for the
# tools (their children run with the image's ENV and WORKDIR); the worker itself runs from the rt mount
ENV_IMAGE_CONFIG = "TOOLCAGE_IMAGE_CONFIG"
ENV_WORKSPACE_COPY = "TOOLCAGE_WORKSPACE_COPY"  # "1": /workspace is the run's writable copy (workspace_mode copy)
# the copy from the engine's cache (workspace_cache): where the cached tree is mounted read-only for the worker to lay
# an overlay over /workspace at boot (toolcage.worker.copyfs); set only with ENV_WORKSPACE_COPY
ENV_COPY_LOWER = "TOOLCAGE_COPY_LOWER"
# ":"-joined paths of the image made writable for the run (a tmpfs each, filled by the runner: writable=)
ENV_WRITABLE = "TOOLCAGE_WRITABLE"
# Inside the sandbox, set by the worker for its own children.
ENV_PROXY = "TOOLCAGE_PROXY"  # host:port of the in-sandbox relay to the egress proxy
ENV_HANDLER_FD = "TOOLCAGE_HANDLER_FD"  # a connector handler's private protocol fd
ENV_ZYGOTE = "TOOLCAGE_ZYGOTE"
# The egress proxy container's own.
ENV_PROXY_LISTEN = "TOOLCAGE_PROXY_LISTEN"
# Host-side settings (read by the runner only; named here so the family has one list).
ENV_IMAGE = "TOOLCAGE_IMAGE"  # the worker image
ENV_SANDBOX = "TOOLCAGE_SANDBOX"  # the default --sandbox kind
ENV_EGRESS_PROXY = "TOOLCAGE_EGRESS_PROXY"  # the egress proxy image
ENV_AUDIT_LOG = "TOOLCAGE_AUDIT_LOG"
ENV_EGRESS_AUDIT_ONLY = "TOOLCAGE_EGRESS_AUDIT_ONLY"  # "allow": policies may ask for audit-only egress
ENV_HOST_PATHS = "TOOLCAGE_HOST_PATHS"  # a runner in a container: its paths as the engine sees them
ENV_BASE_IMAGE = "TOOLCAGE_BASE_IMAGE"  # image build: the base image
ENV_DEBIAN_MIRROR = "TOOLCAGE_DEBIAN_MIRROR"  # image build: the Debian mirror
ENV_SHARED_FILES = "TOOLCAGE_SHARED_FILES"  # "off": every container reads the image's files itself (engine.sharedfiles)
ENV_DAEMON = "TOOLCAGE_DAEMON"  # "off": `toolcage run` never asks the daemon; a path: the daemon's socket there
ENV_RAY_DIRECT = "TOOLCAGE_RAY_DIRECT"  # "off": a Cluster's calls all go through Ray (toolcage.ray.direct)

# -- in-sandbox paths --------------------------------------------------------------------------
WORKSPACE = "/workspace"  # the project directory: read-only, or the run's writable copy (workspace_mode copy)
SCRATCH = "/scratch"  # the writable directory, the children's working directory
COPY_LOWER = "/opt/toolcage/copy"  # a cached workspace copy's tree, read-only, covered by the worker at boot
PROXY_DIR = "/run/toolcage"  # the proxy socket's volume
PROXY_SOCKET = f"{PROXY_DIR}/proxy.sock"
PROXY_PORT = 3128  # the worker's relay inside the sandbox: 127.0.0.1:PROXY_PORT -> PROXY_SOCKET
DEPS_DIR = "/opt/toolcage/deps"  # packages `image build --pip/--requirements` added to the image
CONNECTORS_DIR = "/opt/toolcage/connectors"  # where connector sources are mounted
SANDBOX_UID = 65532  # the sandbox's user and group (nonroot)

# -- protocol methods --------------------------------------------------------------------------
PING = "ping"
TOOLS_LIST = "tools.list"
CONFIGURE = "sandbox.configure"
NETWORK = "sandbox.network"  # a live policy change: the worker's copy, for SafeFetch (the proxy enforces)
USAGE = "sandbox.usage"
PROGRESS = "notifications/progress"
CANCELLED = "notifications/cancelled"
CANCEL_METHODS = frozenset((CANCELLED, "$/cancelRequest"))  # MCP's and LSP's
PROTOCOL_METHODS = (TOOLS_LIST, PING, USAGE)  # answered by the worker itself, not a tool


_json_str = json.encoder.encode_basestring_ascii  # what json.dumps ends in for a str (ensure_ascii)


def id_key(req_id: Any) -> str:
    """A request id (or progress token) as one canonical string, the same on both sides: ``1`` and
    ``"1"`` stay apart, and a structured id (a hostile one) still makes one key.

    A str or int id (nearly every one; it is keyed several times per call on each side) takes the two
    functions ``json.dumps`` itself ends in for them, without building an encoder: the same text
    (tests/unit/test_id_key.py compares them over many ids). Anything else (bool, float, None, a str or int
    subclass, a structure) goes through ``json.dumps``."""
    t = type(req_id)
    if t is str:
        return _json_str(req_id)
    if t is int:
        return int.__repr__(req_id)
    return json.dumps(req_id, sort_keys=True, separators=(",", ":"))


def cancel_target(msg: Any) -> Any:
    """The id a cancel notification (MCP's or LSP's) names, or None if ``msg`` is not one."""
    if not isinstance(msg, dict) or "id" in msg:
        return None
    method = msg.get("method")
    if not isinstance(method, str) or method not in CANCEL_METHODS:  # a list or dict method is not hashable
        return None
    params = msg.get("params")
    if not isinstance(params, dict):
        return None
    req_id = params.get("requestId", params.get("id"))
    return req_id if type(req_id) in (str, int) else None


# -- in-container exit codes -------------------------------------------------------------------
EXIT_CONFIG = 64  # EX_USAGE: no usable configuration (mcp_host's config line)
EXIT_SOFTWARE = 70  # EX_SOFTWARE: the worker could not harden itself, or a zygote fork failed
EXIT_DEADLINE = 124  # the worker's (or mcp_host's) own kill at the run deadline + GRACE_S, like timeout(1)
EXIT_NOT_ISOLATED = 126  # nsinit could not make the call's namespaces: refuse to run it (nsinit.py spells it)
EXIT_NO_COPY = 75  # EX_TEMPFAIL: the worker could not lay a cached copy (worker.copyfs): the runner fills one
EXIT_NOT_STARTED = 127  # the command could not be started (a shell's "command not found")

# -- timing ------------------------------------------------------------------------------------
GRACE_S = 2.0  # the worker kills at its deadline + GRACE_S; the runner waits a call's time + GRACE_S
# code_run (a Python context, worker.tools.interpreter) may take longer than its timeout_s by these two: a
# context that must (re)start first gets up to CODE_START_S for it, and a cell SIGINT stopped up to
# CODE_INTERRUPT_S to end before it is killed; the runner waits for them too (toolcage.timing)
CODE_START_S = 30.0
CODE_INTERRUPT_S = 2.0

__all__ = [
    "CANCELLED",
    "CANCEL_METHODS",
    "CODE_INTERRUPT_S",
    "CODE_START_S",
    "CONFIGURE",
    "CONNECTORS_DIR",
    "COPY_LOWER",
    "DEPS_DIR",
    "ENV_AUDIT_LOG",
    "ENV_BASE_IMAGE",
    "ENV_CA_FILE",
    "ENV_CA_PEM",
    "ENV_COPY_LOWER",
    "ENV_DAEMON",
    "ENV_DEADLINE",
    "ENV_DEBIAN_MIRROR",
    "ENV_EGRESS_AUDIT_ONLY",
    "ENV_EGRESS_PROXY",
    "ENV_HANDLER_FD",
    "ENV_HOST_PATHS",
    "ENV_IMAGE",
    "ENV_IMAGE_CONFIG",
    "ENV_IN_CONTAINER",
    "ENV_POLICY",
    "ENV_POOLED",
    "ENV_PROXY",
    "ENV_PROXY_LISTEN",
    "ENV_PROXY_SOCKET",
    "ENV_RAY_DIRECT",
    "ENV_RUN_ID",
    "ENV_SANDBOX",
    "ENV_SCRATCH",
    "ENV_SHARED_FILES",
    "ENV_TOOL_MODULES",
    "ENV_TOOL_NAMESPACES",
    "ENV_WATCH_RUNNER",
    "ENV_WORKSPACE",
    "ENV_WORKSPACE_COPY",
    "ENV_WRITABLE",
    "ENV_ZYGOTE",
    "EXIT_CONFIG",
    "EXIT_DEADLINE",
    "EXIT_NOT_ISOLATED",
    "EXIT_NOT_STARTED",
    "EXIT_NO_COPY",
    "EXIT_SOFTWARE",
    "GRACE_S",
    "NETWORK",
    "PING",
    "PROGRESS",
    "PROTOCOL_METHODS",
    "PROXY_DIR",
    "PROXY_PORT",
    "PROXY_SOCKET",
    "SANDBOX_UID",
    "SCRATCH",
    "TOOLS_LIST",
    "USAGE",
    "WORKSPACE",
    "cancel_target",
    "id_key",
]
