"""Drill policies: one YAML file per training run, validated with precise errors.

See :mod:`drill.policy.model` for the fields and :func:`drill.policy.load.load_policy`.
"""

from drill.policy.load import PolicyError, load_policy
from drill.policy.model import Policy

__all__ = ["Policy", "PolicyError", "load_policy"]
