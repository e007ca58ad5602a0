"""The engine's entry point: :func:`plan` turns a snapshot into decisions.

The result types live in :mod:`.results` and are re-exported here.
"""

from .planner import plan
from .results import PendingInfo, Placement, Plan, Preemption

__all__ = ["PendingInfo", "Placement", "Plan", "Preemption", "plan"]
