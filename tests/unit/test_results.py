"""Status classification: one field says how a call ended."""

from __future__ import annotations

import pytest

from toolcage.results import STATUSES, classify_error, classify_result


@pytest.mark.parametrize(
    ("result", "status"),
    [
        ({"exit_code": 0, "timed_out": False, "truncated": False}, "ok"),
        ({"exit_code": 1, "timed_out": False, "truncated": False}, "error"),
        ({"exit_code": -9, "timed_out": True}, "timeout"),
        ({"exit_code": -9, "oom_killed": True}, "oom_killed"),
        ({"exit_code": -15, "signal": "SIGTERM"}, "signal"),
        ({"exit_code": 0, "truncated": True}, "output_capped"),
        ({"entries": [], "truncated": True}, "ok"),
        ("pong", "ok"),
    ],
)
def test_classify_result(result: object, status: str) -> None:
    """Child outcomes map to the status taxonomy; non-process results are ok."""
    assert classify_result(result) == status
    assert status in STATUSES


def test_classify_error() -> None:
    """A worker-side call timeout is 'timeout'; other errors are 'error'."""
    assert classify_error(-32003) == "timeout"
    assert classify_error(-32001) == "error"
    assert classify_error(-32603) == "error"
