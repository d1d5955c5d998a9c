"""``toolcage doctor --image REF``: what an image offers and whether it will run, before a real run starts.

Why (issue 36): any image the engine has runs unchanged, so the first question of a new user is "will mine?".
The answer comes from two places, both as data (the CLI prints it, ``toolcage.cli.doctor``):
- the engine's inspect data, read before anything starts (:func:`facts`): platform, size, layers, USER,
  WORKDIR, ENTRYPOINT, PATH, HOME. A platform other than linux/amd64 is refused here, with the reason (the
  worker's runtime is x86_64 Linux); a missing image is refused in one line (nothing is ever pulled);
- one short run of the image under the same hardening as every run (:func:`probe`): a plain
  ``Sandbox(image=REF)`` whose worker is the runtime mounted into it, asked through the tools a user calls
  (``run_shell``, ``run_python``, ``run_node``, ``exec``), so what it reports is what a run will see: the
  worker's first answer and its time, /bin/sh, Python (path, version, 3.8 or newer), Node, git, pip.

Threat: a hostile image answering the probe. It runs caged like any run and can only lie about itself: every
value it prints is data here (bounded, escaped when printed), never executed or trusted by the runner.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from toolcage.errors import NotFound, ToolcageError
from toolcage.policies import contract

PLATFORM = "linux/amd64"  # the worker's runtime (/opt/toolcage/rt) is x86_64 Linux
MIN_PYTHON = (3, 8)  # run_python in a user's image needs this (issue 36)
_VALUE_MAX = 300  # any string an image's probe answers is cut to this (a report, not a channel)
WRITABLE_ASKED = ("/tmp", contract.SCRATCH, contract.WORKSPACE, "/var/tmp", "/usr/local", "/testbed")
PROGRAMS = ("python3", "python", "node", "nodejs", "git", "pip3", "pip")
# one shell call: where each program is on the image's PATH (busybox's ash and dash both have command -v)
SHELL_LOOKUP = (
    "for n in " + " ".join(PROGRAMS) + '; do p=$(command -v "$n") && printf "%s=%s\\n" "$n" "$p"; done; '
    # where a run's programs may write (its default directory, HOME, the usual ones), as the sandbox user
    # (a file made and removed, not test -w: busybox's test reads the mode bits, not a read-only mount)
    'for d in "$PWD" "$HOME" ' + " ".join(WRITABLE_ASKED) + '; do f="$d/.toolcage-doctor.$$"; '
    '[ -d "$d" ] && (: > "$f") 2>/dev/null && rm -f "$f" && printf "writable=%s\\n" "$d"; done; :'
)
# Python 2.7 too: the report says which version, the note says it is too old
PYTHON_PROBE = 'import json, sys; print(json.dumps({"path": sys.executable, "version": list(sys.version_info[:3])}))'
NODE_PROBE = "console.log(JSON.stringify({path: process.execPath, version: process.versions.node}))"


def _cut(value: Any) -> str:
    return str(value)[:_VALUE_MAX]


def facts(ref: str, info: dict[str, Any] | None) -> dict[str, Any]:
    """What the engine's inspect data says of the image (no sandbox). NotFound when it cannot run."""
    from toolcage.image.build import check_worker_image

    if info is None:
        raise NotFound(
            f"image {ref} is not on this engine, and doctor pulls nothing: `docker pull {ref}` or build it first"
        )
    cfg = info.get("Config") or {}
    env: dict[str, str] = {}
    for item in cfg.get("Env") or []:
        key, sep, value = str(item).partition("=")
        if sep:
            env[key] = value
    platform = f"{info.get('Os') or '?'}/{info.get('Architecture') or '?'}"
    if info.get("Variant"):
        platform += f"/{info['Variant']}"
    out = {
        "ref": ref,
        "id": str(info.get("Id") or ""),
        "kind": check_worker_image(info),  # "worker" (built from the worker image) or "foreign"
        "platform": platform,
        "size_bytes": int(info.get("Size") or 0),
        "layers": len((info.get("RootFS") or {}).get("Layers") or []),
        "user": str(cfg.get("User") or ""),
        "workdir": str(cfg.get("WorkingDir") or ""),
        "entrypoint": [str(a) for a in cfg.get("Entrypoint") or []],
        "cmd": [str(a) for a in cfg.get("Cmd") or []],
        "path": env.get("PATH"),
        "home": env.get("HOME"),
    }
    problem = platform_problem(info)
    if problem:
        raise NotFound(f"image {ref} {problem}")
    return out


def platform_problem(info: dict[str, Any]) -> str | None:
    """Why an image's platform cannot run here (None: linux/amd64)."""
    os_, arch = str(info.get("Os") or ""), str(info.get("Architecture") or "")
    if (os_, arch) == ("linux", "amd64"):
        return None
    return (
        f"is {os_ or '?'}/{arch or '?'}: toolcage runs {PLATFORM} images only "
        "(the worker's runtime mounted into the image is x86_64 Linux)"
    )


