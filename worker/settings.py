"""What the worker knows about its run: the policy (canonical JSON from the runner) and its paths."""

from __future__ import annotations

import os
from dataclasses import dataclass

from policies import Policy, policy_from_json


@dataclass(frozen=True)
class Settings:
    policy: Policy
    workspace: str
    scratch: str
    run_id: str

    @classmethod
    def from_env(cls) -> Settings:
        raw = os.environ.get("TOOLCAGE_POLICY")
        policy = policy_from_json(raw) if raw else Policy()
        return cls(
            policy=policy,
            workspace=os.path.realpath(os.environ.get("TOOLCAGE_WORKSPACE", "/workspace")),
            scratch=os.path.realpath(os.environ.get("TOOLCAGE_SCRATCH", "/scratch")),
            run_id=os.environ.get("TOOLCAGE_RUN_ID", "local"),
        )
