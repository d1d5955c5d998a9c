"""The one timing contract (toolcage.timing): a child's timeout cut to the time left in the run, the runner's wait."""

from __future__ import annotations

import json

from toolcage import timing


def test_a_child_timeout_is_cut_to_the_time_left() -> None:
    """A code-running call ends GRACE_S before the deadline (at least half of what is left); only ever lowered."""
    assert timing.fit_params("run_python", {"code": "1"}, 30, 3.0) == {"code": "1", "timeout_s": 1.5}
    assert timing.fit_params("run_shell", {"command": "x", "timeout_s": 10}, 30, 12.0)["timeout_s"] == 10  # type: ignore[index]
    assert timing.fit_params("run_shell", {"command": "x", "timeout_s": 10}, 30, 10.0) == {
        "command": "x",
        "timeout_s": 8.0,
    }
    small = {"code": "1", "timeout_s": 1}
    assert timing.fit_params("run_python", small, 30, 3.0) is small
    assert timing.fit_params("read_file", {"path": "x"}, 30, 1.0) == {"path": "x"}  # no child, nothing to cut
    assert timing.fit_params("run_python", None, 30, 0.0) == {"timeout_s": timing.MIN_CHILD_S}


def test_a_forwarded_line_gets_the_same_cut() -> None:
    """serve's lines: a single request and a batch are cut alike; a line with nothing to cut is sent as it came."""
    line = (json.dumps({"jsonrpc": "2.0", "method": "run_shell", "params": {"command": "x"}, "id": 1}) + "\n").encode()
    assert json.loads(timing.fit_line(line, 30, 3.0))["params"] == {"command": "x", "timeout_s": 1.5}
    batch = json.dumps([{"jsonrpc": "2.0", "method": "run_python", "params": {"code": "1"}, "id": 2}]).encode()
    assert json.loads(timing.fit_line(batch, 30, 3.0))[0]["params"]["timeout_s"] == 1.5
    for same in (line, b"not json run_shell\n", b'{"method": "ping", "id": 3}\n'):
        assert timing.fit_line(same, 30, 60.0 if same is line else 3.0) is same


def test_the_runner_waits_the_call_plus_grace_never_past_the_deadline() -> None:
    """The answer is due at the call's time (timeout_s, else call_s) plus GRACE_S, capped at the deadline's slack."""
    assert timing.answer_due(100.0, {"timeout_s": 5}, None, 30, 1000.0) == 105.0 + timing.GRACE_S
    assert timing.answer_due(100.0, None, None, 30, 1000.0) == 130.0 + timing.GRACE_S
    assert timing.answer_due(100.0, None, 7.0, 30, 1000.0) == 107.0
    assert timing.answer_due(100.0, None, None, 30, 103.0) == 103.0 + timing.DEADLINE_SLACK_S