def probe(ref: str, sandbox: str | None = None) -> dict[str, Any]:
    """One short hardened run of the image (a plain ``Sandbox``), asked what a run will find in it."""
    from toolcage.sandbox import Sandbox

    out: dict[str, Any] = {"answered": False}
    t0 = time.perf_counter()
    try:
        with Sandbox(image=ref, tool="doctor-image", sandbox=sandbox) as sb:
            answer = sb.call("ping")
            out["first_answer_ms"] = round((time.perf_counter() - t0) * 1000, 1)
            out["answered"] = answer.result == "pong"
            out["sandbox"] = sb.kind
            if not out["answered"]:
                out["error"] = _cut(answer.error or answer.result)
                return out
            out.update(_tools(sb))
    except ToolcageError as exc:
        out["error"] = _cut(exc.message)
    return out


def _tools(sb: Any) -> dict[str, Any]:
    """The image's programs as the tools see them (its PATH, ENV, WORKDIR; the sandbox user)."""
    shell = _call(sb, "run_shell", {"command": SHELL_LOOKUP})
    where = parse_lookup(shell["stdout"]) if shell["ok"] else {}
    got: dict[str, Any] = {"shell": {"present": shell["ok"], "path": "/bin/sh" if shell["ok"] else None}}
    got["writable"] = parse_writable(shell["stdout"]) if shell["ok"] else None  # None: not known (no shell)
    if not shell["ok"]:
        got["shell"]["error"] = shell["error"]
    py = _call(sb, "run_python", {"code": PYTHON_PROBE})
    got["python"] = parse_python(py)
    node = _call(sb, "run_node", {"code": NODE_PROBE})
    got["node"] = parse_json_program(node)
    git = _call(sb, "exec", {"argv": ["git", "--version"]})
    got["git"] = parse_version_program(git, where.get("git"))
    # pip as a user types it (pip3, pip), else as the image's Python runs it
    tries: list[tuple[list[str], str | None]] = [(["pip3", "--version"], where.get("pip3"))]
    tries.append((["pip", "--version"], where.get("pip")))
    if got["python"].get("path"):
        tries.append(([got["python"]["path"], "-m", "pip", "--version"], None))
    pip: dict[str, Any] = {"present": False}
    for argv, path in tries:
        pip = parse_version_program(_call(sb, "exec", {"argv": argv}), path)
        if pip["present"] and pip.get("version"):
            pip["via"] = " ".join(argv[:-1])
            break
    else:
        pip = {"present": False, "path": None, "error": "none of pip3, pip, python -m pip answered with a version"}
    got["pip"] = pip
    return got


def _call(sb: Any, tool: str, params: dict[str, Any]) -> dict[str, Any]:
    """A tool call's outcome as plain values: ok (the call ran and exited 0), stdout, error."""
    r = sb.call(tool, params)
    if r.status != "ok" or not isinstance(r.result, dict):
        err = r.error or {}
        message = err.get("message") if isinstance(err, dict) else err
        return {"ok": False, "ran": False, "stdout": "", "error": _cut(message)}
    code = r.result.get("exit_code")
    stdout, stderr = str(r.result.get("stdout") or ""), str(r.result.get("stderr") or "")
    error = None if code == 0 else _cut((stderr.strip().splitlines() or [f"exit code {code}"])[-1])
    return {"ok": code == 0, "ran": True, "stdout": stdout, "error": error}


def parse_lookup(stdout: str) -> dict[str, str]:
    """``name=/path`` lines from :data:`SHELL_LOOKUP` (only the names asked, only absolute paths)."""
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        name, sep, path = line.partition("=")
        if sep and name in PROGRAMS and path.startswith("/") and name not in out:
            out[name] = _cut(path)
    return out


def parse_writable(stdout: str) -> list[str]:
    """``writable=/dir`` lines from :data:`SHELL_LOOKUP`: absolute directories, each once, in order."""
    out: list[str] = []
    for line in stdout.splitlines():
        key, sep, path = line.partition("=")
        if sep and key == "writable" and path.startswith("/") and _cut(path) not in out and len(out) < 16:
            out.append(_cut(path))
    return out


def parse_python(outcome: dict[str, Any]) -> dict[str, Any]:
    """run_python's answer to :data:`PYTHON_PROBE`: path, version, and whether it is new enough."""
    got = parse_json_program(outcome)
    version = got.get("version")
    if isinstance(version, list) and len(version) >= 2 and all(isinstance(v, int) for v in version):
        got["version"] = ".".join(str(v) for v in version)
        got["supported"] = tuple(version[:2]) >= MIN_PYTHON
    elif got["present"]:
        got["version"], got["supported"] = None, False
    return got


