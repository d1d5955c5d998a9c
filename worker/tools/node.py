"""run_node: JavaScript in a child process, run the same way as run_python (``worker.tools.proc``).

``node -e code`` in /scratch, or a file staged in scratch for code past the argv limit, through
``run_child``: the same process group, timeout, output cap, cancel, memory guard and (under gVisor)
namespaces of its own. Node needs a little more in a hardened container:

- V8's heap is sized from the policy's memory (``--max-old-space-size``), below the cgroup's limit,
  so a JavaScript memory bomb usually ends in V8's own "heap out of memory" (a clean exit, the message
  on stderr) before the kernel's OOM killer (``oom_killed``) is needed;
- its thread pools are kept small (``--v8-pool-size``, ``UV_THREADPOOL_SIZE``): threads count against
  the small pids limit, and what is left of it is for the code's own child processes;
- nothing is written outside /scratch (HOME and TMPDIR are there; no REPL history, no update check).
"""

from __future__ import annotations

import os
import shutil
from typing import Annotated, Any

from annotated_types import Gt

from toolcage.worker.errors import ToolError
from toolcage.worker.settings import Settings
from toolcage.worker.tools import Tool
from toolcage.worker.tools._params import doc, params
from toolcage.worker.tools.proc import _program, image_program, run_child

MiB = 1024 * 1024
_PATH = "/usr/local/bin:/usr/bin:/bin"  # the child's PATH (worker.tools.proc._child_env)
_HEAP_SHARE = 0.75  # of the policy's memory: the worker and node's own native memory need the rest
_MIN_HEAP_MIB = 16
_V8_POOL = 2  # V8's background threads (default: one per CPU, up to 4)
_UV_POOL = 2  # libuv's threads, for fs and dns calls (default 4)


@params
class RunNodeParams:
    code: str = doc("JavaScript (CommonJS), run as `node -e code` in /scratch")
    timeout_s: Annotated[float, Gt(0)] | None = doc("seconds; default the policy's call timeout", None)
    stdin: str | None = doc("text fed to the child's stdin (process.stdin)", None)


def heap_mib(memory: int) -> int:
    """V8's old-space limit for a policy's memory limit (bytes): a share of it, in MiB."""
    return max(_MIN_HEAP_MIB, int(memory * _HEAP_SHARE) // MiB)


def node_binary() -> str:
    """Where node is, or a ToolError saying the image has none."""
    found = shutil.which("node", path=_PATH) or shutil.which("nodejs", path=_PATH)
    if found is None:
        raise ToolError(
            "node is not installed in this image: `toolcage image build` adds Debian's nodejs package when it runs "
            "on a Debian bookworm host with apt (it said so when it left it out)"
        )
    return found


def node_argv(settings: Settings, code: str) -> list[str]:
    """``node [flags] -e code``, or ``node [flags] FILE`` for code staged in scratch (in a user's own
    image: its node, found on its PATH)."""
    node = image_program(settings, ("node", "nodejs"), "Node.js") if settings.image is not None else node_binary()
    interpreter = [
        node,
        f"--max-old-space-size={heap_mib(settings.policy.limits.memory)}",
        f"--v8-pool-size={_V8_POOL}",
    ]
    argv = _program(settings, interpreter, code, ".js")
    if argv[len(interpreter) : len(interpreter) + 1] == ["-c"]:
        argv[len(interpreter)] = "-e"  # _program writes python's and sh's flag; node's is -e (-c is --check)
    return argv


def _node_env() -> dict[str, str]:
    env = {"UV_THREADPOOL_SIZE": str(_UV_POOL), "NODE_REPL_HISTORY": "", "NO_UPDATE_NOTIFIER": "1"}
    if os.path.isdir("/usr/share/nodejs"):  # Debian's node modules (acorn, undici ...), as node itself finds them
        env["NODE_PATH"] = "/usr/share/nodejs"
    return env


def run_node(settings: Settings, p: RunNodeParams) -> dict[str, Any]:
    if settings.image is not None:
        env = {"UV_THREADPOOL_SIZE": str(_UV_POOL), "NO_UPDATE_NOTIFIER": "1"}
        cwd = settings.image.default_dir(settings.scratch)
        return run_child(node_argv(settings, p.code), settings, p.timeout_s, p.stdin, extra_env=env, cwd=cwd)
    return run_child(node_argv(settings, p.code), settings, p.timeout_s, p.stdin, extra_env=_node_env())


TOOLS = [
    Tool(
        "run_node",
        "Run JavaScript (Node.js, CommonJS) as `node -e code` in a child process; returns what run_python "
        "returns: stdout, stderr (plus stdout_b64/stderr_b64 when they are not UTF-8), exit_code, signal, "
        "timed_out, truncated, oom_killed. V8's heap is three quarters of the sandbox's memory. The working "
        "directory is /scratch (writable); the workspace, if any, is /workspace (read-only). Where they are "
        "elsewhere (--sandbox none), process.env.TOOLCAGE_SCRATCH and process.env.TOOLCAGE_WORKSPACE name them. "
        "In a user's own image: the image's node, in its WORKDIR (an error says when it has no Node.js).",
        RunNodeParams,
        run_node,
        in_process_timeout=False,
        runs_code=True,
    ),
]
