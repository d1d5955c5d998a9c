"""Small builders shared by unit tests."""

from __future__ import annotations

from typing import Any

from toolcage.config import RunSpec


def run_spec(**overrides: Any) -> RunSpec:
    """A RunSpec with harmless values, for tests of container_config and what reads its output."""
    base: dict[str, Any] = dict(
        run_id="abcd1234",
        tool="run_python",
        image="toolcage-worker:test",
        policy_name="default",
        started_at="2026-01-01T00:00:00Z",
        deadline=1e9,
        owner="host:1",
        owner_started="42",
    )
    base.update(overrides)
    return RunSpec(**base)