def parse_json_program(outcome: dict[str, Any]) -> dict[str, Any]:
    """An interpreter's answer (one JSON line with path and version), or why there is none."""
    if not outcome["ok"]:
        return {"present": outcome["ran"], "error": outcome["error"]}
    try:
        data = json.loads(outcome["stdout"].strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"present": True, "error": "its answer was not the probe's JSON"}
    if not isinstance(data, dict):
        return {"present": True, "error": "its answer was not the probe's JSON"}
    version = data.get("version")
    version = version if isinstance(version, list) else _cut(version)
    return {"present": True, "path": _cut(data.get("path")), "version": version}


_VERSION = re.compile(r"\d+(?:\.\d+)+")


def parse_version_program(outcome: dict[str, Any], path: str | None) -> dict[str, Any]:
    """``git --version`` / ``pip --version``: present, the version number, where (from the shell's lookup)."""
    if not outcome["ok"]:
        return {"present": outcome["ran"], "path": path, "error": outcome["error"]}
    found = _VERSION.search(outcome["stdout"])
    return {"present": True, "path": path, "version": found.group(0) if found else None}


def check(ref: str, sandbox: str | None = None) -> dict[str, Any]:
    """The whole report: :func:`facts`, then :func:`probe`; ``runnable`` and, when not, ``reason`` (one line).
    NotFound (the CLI's one line, exit 1) for a missing image or another platform: nothing is started."""
    from toolcage.engine import runtime
    from toolcage.engine.docker_adapter import Engine
    from toolcage.image.build import check_worker_image, runs_own_worker
    from toolcage.options import DEFAULT_IMAGE, worker_image

    engine = Engine.default()
    info = engine.image(ref)
    report = facts(ref, info)
    notes: list[str] = []
    # the worker image whose runtime a foreign run mounts, chosen as the container backend does
    worker_ref = worker_image()
    worker = engine.image(worker_ref)
    if check_worker_image(worker) == "foreign":
        worker_ref = DEFAULT_IMAGE
        worker = engine.image(worker_ref)
    if report["kind"] == "worker" and not runs_own_worker(info, worker):
        report["kind"] = "foreign"  # a label anyone can write: only images built here run their own worker
        notes.append("it carries the worker label but was not built by this installation: its own worker never runs")
    if report["kind"] == "foreign":
        if worker is None:
            raise NotFound(
                f"image {ref} runs with the worker image's runtime, and {worker_ref} is missing: "
                "run `toolcage image build`"
            )
        refused = config_problem(ref, info)
        if refused:  # a config no run takes (engine.imageconfig): said without starting anything
            probed = {"answered": False, "started": False, "error": refused}
            report.update(probe=probed, runnable=False, reason=refused, notes=notes)
            return report
        if not any(v.get("Name") == runtime.marker_name(str(worker["Id"])) for v in engine.volumes(runtime.LABEL)):
            notes.append("the worker's runtime volumes were filled by this check (once per worker image)")
    report["probe"] = p = probe(ref, sandbox)
    report["runnable"] = bool(p.get("answered"))
    report["reason"] = None if report["runnable"] else f"the worker did not answer in it: {p.get('error') or '?'}"
    notes.extend(tool_notes(p))
    report["notes"] = notes
    return report


def config_problem(ref: str, info: dict[str, Any] | None) -> str | None:
    """Why a run refuses this image's config before it starts (too many variables, a loader variable that acts
    whatever its value), as the run's own check says it; None when a run takes it."""
    from toolcage.engine import imageconfig

    try:
        imageconfig.from_inspect(ref, info or {})
    except imageconfig.BadImageConfig as exc:
        return str(exc)
    return None


def tool_notes(p: dict[str, Any]) -> list[str]:
    """What a run of this image will not do, each a line (the image still runs: exec works)."""
    notes: list[str] = []
    if not p.get("answered"):
        return notes
    if not (p.get("shell") or {}).get("present"):
        notes.append("no /bin/sh: run_shell and exec's command= answer an error; exec argv=[...] runs its programs")
    py = p.get("python") or {}
    if not py.get("present"):
        notes.append("no Python on its PATH: run_python answers an error naming it")
    elif py.get("error") or not py.get("supported"):
        want = ".".join(map(str, MIN_PYTHON))
        seen = py.get("version") or py.get("error") or "?"
        notes.append(f"its Python ({seen}) is not one run_python uses ({want} or newer)")
    if not (p.get("node") or {}).get("present"):
        notes.append("no Node.js on its PATH: run_node answers an error naming it")
    return notes


__all__ = ["MIN_PYTHON", "PLATFORM", "check", "facts", "platform_problem", "probe", "tool_notes"]
