"""One exception root and one status -> exit code table."""

from __future__ import annotations

import json

import pytest

import toolcage
from toolcage.cli.output import error_payload
from toolcage.errors import ToolcageError
from toolcage.policies import PolicyError, load_policy
from toolcage.results import STATUSES, CallResult, RunSummary, Status


def test_a_policy_that_cannot_load_is_a_toolcage_error() -> None:
    """Sandbox("typo.yaml") is caught by `except toolcage.ToolcageError` (it escaped before); still a ValueError."""
    with pytest.raises(toolcage.ToolcageError) as caught:
        toolcage.Sandbox("typo.yaml", sandbox="none")
    assert isinstance(caught.value, PolicyError) and isinstance(caught.value, ValueError)
    assert toolcage.PolicyError is PolicyError and toolcage.ToolcageError is ToolcageError


def test_policy_error_is_reported_by_the_one_root() -> None:
    """The CLI reports a policy error through ToolcageError's own fields: exit 2, reason "policy"."""
    with pytest.raises(PolicyError) as caught:
        load_policy("no-such-policy-name")
    payload, code = error_payload(caught.value)
    assert code == 2
    assert payload["status"] == "error" and payload["reason"] == "policy"
    assert payload["message"] == str(caught.value)


# the table cli.py carried before Status had it (EXIT_BY_STATUS, default 3)
OLD_EXIT = {
    "ok": 0, "error": 1, "output_capped": 1, "signal": 1,
    "timeout": 3, "oom_killed": 3, "crashed": 3, "image_missing": 3, "interrupted": 130,
}  # fmt: skip


@pytest.mark.parametrize("status", list(Status))
def test_every_status_carries_its_exit_code(status: Status) -> None:
    """Each Status has an exit code, the one the CLI's old table gave it (3 where it had none)."""
    assert status.exit_code == OLD_EXIT.get(status.value, 3)
    assert status.value in STATUSES


def test_status_stays_a_plain_string_on_the_wire() -> None:
    """A result's status is a Status, equal to its name, and JSON output is unchanged."""
    res = CallResult("timeout", "run_shell", "r1", result={"stdout": "partial\n"})
    assert res.status is Status.TIMEOUT and res.status == "timeout" and res.exit_code == 3
    assert json.dumps(res.to_dict()) == json.dumps(
        {"status": "timeout", "tool": "run_shell", "run_id": "r1", "result": {"stdout": "partial\n"}, "error": None,
         "wall_ms": 0.0}
    )  # fmt: skip
    summary = RunSummary("r1", "n", "ok", 1.0, None, None, 1)
    assert summary.status is Status.OK and '"status": "ok"' in json.dumps(summary.to_dict())


def test_an_unknown_status_is_refused() -> None:
    """A status outside the enum is a bug, found where the result is made."""
    with pytest.raises(ValueError):
        CallResult("finished", "t", "r1")
