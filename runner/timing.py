"""The one timing contract of a call, for every door (library, ``AsyncSandbox``, ``run``, ``serve``, MCP).

Two decisions, made here and applied by the sandbox for every call, whichever door it came through:
- a child's ``timeout_s`` is cut to the time LEFT in the run, so the worker ends the child (status
  ``timeout``, its partial output kept) before the run's deadline kills the whole sandbox and the
  output is lost. The cut value is sent explicitly in the call's params; only ever lowered;
- how long the runner waits for an answer: the call's time plus ``GRACE_S``, never past the deadline
  (plus ``DEADLINE_SLACK_S`` for a kill that is not seen).
"""

from __future__ import annotations

import json
from typing import Any

# GRACE_S: the worker ends what it runs at its time; the runner waits that much longer (one value, both sides)
from toolcage.policies.contract import CODE_INTERRUPT_S, CODE_START_S, GRACE_S

DEADLINE_SLACK_S = 1.0  # the watchdog kills at the deadline; a wait ends this much after it at the latest
MIN_CHILD_S = 0.05  # a child asked for in the run's last moments still gets a (tiny) positive timeout
# tools whose timeout_s bounds a child the worker kills, answering with what it printed so far
CHILD_TIMEOUT_TOOLS = frozenset(("run_python", "run_shell", "run_node", "exec", "code_run"))
# what a tool may take beyond its timeout_s, by the contract (a Python context's start and a cell's interrupt)
EXTRA_S = {"code_run": CODE_START_S + CODE_INTERRUPT_S}


def _asked(params: Any) -> float | None:
    asked = params.get("timeout_s") if isinstance(params, dict) else None
    return float(asked) if isinstance(asked, int | float) and not isinstance(asked, bool) and asked > 0 else None


def child_limit(left: float) -> float:
    """The longest a child may run with ``left`` seconds of the run to go: GRACE_S before the deadline
    for its answer to come back (a loaded host), but never less than half of what is left."""
    return max(left - GRACE_S, left / 2, MIN_CHILD_S)


def fit_params(tool: str, params: dict[str, Any] | None, call_s: float, left: float) -> dict[str, Any] | None:
    """``params`` with a child's ``timeout_s`` cut to the time left (a new dict only when it is cut)."""
    if tool not in CHILD_TIMEOUT_TOOLS:
        return params
    limit = child_limit(left)
    if (_asked(params) or call_s) <= limit:
        return params
    return {**(params or {}), "timeout_s": round(limit, 3)}


def fit_line(line: bytes, call_s: float, left: float) -> bytes:
    """A forwarded request line (``serve``) with the same cut, re-serialised only when something was cut."""
    if not any(t.encode() in line for t in CHILD_TIMEOUT_TOOLS):
        return line
    try:
        msg = json.loads(line)
    except ValueError:
        return line  # the worker answers it -32700
    changed = False
    for req in msg if isinstance(msg, list) else [msg]:
        if isinstance(req, dict) and isinstance(req.get("method"), str):
            params = req.get("params")
            if params is None or isinstance(params, dict):
                fitted = fit_params(req["method"], params, call_s, left)
                if fitted is not params:
                    req["params"], changed = fitted, True
    return (json.dumps(msg) + "\n").encode() if changed else line


def answer_due(
    now: float, params: dict[str, Any] | None, timeout: float | None, call_s: float, deadline: float, tool: str = ""
) -> float:
    """The monotonic time a call's answer is due by: ``timeout`` when the caller gives one, else the
    call's own time (its ``timeout_s``, else ``call_s``) plus GRACE_S; never past the deadline's slack."""
    wait = timeout if timeout is not None else (_asked(params) or call_s) + GRACE_S + EXTRA_S.get(tool, 0.0)
    return min(now + wait, deadline + DEADLINE_SLACK_S)


__all__ = ["CHILD_TIMEOUT_TOOLS", "GRACE_S", "answer_due", "child_limit", "fit_line", "fit_params"]
