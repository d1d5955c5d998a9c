"""The one policy model shared by the runner, the worker and the egress proxy.

Imports neither `runner` nor `worker`: both depend on it, never the other way round.
"""

from toolcage.policies.errors import PolicyError
from toolcage.policies.loader import bundled_policy_names, load_policy, policy_from_json, validate_policy
from toolcage.policies.model import Limits, NetworkPolicy, Policy, Timeouts
from toolcage.policies.typed import parse_size

__all__ = [
    "Limits",
    "NetworkPolicy",
    "Policy",
    "PolicyError",
    "Timeouts",
    "bundled_policy_names",
    "load_policy",
    "parse_size",
    "policy_from_json",
    "validate_policy",
]
