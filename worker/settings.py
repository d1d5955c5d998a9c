"""What the worker knows about its run: the policy (canonical JSON from the runner) and its paths.

The policy is validated with the shared pydantic model on first use, not at start-up,
so a run's first response does not wait for pydantic to import.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolcage.policies import Policy


class Settings:
    def __init__(self, policy_json: str | None, workspace: str, scratch: str, run_id: str) -> None:
        self._policy_json = policy_json
        self._policy: Policy | None = None
        self.workspace = os.path.realpath(workspace)
        self.scratch = os.path.realpath(scratch)
        self.run_id = run_id

    @property
    def policy(self) -> Policy:
        if self._policy is None:
            from toolcage.policies import Policy, policy_from_json

            self._policy = policy_from_json(self._policy_json) if self._policy_json else Policy()
        return self._policy

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            policy_json=os.environ.get("TOOLCAGE_POLICY"),
            workspace=os.environ.get("TOOLCAGE_WORKSPACE", "/workspace"),
            scratch=os.environ.get("TOOLCAGE_SCRATCH", "/scratch"),
            run_id=os.environ.get("TOOLCAGE_RUN_ID", "local"),
        )
